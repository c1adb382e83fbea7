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
#[cfg(doc)]
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

/// [`reduce4`] of two heads' tiles at once: `x = [[k0 | k1], [k2 | k3]]` of
/// one head and `y` of the next; the low 128 bits of the result are
/// `reduce4(k0, k1, k2, k3)` of `x`, the high 128 bits of `y` — the same
/// additions of the same pairs, in the same order, on 512-bit registers
/// (about half the shuffles per dot).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn reduce4_pair(x: [__m512; 2], y: [__m512; 2]) -> __m256 {
    // [a.L, a.H, b.L, b.H] and [c.L, c.H, d.L, d.H] (128-bit lanes) to
    // [a.L+a.H, b.L+b.H | c.L+c.H, d.L+d.H]: reduce4's X | Y.
    let halves = |[ab, cd]: [__m512; 2]| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
        )
    };
    let (sx, sy) = (halves(x), halves(y));
    // [X_x | X_y] and [Y_x | Y_y], then reduce4's in-lane step on both.
    let u = _mm512_shuffle_f32x4::<0b01_00_01_00>(sx, sy);
    let v = _mm512_shuffle_f32x4::<0b11_10_11_10>(sx, sy);
    let z = _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(u, v),
        _mm512_shuffle_ps::<0xEE>(u, v),
    );
    // [z_x.0, z_y.0] and [z_x.1, z_y.1]: one hadd finishes both heads.
    let a = _mm512_shuffle_f32x4::<0b11_01_10_00>(z, z);
    _mm256_hadd_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps::<1>(a))
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
    let mut sums = _mm_setr_ps(acc[0], acc[2], acc[1], acc[3]);
    for j in (0..G).step_by(2) {
        // Two heads' reductions at once, each half of a 256-bit result
        // exactly one head's `reduce4` (lanes [k0, k2, k1, k3]).
        let m = reduce4_pair(a[j], a[j + 1]);
        let m = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(m, _mm256_setzero_ps()), m);
        sums = _mm_fmadd_ps(_mm_set1_ps(w[h0 + j]), _mm256_castps256_ps128(m), sums);
        sums = _mm_fmadd_ps(
            _mm_set1_ps(w[h0 + j + 1]),
            _mm256_extractf128_ps::<1>(m),
            sums,
        );
    }
    let mut v = [0.0f32; 4];
    // SAFETY: `v` holds 4 floats.
    unsafe { _mm_storeu_ps(v.as_mut_ptr(), sums) };
    acc[..4].copy_from_slice(&[v[0], v[2], v[1], v[3]]);
}
