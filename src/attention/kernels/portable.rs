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

/// [`super::scores`], one dot product at a time.
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
        for t in 0..KEY_TILE {
            let kb = &ktile[(t / 8) * 8 * d..];
            let mut acc = 0.0f32;
            for (c, &x) in qr.iter().enumerate() {
                acc = x.mul_add(kb[c * 8 + t % 8], acc);
            }
            out[r * stride + t] = acc * scale;
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
