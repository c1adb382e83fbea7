//! The vertical-slash estimate's kernel families, dispatched once each:
//! `vslash.scores` (a `4 × 16` tile of scaled dot products, with the rows'
//! maxima), `vslash.transpose` (eight keys interleaved into a panel),
//! `vslash.sums` (a row's probabilities into the column and diagonal sums)
//! and `vslash.lane_sums` (a row's sum in eight lanes). The portable
//! kernels define the arithmetic; the AVX2 ones repeat it lane by lane, so
//! every level gives the same bits (the tests compare them). The AVX-512
//! level runs the AVX2 kernels: no AVX-512 machine was at hand to test one
//! on.

#[cfg(target_arch = "x86_64")]
mod avx2;
pub(crate) mod portable;

pub(crate) use portable::{lanes_total, COLS, ROWS, TILE};

use crate::simd::{dispatch, Isa};

/// `fl(dot(rows[r], key j) · c)`, key `j`'s element `k` at
/// `panel[k * 16 + j]`, row `r`'s first `valid[r]` scores written to
/// `dst[at[r]..]` and taken into `row_max[r]` and `finite` (see
/// [`portable::tile`]).
///
/// # Panics
/// When the panel holds fewer than `d · 8` floats, a row fewer than `d`, a
/// count is past 8 or a row's slots past `dst` (a caller's bug, never user
/// input).
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    isa: Isa,
    rows: &[&[f32]; ROWS],
    panel: &[f32],
    d: usize,
    c: f32,
    valid: &[usize; ROWS],
    dst: &mut [f32],
    at: &[usize; ROWS],
    row_max: &mut [f32; ROWS],
    finite: &mut bool,
) {
    dispatch!("vslash.scores", isa, {
        avx512 => avx2,
        // SAFETY (bounds): asserted by the kernel before its first read
        // (the portable one indexes checked slices).
        avx2(t) => avx2::tile(t, rows, panel, d, c, valid, dst, at, row_max, finite),
        scalar => portable::tile(rows, panel, d, c, valid, dst, at, row_max, finite),
    })
}

/// `panel[k * 16 + j] = rows[j][k]`: eight keys interleaved into a panel's
/// first eight columns (moves only).
///
/// # Panics
/// When the rows differ in length or the panel is short (a caller's bug).
pub(crate) fn transpose(isa: Isa, rows: &[&[f32]; TILE], panel: &mut [f32]) {
    dispatch!("vslash.transpose", isa, {
        avx512 => avx2,
        // SAFETY (bounds): asserted by the kernel before its first read
        // (the portable one indexes checked slices).
        avx2(t) => avx2::transpose(t, rows, panel),
        scalar => portable::transpose(rows, panel),
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
    let rows = [&row[..]; ROWS];
    let panel = [1.0f32; 4 * COLS];
    let mut out = [0.0f32; ROWS * COLS];
    let (mut m, mut finite) = ([f32::NEG_INFINITY; ROWS], true);
    let at = std::array::from_fn(|r| r * COLS);
    let valid = [COLS; ROWS];
    tile(
        isa,
        &rows,
        &panel,
        4,
        0.5,
        &valid,
        &mut out,
        &at,
        &mut m,
        &mut finite,
    );
    assert_eq!((out, m, finite), ([2.0; ROWS * COLS], [2.0; ROWS], true));
    let mut p = [0.0f32; 9 * COLS];
    let keys: Vec<Vec<f32>> = (0..TILE)
        .map(|j| (0..9).map(|k| (k * 10 + j) as f32).collect())
        .collect();
    let rows: [&[f32]; TILE] = std::array::from_fn(|j| &keys[j][..]);
    transpose(isa, &rows, &mut p);
    assert!((0..9 * COLS).all(|i| p[i]
        == if i % COLS < TILE {
            ((i / COLS) * 10 + i % COLS) as f32
        } else {
            0.0
        }));
    let (mut v, mut s) = ([0.0f32; 3], [0.0f32; 3]);
    accumulate(isa, &[1.0; 3], 0.5, &mut v, &mut s);
    assert_eq!((v, s), ([0.5; 3], [0.5; 3]));
    let mut lanes = [0.0f32; 8];
    lane_sums(isa, &[1.0; 9], &mut lanes);
    assert_eq!(lanes_total(&lanes), 9.0);
}
