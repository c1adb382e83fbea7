//! The portable kernels: the arithmetic every level repeats bit for bit.

/// Query rows of one score tile.
pub(crate) const ROWS: usize = 4;
/// Keys of one score tile: a panel holds `COLS` keys interleaved.
pub(crate) const COLS: usize = 16;
/// Keys one transpose interleaves.
pub(crate) const TILE: usize = 8;

/// One `4 × 16` tile of scores: `fl(dot(rows[r], key j) · c)`, the dot
/// product a chain of fused multiply-adds over `k = 0 .. d` from `+0`, key
/// `j`'s element `k` at `panel[k * 16 + j]`. Row `r`'s first `valid[r]`
/// scores are written to `dst[at[r]..]` and raise `row_max[r]` (`max` is
/// exact: the order does not matter, and a zero's sign does not change `x −
/// max` but at `x = −0`, whose `exp` is 1 either way) and clear `finite` if
/// one is not.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
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
    for (r, row) in rows.iter().enumerate() {
        let mut acc = [0.0f32; COLS];
        for k in 0..d {
            let q = row[k];
            let p = &panel[k * COLS..k * COLS + COLS];
            for j in 0..COLS {
                acc[j] = q.mul_add(p[j], acc[j]);
            }
        }
        let out = &mut dst[at[r]..at[r] + valid[r]];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a * c;
        }
        for &x in out.iter() {
            *finite &= x.is_finite();
            if x > row_max[r] {
                row_max[r] = x;
            }
        }
    }
}

/// `panel[k * 16 + j] = rows[j][k]` for `k < rows[j].len()` (every row the
/// same length): eight keys' elements interleaved into a panel's columns
/// `0 .. 8` (the caller offsets the panel for the next eight).
pub(crate) fn transpose(rows: &[&[f32]; TILE], panel: &mut [f32]) {
    let kc = rows[0].len();
    for (j, row) in rows.iter().enumerate() {
        for k in 0..kc {
            panel[k * COLS + j] = row[k];
        }
    }
}

/// One row's share of a column tile of the sums: `p = fl(e · w)` for each
/// of the row's probabilities `e`, added to the column's vertical sum
/// `vert[j]` and to its diagonal's sum `slash[j + shift]` (each sum takes
/// its rows in ascending order, one addition a row).
#[inline(always)]
pub(crate) fn accumulate(e: &[f32], w: f32, vert: &mut [f32], slash: &mut [f32]) {
    let n = e.len();
    let (vert, slash) = (&mut vert[..n], &mut slash[..n]);
    for j in 0..n {
        let p = e[j] * w;
        vert[j] += p;
        slash[j] += p;
    }
}

/// `Σ e` in eight lanes: lane `l` adds the elements at `l, l + 8, …` in
/// order (the lanes continue from `lanes`).
#[inline(always)]
pub(crate) fn lane_sums(e: &[f32], lanes: &mut [f32; 8]) {
    let mut chunks = e.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            lanes[l] += c[l];
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        lanes[l] += x;
    }
}

/// The lanes' total, `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
pub(crate) fn lanes_total(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}
