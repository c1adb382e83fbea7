//! The vertical-slash estimate's kernel families, dispatched once each:
//! `vslash.scores` (an `8 × 8` tile of scaled dot products) and
//! `vslash.sums` (a row's probabilities into the column and diagonal sums,
//! and a row's lane sums). The portable kernels define the arithmetic; the
//! AVX2 ones repeat it lane by lane, so every level gives the same bits
//! (the tests compare them). The AVX-512 level runs the AVX2 kernels: no
//! AVX-512 machine was at hand to test one on.

#[cfg(target_arch = "x86_64")]
mod avx2;
pub(crate) mod portable;

pub(crate) use portable::{lanes_total, TILE};

use crate::simd::{dispatch, Isa};

/// `out[r][j] = fl(dot(rows[r], key j) · c)`, key `j`'s element `k` at
/// `panel[k * 8 + j]` (see [`portable::tile`]).
///
/// # Panics
/// When the panel holds fewer than `d · 8` floats or a row fewer than `d`
/// (a caller's bug, never user input).
pub(crate) fn tile(
    isa: Isa,
    rows: &[&[f32]; TILE],
    panel: &[f32],
    d: usize,
    c: f32,
    out: &mut [[f32; TILE]; TILE],
) {
    assert!(panel.len() >= d * TILE && rows.iter().all(|r| r.len() >= d));
    dispatch!("vslash.scores", isa, {
        avx512 => avx2,
        // SAFETY (bounds): asserted above (and again in the kernel).
        avx2(t) => avx2::tile(t, rows, panel, d, c, out),
        scalar => portable::tile(rows, panel, d, c, out),
    })
}

/// The sums' kernels at `isa`: one row's probabilities `fl(e · w)` into
/// `vert` and `slash` (element `j` into `vert[j]` and `slash[j]`).
pub(crate) fn accumulate(isa: Isa, e: &[f32], w: f32, vert: &mut [f32], slash: &mut [f32]) {
    dispatch!("vslash.sums", isa, {
        avx512 => avx2,
        // SAFETY (bounds): none to state; the kernel indexes its slices.
        avx2(t) => avx2::accumulate(t, e, w, vert, slash),
        scalar => portable::accumulate(e, w, vert, slash),
    })
}

/// `Σ e` into eight lanes (lane `l` takes elements `l, l + 8, …`).
pub(crate) fn lane_sums(isa: Isa, e: &[f32], lanes: &mut [f32; 8]) {
    dispatch!("vslash.lane_sums", isa, {
        avx512 => avx2,
        // SAFETY (bounds): none to state; the kernel indexes its slices.
        avx2(t) => avx2::lane_sums(t, e, lanes),
        scalar => portable::lane_sums(e, lanes),
    })
}

/// Runs every family at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn probe(isa: Isa) {
    let row = [1.0f32; 4];
    let rows = [&row[..]; TILE];
    let panel = [1.0f32; 4 * TILE];
    let mut out = [[0.0f32; TILE]; TILE];
    tile(isa, &rows, &panel, 4, 0.5, &mut out);
    assert_eq!(out, [[2.0; TILE]; TILE]);
    let (mut v, mut s) = ([0.0f32; 3], [0.0f32; 3]);
    accumulate(isa, &[1.0; 3], 0.5, &mut v, &mut s);
    assert_eq!((v, s), ([0.5; 3], [0.5; 3]));
    let mut lanes = [0.0f32; 8];
    lane_sums(isa, &[1.0; 9], &mut lanes);
    assert_eq!(lanes_total(&lanes), 9.0);
}
