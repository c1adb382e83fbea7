//! Quest's two kernel families, each dispatched once (`simd::dispatch!`):
//!
//! - `quest.fold`: a key row folded into a page's running bounds
//!   (`kmin = min(kmin, v)`, `kmax = max(kmax, v)`, `v = k · scale + 0`),
//!   the decode step's update;
//! - `quest.page_bounds`: a whole page's bounds from its token rows at
//!   once (each bound kept in a register while the page's keys stream
//!   past, the next page's asked ahead on x86-64), the build;
//! - `quest.scores`: pages' bounds against every query head, page by page
//!   (each page's bounds read once, contiguously, for all KV heads),
//!   `Σ_i fma(q_i, q_i ≥ 0 ? kmax_i : kmin_i)` per (query head, page).
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

use crate::keys::Encoded;
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

/// A whole page's bounds: element `i` of `lo` / `hi` is the least /
/// greatest `v_t = rows[t * n + i] · scales[t] + 0.0` (the key decoded
/// exactly from its format, read in place) over the page's
/// `rows.len() / n` token rows whose `v_t` is not NaN (NaN when none is):
/// bit for bit what folding the rows in order with [`fold`] gives (bounds
/// never hold `-0.0`, so the order of equal values does not show). `next`:
/// the bytes the caller reads next (the next page's rows, laid out as
/// `rows`), asked into cache meanwhile (a hint; empty: none).
///
/// # Panics
/// If the shapes disagree (callers size them from one shape).
pub(super) fn page_bounds(
    isa: Isa,
    rows: Encoded<'_>,
    scales: Option<&[f32]>,
    lo: &mut [f32],
    hi: &mut [f32],
    next: &[u8],
) {
    let n = lo.len();
    assert!(n > 0 && hi.len() == n && rows.len().is_multiple_of(n) && !rows.is_empty());
    assert!(scales.is_none_or(|s| s.len() == rows.len() / n));
    // SAFETY (bounds): `rows` holds `rows.len() / n` whole rows of `n` and
    // the scales one per row (asserted above); the kernels read and write
    // within them.
    dispatch!("quest.page_bounds", isa, {
        avx512 => avx2,
        avx2(t) => avx2::page_bounds(t, rows, scales, lo, hi, next),
        scalar => {
            let _ = next;
            portable::page_bounds(rows, scales, lo, hi)
        }
    })
}

/// Pages' scores against every query head: `out[j * n_pages + p] = Σ_i
/// fma(q_j[i], q_j[i] >= 0 ? kmax[p, h][i] : kmin[p, h][i])` in the 8-lane
/// order, for the `h · g` query heads `q` (`[h · g, d]`; head `j` reads KV
/// head `j / g`) and pages `0..n_pages` whose bounds are rows of `kmin` /
/// `kmax` (`[n_pages, h, d]`, consecutive pages `stride >= h · d` floats apart).
///
/// # Panics
/// If the shapes disagree (callers size them from one shape).
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    isa: Isa,
    q: &[f32],
    (h, g, d): (usize, usize, usize),
    kmin: &[f32],
    kmax: &[f32],
    stride: usize,
    n_pages: usize,
    out: &mut [f32],
) {
    assert!(d > 0 && h > 0 && g > 0 && q.len() == h * g * d && stride >= h * d);
    assert!(out.len() == h * g * n_pages);
    if n_pages == 0 {
        return;
    }
    let need = (n_pages - 1) * stride + h * d;
    assert!(kmin.len() >= need && kmax.len() >= need);
    // SAFETY (bounds): page p's bounds are `kmin[p * stride .. p * stride +
    // h * d]` (and `kmax`'s), within the slices for every p < n_pages
    // (asserted above); `q` holds h · g rows of d and `out` h · g × n_pages.
    dispatch!("quest.scores", isa, {
        avx512 => avx2,
        avx2(t) => avx2::scores(t, q, (h, g, d), kmin, kmax, stride, n_pages, out),
        scalar => portable::scores(q, (h, g, d), kmin, kmax, stride, n_pages, out),
    })
}

/// Runs the three families once at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn probe(isa: Isa) {
    let keys = [1.0f32, -2.0, 3.0];
    let (mut lo, mut hi) = ([0.0f32; 3], [0.0f32; 3]);
    fold(isa, &keys, None, true, &mut lo, &mut hi);
    let (mut plo, mut phi) = ([0.0f32; 3], [0.0f32; 3]);
    page_bounds(isa, Encoded::F32(&keys), None, &mut plo, &mut phi, &[]);
    assert_eq!((lo, hi), (plo, phi));
    let mut out = [0.0f32; 1];
    scores(isa, &keys, (1, 1, 3), &lo, &hi, 3, 1, &mut out);
    assert_eq!(out[0], 14.0);
}
