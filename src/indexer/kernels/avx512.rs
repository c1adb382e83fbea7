//! The AVX-512 kernel: `G` heads (8, then 4) × 4 keys per register tile,
//! two keys per 512-bit register — key `2p` in lanes 0–7, key `2p + 1` in
//! lanes 8–15 — against each head broadcast to both halves. Each half is
//! exactly the AVX2 kernel's `__m256` chain of its (head, key) pair, reduced
//! by the same [`reduce4`] (four keys of one head at a time) and folded in
//! head order with one fused multiply-add per lane, the scalar fold's, so
//! the scores are bit-identical to the AVX2 and portable kernels'; one
//! instruction does the work of two, and the fold works on four keys at
//! once.

use super::avx2::{tile, HEADS};
use super::{BLOCK, KEYS};
use crate::simd::x86::reduce4;
use crate::simd::Avx512;
use std::arch::x86_64::*;

/// Keys per AVX-512 tile (two registers of two keys).
const KEYS4: usize = 4;
const _: () = assert!(BLOCK.is_multiple_of(KEYS4) && BLOCK.is_multiple_of(KEYS));

/// [`super::avx2::weighted_relu_sums`] with the AVX-512 tiles: heads in
/// tiles of 8 while 8 remain, then 4, then one at a time (the AVX2 tile).
///
/// # Safety
/// `q.len() == w.len() * dp`, `k.len() == BLOCK * dp`, `dp % 8 == 0` (the
/// token proves the CPU can run it).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) unsafe fn weighted_relu_sums(
    _: Avx512,
    q: &[f32],
    k: &[f32],
    w: &[f32],
    dp: usize,
    acc: &mut [f32; BLOCK],
) {
    let h = w.len();
    let mut h0 = 0;
    while h0 + 8 <= h {
        for p in (0..BLOCK).step_by(KEYS4) {
            // SAFETY: heads `h0 .. h0 + 8 <= h`; keys `p .. p + 4` of the
            // block's `BLOCK` rows of `dp`.
            unsafe { tile4::<8>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS4]) };
        }
        h0 += 8;
    }
    while h0 + HEADS <= h {
        for p in (0..BLOCK).step_by(KEYS4) {
            // SAFETY: as above, heads `h0 .. h0 + 4 <= h`.
            unsafe { tile4::<HEADS>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS4]) };
        }
        h0 += HEADS;
    }
    for h0 in h0..h {
        for p in (0..BLOCK).step_by(KEYS) {
            // SAFETY: head `h0 < h`; keys `p .. p + KEYS` as above.
            unsafe { tile::<1>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS]) };
        }
    }
}

/// Heads `h0 .. h0 + G` (`G` a multiple of 4) against 4 keys (`k`: 4 rows
/// of `dp`), folded into `acc` (4 sums) in head order.
///
/// # Safety
/// `q.len() >= (h0 + G) * dp`, `k.len() >= 4 * dp`, `acc.len() == 4`,
/// `h0 + G <= w.len()`, `dp % 8 == 0`; the CPU has AVX-512 F/DQ, AVX2, FMA.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
unsafe fn tile4<const G: usize>(
    q: &[f32],
    k: &[f32],
    w: &[f32],
    dp: usize,
    h0: usize,
    acc: &mut [f32],
) {
    let (qp, kp) = (q.as_ptr(), k.as_ptr());
    let mut a = [[_mm512_setzero_ps(); 2]; G];
    for c in (0..dp).step_by(8) {
        // SAFETY: `c + 8 <= dp`; keys `0..4` of `dp` each; heads `h0 ..
        // h0 + G` of `dp` each (the function's contract).
        unsafe {
            let kv: [__m512; 2] = std::array::from_fn(|p| {
                let lo = _mm256_loadu_ps(kp.add(2 * p * dp + c));
                let hi = _mm256_loadu_ps(kp.add((2 * p + 1) * dp + c));
                _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
            });
            for j in 0..G {
                let qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(qp.add((h0 + j) * dp + c)));
                for p in 0..2 {
                    a[j][p] = _mm512_fmadd_ps(qv, kv[p], a[j][p]);
                }
            }
        }
    }
    // Each head's dots with the 4 keys in one reduction (lanes [k0, k2,
    // k1, k3]), through the ReLU, then into the 4 keys' sums at once: lane
    // by lane the scalar `acc = fma(w_h, relu(dot_h), acc)` in head order.
    let lo = |v: __m512| _mm512_castps512_ps256(v);
    let hi = |v: __m512| _mm512_extractf32x8_ps::<1>(v);
    let mut sums = _mm_setr_ps(acc[0], acc[2], acc[1], acc[3]);
    for j in 0..G {
        let [x, y] = a[j];
        let m = reduce4(lo(x), hi(x), lo(y), hi(y));
        let m = _mm_andnot_ps(_mm_cmp_ps::<_CMP_LE_OQ>(m, _mm_setzero_ps()), m);
        sums = _mm_fmadd_ps(_mm_set1_ps(w[h0 + j]), m, sums);
    }
    let mut v = [0.0f32; 4];
    // SAFETY: `v` holds 4 floats.
    unsafe { _mm_storeu_ps(v.as_mut_ptr(), sums) };
    acc[..4].copy_from_slice(&[v[0], v[2], v[1], v[3]]);
}
