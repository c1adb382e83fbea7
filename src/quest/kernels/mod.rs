//! Quest's two kernel families, each dispatched once (`simd::dispatch!`):
//!
//! - `quest.fold`: a key row folded into a page's running bounds
//!   (`kmin = min(kmin, v)`, `kmax = max(kmax, v)`, `v = k · scale + 0`);
//! - `quest.scores`: one KV head's page bounds against a tile of queries,
//!   `Σ_i fma(q_i, q_i ≥ 0 ? kmax_i : kmin_i)` per (query, page).
//!
//! Both are bit-identical on every level: the fold is comparisons and one
//! rounding (`k · scale`), the scores' summation order is the 8-lane one
//! of the module docs. `portable.rs` is the definition, `avx2.rs` the
//! same arithmetic eight lanes at a time. No AVX-512 kernel: the AVX-512
//! level runs the AVX2 one (this machine has no AVX-512 to test one on;
//! see the module docs).

mod portable;

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(test)]
mod tests;

use crate::simd::{dispatch, Isa};

/// Folds one row of keys into running bounds: for every `i`, with `v =
/// keys[i] · scale + 0.0` (`keys[i] + 0.0` without a scale), `kmin[i] = v`
/// and `kmax[i] = v` when `first`, else `kmin[i] = v` if `kmin[i]` is NaN
/// or `v < kmin[i]` (and `kmax` alike with `>`).
///
/// # Panics
/// If the three slices differ in length (callers slice them alike).
pub(super) fn fold(
    isa: Isa,
    keys: &[f32],
    scale: Option<f32>,
    first: bool,
    kmin: &mut [f32],
    kmax: &mut [f32],
) {
    assert!(keys.len() == kmin.len() && keys.len() == kmax.len());
    // SAFETY (bounds): the three slices have one length (asserted above);
    // the kernels read and write within it.
    dispatch!("quest.fold", isa, {
        avx512 => avx2,
        avx2(t) => avx2::fold(t, keys, scale, first, kmin, kmax),
        scalar => portable::fold(keys, scale, first, kmin, kmax),
    })
}

/// One KV head's scores: `out[g * n_pages + p] = Σ_i fma(q_g[i], q_g[i] >= 0 ?
/// kmax[p][i] : kmin[p][i])` in the 8-lane order, for the `G = q.len() / d`
/// queries `q` (`[G, d]`) and the pages whose bounds are `kmin`, `kmax`
/// (`[n_pages, d]`, consecutive rows `stride` floats apart).
///
/// # Panics
/// If the shapes disagree (callers size them from one shape).
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    isa: Isa,
    q: &[f32],
    d: usize,
    kmin: &[f32],
    kmax: &[f32],
    stride: usize,
    n_pages: usize,
    out: &mut [f32],
) {
    assert!(d > 0 && q.len().is_multiple_of(d) && stride >= d);
    let g = q.len() / d;
    assert!(out.len() == g * n_pages);
    if n_pages == 0 {
        return;
    }
    let need = (n_pages - 1) * stride + d;
    assert!(kmin.len() >= need && kmax.len() >= need);
    // SAFETY (bounds): page p's bounds are `kmin[p * stride .. p * stride +
    // d]` (and `kmax`'s), within the slices for every p < n_pages (asserted
    // above); `q` holds G rows of d and `out` G × n_pages slots.
    dispatch!("quest.scores", isa, {
        avx512 => avx2,
        avx2(t) => avx2::scores(t, q, d, kmin, kmax, stride, n_pages, out),
        scalar => portable::scores(q, d, kmin, kmax, stride, n_pages, out),
    })
}

/// Runs both families once at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn probe(isa: Isa) {
    let keys = [1.0f32, -2.0, 3.0];
    let (mut lo, mut hi) = ([0.0f32; 3], [0.0f32; 3]);
    fold(isa, &keys, None, true, &mut lo, &mut hi);
    let mut out = [0.0f32; 1];
    scores(isa, &keys, 3, &lo, &hi, 3, 1, &mut out);
    assert_eq!(out[0], 14.0);
}
