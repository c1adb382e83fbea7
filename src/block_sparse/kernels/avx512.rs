//! The AVX-512 step: six keys at a time, two per 512-bit register — key
//! `2p` in lanes 0–7, key `2p + 1` in lanes 8–15 — against each query row
//! broadcast to both halves. Each half is exactly the AVX2 kernel's `__m256`
//! accumulator of its key (the same fused multiply-adds on the same lanes in
//! the same order), and each half is reduced with the additions of
//! [`reduce4`](crate::simd::x86::reduce4), so
//! the block maxima are bit-identical to the AVX2 and portable kernels';
//! what changes is that one instruction does the work of two. The walk over
//! a segment (pieces, masking, the last keys of a run, the block key
//! magnitudes) is the AVX2 kernel's.

use super::avx2::Step;
use super::MR;
use crate::keys::lanes::Load;
use crate::simd::Avx512;
use std::arch::x86_64::*;

/// Six keys per step; holds the proof that the AVX-512 code may run.
#[derive(Clone, Copy)]
pub(super) struct Step6(pub(super) Avx512);

impl Step for Step6 {
    const KEYS: usize = 6;
    const FOLDS_FP8_SCALE: bool = true;
    #[inline(always)]
    unsafe fn fold<L: Load>(
        self,
        q: *const f32,
        dp: usize,
        k: *const L::E,
        d: usize,
        m: __m128,
    ) -> __m128 {
        // SAFETY: `self.0` proves AVX-512 F/BW/DQ/VL (and AVX2, FMA, F16C);
        // the pointer contract is the caller's.
        let s = unsafe { dots6::<L>(q, dp, k, d) };
        s.into_iter().fold(m, |m, sj| {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_max_ps(sj, m) }
        })
    }
}

/// Dot products of the 4 rows at `q` (stride `dp`) with the 6 keys at `k`
/// (stride `d`), each as `[r0, r2, r1, r3]`.
///
/// # Safety
/// `q` readable for `4 * dp` floats (`dp >= d` rounded up to 8), `k` for
/// `6 * d` elements; AVX-512 F/BW/DQ/VL, AVX2, FMA and F16C available.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn dots6<L: Load>(q: *const f32, dp: usize, k: *const L::E, d: usize) -> [__m128; 6] {
    let mut acc = [[_mm512_setzero_ps(); 3]; MR];
    let full = d / 8;
    for c in 0..full {
        let mut kv = [_mm512_setzero_ps(); 3];
        for (p, v) in kv.iter_mut().enumerate() {
            // SAFETY: keys 2p and 2p+1, dims c*8 .. c*8+8, are within d.
            *v = unsafe { L::load16(k.add(2 * p * d + c * 8), k.add((2 * p + 1) * d + c * 8)) };
        }
        for (r, accr) in acc.iter_mut().enumerate() {
            // SAFETY: row r's dims c*8 .. c*8+8 are within dp.
            let qv = _mm512_broadcast_f32x8(unsafe { _mm256_loadu_ps(q.add(r * dp + c * 8)) });
            for p in 0..3 {
                accr[p] = _mm512_fmadd_ps(qv, kv[p], accr[p]);
            }
        }
    }
    if !d.is_multiple_of(8) {
        let (c, n) = (full, d % 8);
        let mut kv = [_mm512_setzero_ps(); 3];
        for (p, v) in kv.iter_mut().enumerate() {
            // SAFETY: only dims c*8 .. d of keys 2p and 2p+1 are read.
            *v = unsafe {
                L::load16_tail(k.add(2 * p * d + c * 8), k.add((2 * p + 1) * d + c * 8), n)
            };
        }
        for (r, accr) in acc.iter_mut().enumerate() {
            // SAFETY: dp is d rounded up to 8, zero-padded.
            let qv = _mm512_broadcast_f32x8(unsafe { _mm256_loadu_ps(q.add(r * dp + c * 8)) });
            for p in 0..3 {
                accr[p] = _mm512_fmadd_ps(qv, kv[p], accr[p]);
            }
        }
    }
    // SAFETY: the target features above.
    unsafe { reduce::<3, 6>(acc) }
}

/// The `4 K` dot products of a `K`-key step's accumulators (`acc[r][p]`:
/// row `r`, keys `2p` and `2p + 1` in the low and high halves), each summed in
/// the canonical tree `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`
/// as [`reduce4`](crate::simd::x86::reduce4) sums it (the same additions of the same operands), but
/// in 512-bit registers, 16 lanes an addition: per key, `[r0, r2, r1, r3]`.
///
/// # Safety
/// AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn reduce<const P: usize, const K: usize>(acc: [[__m512; P]; MR]) -> [__m128; K] {
    const { assert!(K == 2 * P) };
    // Quarters (4 lanes) of `acc[r][p]`: key 2p's l0-3, l4-7, key 2p+1's
    // l0-3, l4-7. First `l_j + l_{j+4}`, rows paired: quarters [r A, r B,
    // r' A, r' B] (A, B: the two keys).
    let first = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    // Then `m_0 + m_2`, `m_1 + m_3` within each quarter, for two registers:
    // quarter q is [x.q's two, y.q's two].
    let second = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    };
    // Last `p_0 + p_1`, a key's rows brought into one quarter first:
    // `r0, r2` are in quarter q, `r1, r3` in quarter q + 2.
    let third = |u: __m512, v: __m512| {
        let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(u, v);
        let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(u, v);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(lo, hi),
            _mm512_shuffle_ps::<0b11_01_11_01>(lo, hi),
        )
    };
    let r: [__m512; P] =
        std::array::from_fn(|p| second(first(acc[0][p], acc[1][p]), first(acc[2][p], acc[3][p])));
    // Keys 4i .. 4i + 4 in the quarters of `third(r[2i], r[2i + 1])` (an odd
    // last register with itself: its two keys twice).
    let mut out = [_mm_setzero_ps(); K];
    for i in 0..P.div_ceil(2) {
        let f = third(r[2 * i], r[(2 * i + 1).min(P - 1)]);
        let quarters = [
            _mm512_castps512_ps128(f),
            _mm512_extractf32x4_ps::<1>(f),
            _mm512_extractf32x4_ps::<2>(f),
            _mm512_extractf32x4_ps::<3>(f),
        ];
        for (o, q) in out[4 * i..].iter_mut().zip(quarters) {
            *o = q;
        }
    }
    out
}
