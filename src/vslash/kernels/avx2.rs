//! The AVX2 + FMA kernels: the portable arithmetic eight lanes at a time.

use super::portable::{self, TILE};
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// [`portable::tile`] with AVX2: a register a row, eight keys in its lanes;
/// each lane runs the portable chain (`fma` over `k` ascending from `+0`,
/// then the product with `c`), so the bits are the portable ones.
#[target_feature(enable = "avx2,fma")]
pub(super) fn tile(
    _t: Avx2,
    rows: &[&[f32]; TILE],
    panel: &[f32],
    d: usize,
    c: f32,
    out: &mut [[f32; TILE]; TILE],
) {
    assert!(panel.len() >= d * TILE && rows.iter().all(|r| r.len() >= d));
    let mut acc = [_mm256_setzero_ps(); TILE];
    let p = panel.as_ptr();
    let q: [*const f32; TILE] = std::array::from_fn(|r| rows[r].as_ptr());
    for k in 0..d {
        // SAFETY: k < d; the panel holds d · 8 floats and every row d
        // (asserted above).
        unsafe {
            let kv = _mm256_loadu_ps(p.add(k * TILE));
            for r in 0..TILE {
                let qv = _mm256_broadcast_ss(&*q[r].add(k));
                acc[r] = _mm256_fmadd_ps(qv, kv, acc[r]);
            }
        }
    }
    let cv = _mm256_set1_ps(c);
    for r in 0..TILE {
        // SAFETY: out[r] is 8 floats.
        unsafe { _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_mul_ps(acc[r], cv)) };
    }
}

/// [`portable::accumulate`] compiled for AVX2 (the same operations in the
/// same order on each element; the compiler may only widen them).
#[target_feature(enable = "avx2,fma")]
pub(super) fn accumulate(_t: Avx2, e: &[f32], w: f32, vert: &mut [f32], slash: &mut [f32]) {
    portable::accumulate(e, w, vert, slash)
}

/// [`portable::lane_sums`] compiled for AVX2.
#[target_feature(enable = "avx2,fma")]
pub(super) fn lane_sums(_t: Avx2, e: &[f32], lanes: &mut [f32; 8]) {
    portable::lane_sums(e, lanes)
}
