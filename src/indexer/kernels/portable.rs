//! The portable kernel: every lane's chain, one key at a time (written as
//! loops over the block's keys, which a compiler may vectorise: each key's
//! operations stay the same scalar chain).

use super::{relu, slot, Tiles, BLOCK};

/// `kt[i · BLOCK + r] = rows[r · d + i]` for `r < n`, `0` past `n`.
pub(super) fn transpose(rows: &[f32], n: usize, d: usize, kt: &mut [f32]) {
    for (i, lanes) in kt.chunks_exact_mut(BLOCK).enumerate().take(d) {
        for (r, lane) in lanes.iter_mut().enumerate() {
            *lane = if r < n { rows[r * d + i] } else { 0.0 };
        }
    }
}

/// For every key `r` of the block, `acc_r = fma(w_h, relu(dot_hr), acc_r)`
/// (`dot_hr` itself without `RELU`: activation none)
/// in head order, `dot_hr = fma(q_hi, k_ri, dot_hr)` over `i` in order
/// from `+0.0`; `qt` in head tiles `tiles` ([`super::Query`]), `kt` `[d, BLOCK]`.
pub(super) fn weighted_relu_sums<const RELU: bool>(
    tiles: Tiles,
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    acc: &mut [f32; BLOCK],
) {
    let h = w.len();
    for (head, &wh) in w.iter().enumerate() {
        let mut dot = [0.0f32; BLOCK];
        let (base, stride) = slot(tiles, h, d, head);
        for i in 0..d {
            let qi = qt[base + i * stride];
            for (x, &k) in dot.iter_mut().zip(&kt[i * BLOCK..(i + 1) * BLOCK]) {
                *x = qi.mul_add(k, *x);
            }
        }
        for (a, &x) in acc.iter_mut().zip(&dot) {
            *a = wh.mul_add(if RELU { relu(x) } else { x }, *a);
        }
    }
}
