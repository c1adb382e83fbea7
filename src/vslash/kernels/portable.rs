//! The portable kernels: the arithmetic every level repeats bit for bit.

/// Rows and columns of one score tile.
pub(crate) const TILE: usize = 8;

/// One `8 × 8` tile of scores: `out[r][j] = fl(dot(rows[r], key j) · c)`,
/// the dot product a chain of fused multiply-adds over `k = 0 .. d` from
/// `+0`, key `j`'s element `k` at `panel[k * 8 + j]`.
pub(crate) fn tile(
    rows: &[&[f32]; TILE],
    panel: &[f32],
    d: usize,
    c: f32,
    out: &mut [[f32; TILE]; TILE],
) {
    for (r, row) in rows.iter().enumerate() {
        let mut acc = [0.0f32; TILE];
        for k in 0..d {
            let q = row[k];
            let p = &panel[k * TILE..k * TILE + TILE];
            for j in 0..TILE {
                acc[j] = q.mul_add(p[j], acc[j]);
            }
        }
        for j in 0..TILE {
            out[r][j] = acc[j] * c;
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
