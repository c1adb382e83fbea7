//! The portable kernel: the AVX2 kernel's chains, lane by lane.

use super::relu;

/// `Σ_h fma(w_h, relu(q_h · k))` in head order, each dot in 8 lanes.
pub(super) fn weighted_relu_sum(q: &[f32], k: &[f32], w: &[f32], dp: usize) -> f32 {
    let mut acc = 0.0f32;
    for (qh, &wh) in q.chunks_exact(dp).zip(w) {
        let mut lanes = [0.0f32; 8];
        for (qc, kc) in qh.chunks_exact(8).zip(k.chunks_exact(8)) {
            for j in 0..8 {
                lanes[j] = qc[j].mul_add(kc[j], lanes[j]);
            }
        }
        let l = lanes;
        let dot = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        acc = wh.mul_add(relu(dot), acc);
    }
    acc
}
