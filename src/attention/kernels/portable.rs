//! The portable kernels: the chains the AVX2 kernels run eight at a time,
//! one element at a time with `f32::mul_add` (bounds are checked by the
//! dispatchers in `mod.rs`).

use super::KEY_TILE;
use crate::exp::exp_scalar;

/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
#[inline(always)]
fn reduce8(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Keys `keys` of [`super::pack_keys`]'s list, one at a time, in blocks
/// of `lanes` keys.
pub(super) fn pack_keys(
    dst: &mut [f32],
    k: &[f32],
    d: usize,
    lanes: usize,
    keys: std::ops::Range<usize>,
    offset: impl Fn(usize) -> usize,
) {
    for j in keys {
        let src = &k[offset(j)..offset(j) + d];
        let block = &mut dst[(j / lanes) * lanes * d..(j / lanes + 1) * lanes * d];
        for (slot, &x) in block[j % lanes..].iter_mut().step_by(lanes).zip(src) {
            *slot = x;
        }
    }
}

/// [`super::scores`]: each key's dot product one chain
/// `acc = fma(q_c, k_c, acc)` over `c` in order from `+0.0`, the chains of
/// a block's 8 keys side by side (a loop over the lanes, so a compiler
/// vectorises it where the target has vector FMAs: aarch64's NEON does;
/// each key's chain is the same scalar chain either way).
pub(super) fn scores(
    q: &[f32],
    q_offs: &[usize],
    ktile: &[f32],
    d: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    for (r, &qo) in q_offs.iter().enumerate() {
        let qr = &q[qo..qo + d];
        for b in 0..KEY_TILE / 8 {
            let kb = &ktile[b * 8 * d..(b + 1) * 8 * d];
            let mut acc = [0.0f32; 8];
            for (&x, kc) in qr.iter().zip(kb.chunks_exact(8)) {
                for (a, &k) in acc.iter_mut().zip(kc) {
                    *a = x.mul_add(k, *a);
                }
            }
            let at = r * stride + b * 8;
            for (o, &a) in out[at..at + 8].iter_mut().zip(&acc) {
                *o = a * scale;
            }
        }
    }
}

/// [`super::softmax`], lane by lane.
pub(super) fn softmax(s: &mut [f32]) -> (f32, f32) {
    let mut m = f32::NEG_INFINITY;
    for &x in s.iter() {
        if x > m {
            m = x;
        }
    }
    // -0.0 and +0.0 are one maximum.
    let m = m + 0.0;
    let mut lanes = [0.0f32; 8];
    for chunk in s.chunks_exact_mut(8) {
        for (lane, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *x = exp_scalar(*x - m);
            *lane += *x;
        }
    }
    (m, reduce8(lanes))
}

/// [`super::accumulate`], one element at a time.
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    p: &[f32],
    stride: usize,
    r0: usize,
    rows: usize,
    v: &[f32],
    voff: &[usize],
    j0: usize,
    j1: usize,
    o: &mut [f32],
    d_v: usize,
) {
    for r in r0..r0 + rows {
        let orow = &mut o[r * d_v..(r + 1) * d_v];
        let prow = &p[r * stride..];
        for j in j0..j1 {
            let pj = prow[j];
            let vrow = &v[voff[j]..voff[j] + d_v];
            for (oc, &vc) in orow.iter_mut().zip(vrow) {
                *oc = pj.mul_add(vc, *oc);
            }
        }
    }
}
