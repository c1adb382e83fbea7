//! The AVX2 + FMA kernel: 4 heads × 2 keys per register tile, one
//! `__m256` accumulator per (head, key), reduced in the canonical order.

use super::{relu, BLOCK, KEYS};
use crate::simd::x86::reduce4;
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// Heads per register tile.
pub(super) const HEADS: usize = 4;

/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` of one accumulator.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
}

/// The portable kernel's chains for a block of `BLOCK` keys: for each
/// tile of `HEADS` heads in head order, every pair of keys in the block
/// (8 accumulators, kept in registers: the tile's loops have constant
/// bounds). Each dot product is still one 8-lane FMA chain over the
/// dimensions in order, and each key's sum takes its heads in head order.
///
/// # Safety
/// `q.len() == w.len() * dp`, `k.len() == BLOCK * dp`, `dp % 8 == 0`
/// (the token proves the CPU can run it).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_relu_sums(
    _: Avx2,
    q: &[f32],
    k: &[f32],
    w: &[f32],
    dp: usize,
    acc: &mut [f32; BLOCK],
) {
    let h = w.len();
    let full = h / HEADS * HEADS;
    for h0 in (0..full).step_by(HEADS) {
        for p in (0..BLOCK).step_by(KEYS) {
            // SAFETY: heads `h0 .. h0 + HEADS <= h`; keys `p .. p + KEYS`
            // of the block's `BLOCK` rows of `dp`.
            unsafe { tile::<HEADS>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS]) };
        }
    }
    for h0 in full..h {
        for p in (0..BLOCK).step_by(KEYS) {
            // SAFETY: head `h0 < h`; keys `p .. p + KEYS` as above.
            unsafe { tile::<1>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS]) };
        }
    }
}

/// Four heads' dot products of one key (`m`, lanes `[h0, h2, h1, h3]` as
/// [`reduce4`] leaves them) through the ReLU (`x <= 0 ? 0 : x`, NaN kept,
/// on the vector), then into the key's sum in head order.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn fold_heads(m: __m128, w: &[f32], acc: &mut f32) {
    let m = _mm_andnot_ps(_mm_cmp_ps::<_CMP_LE_OQ>(m, _mm_setzero_ps()), m);
    let mut v = [0.0f32; 4];
    // SAFETY: `v` holds 4 floats.
    unsafe { _mm_storeu_ps(v.as_mut_ptr(), m) };
    for (j, lane) in [0, 2, 1, 3].into_iter().enumerate() {
        *acc = w[j].mul_add(v[lane], *acc);
    }
}

/// Heads `h0 .. h0 + G` against `KEYS` keys (`k`: `KEYS` rows of `dp`),
/// folded into `acc` (`KEYS` sums).
///
/// # Safety
/// `q.len() >= (h0 + G) * dp`, `k.len() >= KEYS * dp`, `acc.len() ==
/// KEYS`, `h0 + G <= w.len()`, `dp % 8 == 0`; the CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
pub(super) unsafe fn tile<const G: usize>(
    q: &[f32],
    k: &[f32],
    w: &[f32],
    dp: usize,
    h0: usize,
    acc: &mut [f32],
) {
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    let mut a = [[_mm256_setzero_ps(); KEYS]; G];
    for c in (0..dp).step_by(8) {
        // SAFETY: `c + 8 <= dp`; keys `0..KEYS` of `dp` each; heads
        // `h0 .. h0 + G` of `dp` each (the function's contract).
        unsafe {
            let kv: [__m256; KEYS] = std::array::from_fn(|r| _mm256_loadu_ps(kp.add(r * dp + c)));
            for j in 0..G {
                let qv = _mm256_loadu_ps(qp.add((h0 + j) * dp + c));
                for r in 0..KEYS {
                    a[j][r] = _mm256_fmadd_ps(qv, kv[r], a[j][r]);
                }
            }
        }
    }
    if G == HEADS {
        // Four dot products per reduction; the ReLU (`x <= 0 ? 0 : x`,
        // NaN kept) on the vector; then each key's sum in head order.
        for r in 0..KEYS {
            let m = reduce4(a[0][r], a[1 % G][r], a[2 % G][r], a[3 % G][r]);
            fold_heads(m, &w[h0..h0 + HEADS], &mut acc[r]);
        }
    } else {
        for j in 0..G {
            for r in 0..KEYS {
                let dot = reduce(a[j][r]);
                acc[r] = w[h0 + j].mul_add(relu(dot), acc[r]);
            }
        }
    }
}
