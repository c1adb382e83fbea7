//! Loading keys in their own format as `f32` lanes, exactly: eight
//! elements of one key for the AVX2 kernels (block selection's dots, the
//! indexer's transpose), or eight of each of two keys (one 512-bit
//! register) for block selection's AVX-512 kernel. The lanes are the scalar
//! decode's values ([`crate::keys::x86`] tests every bit pattern), so the
//! kernels' arithmetic is the float32 kernel's.

use super::x86 as decode;
use std::arch::x86_64::*;

/// An element format the kernel reads keys in.
pub(crate) trait Load {
    type E: Copy;
    /// Eight elements at `p` as `f32` lanes.
    ///
    /// # Safety
    /// `p` must be readable for 8 elements; AVX2, FMA and F16C available.
    unsafe fn load8(p: *const Self::E) -> __m256;
    /// The `n <= 8` elements at `p` (a key's last, or a block's ragged
    /// edge), zeros in the other lanes.
    ///
    /// # Safety
    /// `p` must be readable for `n` elements; AVX2, FMA and F16C available.
    unsafe fn load_tail(p: *const Self::E, n: usize) -> __m256 {
        // The copy below writes `n` elements into 8 (checked in release).
        assert!(n <= 8);
        let mut buf = [Self::zero(); 8];
        // SAFETY: `n` elements at `p` are readable (the contract); `buf`
        // holds 8 >= n, and the 8 read back are all initialised.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            Self::load8(buf.as_ptr())
        }
    }
    fn zero() -> Self::E;

    /// Eight elements at `a` in the low half and eight at `b` in the high
    /// half of one register.
    ///
    /// # Safety
    /// `a` and `b` readable for 8 elements each; AVX-512 F/BW/DQ/VL, AVX2,
    /// FMA and F16C available.
    unsafe fn load16(a: *const Self::E, b: *const Self::E) -> __m512;

    /// [`Load::load16`] of the last `n < 8` elements of two keys.
    ///
    /// # Safety
    /// As [`Load::load16`], for `n` elements each.
    #[inline(always)]
    unsafe fn load16_tail(a: *const Self::E, b: *const Self::E, n: usize) -> __m512 {
        // SAFETY: the contract.
        unsafe { join(Self::load_tail(a, n), Self::load_tail(b, n)) }
    }
}

/// `[lo | hi]` in one register.
///
/// # Safety
/// AVX-512 F/DQ available.
#[inline(always)]
unsafe fn join(lo: __m256, hi: __m256) -> __m512 {
    // SAFETY: the contract (AVX-512 DQ for the insert).
    unsafe { _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi) }
}

/// Eight 16-bit elements at `a`, then eight at `b`.
///
/// # Safety
/// `a` and `b` readable for 16 bytes each; AVX2.
#[inline(always)]
unsafe fn two_rows16(a: *const u16, b: *const u16) -> __m256i {
    // SAFETY: 16 bytes at each (the contract); unaligned loads.
    unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a.cast())),
            _mm_loadu_si128(b.cast()),
        )
    }
}

/// Sixteen bytes: eight at `a`, then eight at `b`.
///
/// # Safety
/// `a` and `b` readable for 8 bytes each; SSE2.
#[inline(always)]
unsafe fn two_halves(a: *const u8, b: *const u8) -> __m128i {
    // SAFETY: 8 bytes at each (the contract); unaligned loads.
    unsafe { _mm_unpacklo_epi64(_mm_loadl_epi64(a.cast()), _mm_loadl_epi64(b.cast())) }
}

pub(crate) struct F32;
pub(crate) struct Bf16;
pub(crate) struct F16;
pub(crate) struct Fp8;
/// fp8 keys known to hold no NaN byte (the indexer checks each block): a
/// three-operation decode instead of seven.
pub(crate) struct Fp8Finite;
/// fp8 keys as `2⁻⁸ ×` their values ([`decode::load8_fp8_scaled`]), for a
/// kernel whose query carries the `2⁸` ([`decode::fp8_folded_query`]): no
/// multiply per key.
pub(crate) struct Fp8Scaled;
/// [`Fp8Scaled`] of keys known to hold no NaN byte: three integer
/// operations and the F16C widening per eight elements.
pub(crate) struct Fp8ScaledFinite;

impl Load for F32 {
    type E = f32;
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the contract.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const f32, b: *const f32) -> __m512 {
        // SAFETY: the contract.
        unsafe { join(_mm256_loadu_ps(a), _mm256_loadu_ps(b)) }
    }
    fn zero() -> f32 {
        0.0
    }
}
impl Load for Bf16 {
    type E = u16;
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        // SAFETY: the contract.
        unsafe { decode::load8_bf16(p) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const u16, b: *const u16) -> __m512 {
        // SAFETY: the contract; 16 bytes at each of `a` and `b`.
        let x = unsafe { two_rows16(a, b) };
        // SAFETY: AVX-512 F (the contract).
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x))) }
    }
    fn zero() -> u16 {
        0
    }
}
impl Load for F16 {
    type E = u16;
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        // SAFETY: the contract.
        unsafe { decode::load8_f16(p) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const u16, b: *const u16) -> __m512 {
        // SAFETY: the contract; 16 bytes at each of `a` and `b`.
        let x = unsafe { two_rows16(a, b) };
        // SAFETY: AVX-512 F (the contract).
        unsafe { _mm512_cvtph_ps(x) }
    }
    fn zero() -> u16 {
        0
    }
}
impl Load for Fp8 {
    type E = u8;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the contract.
        unsafe { decode::load8_fp8(p) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const u8, b: *const u8) -> __m512 {
        // SAFETY: the contract; the scaled lanes `× 2⁸` (exact; NaN stays
        // the same NaN).
        unsafe { _mm512_mul_ps(Fp8Scaled::load16(a, b), _mm512_set1_ps(256.0)) }
    }
    fn zero() -> u8 {
        0
    }
}

impl Load for Fp8Finite {
    type E = u8;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the contract; 8 bytes at `p`.
        unsafe { _mm256_mul_ps(decode::load8_fp8_scaled_finite(p), _mm256_set1_ps(256.0)) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const u8, b: *const u8) -> __m512 {
        // SAFETY: the contract; the scaled lanes `× 2⁸` (exact).
        unsafe { _mm512_mul_ps(Fp8ScaledFinite::load16(a, b), _mm512_set1_ps(256.0)) }
    }
    fn zero() -> u8 {
        0
    }
}

impl Load for Fp8Scaled {
    type E = u8;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the contract.
        unsafe { decode::load8_fp8_scaled(p) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const u8, b: *const u8) -> __m512 {
        // SAFETY: the contract; 8 bytes at each of `a` and `b`.
        unsafe { _mm512_cvtph_ps(decode::fp8x16_scaled_f16_bits(two_halves(a, b))) }
    }
    fn zero() -> u8 {
        0
    }
}

impl Load for Fp8ScaledFinite {
    type E = u8;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the contract.
        unsafe { decode::load8_fp8_scaled_finite(p) }
    }
    #[inline(always)]
    unsafe fn load16(a: *const u8, b: *const u8) -> __m512 {
        // SAFETY: the contract; 8 bytes at each of `a` and `b`.
        unsafe { _mm512_cvtph_ps(decode::fp8x16_scaled_f16_bits_finite(two_halves(a, b))) }
    }
    fn zero() -> u8 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{bf16_to_f32, f16_to_f32, fp8_e4m3fn_to_f32};

    /// The sixteen lanes of `v`, as bits.
    fn lanes16(v: __m512) -> [u32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: `out` holds 16 floats; the callers run only with AVX-512.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out.map(f32::to_bits)
    }

    /// `L::load16` of every 16-element window of `all` rotated by every
    /// lane offset (so each element visits every lane of both halves),
    /// against `want` of each element; `skip` elements are not compared.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    fn every_element_in_every_lane<L: Load>(
        all: &[L::E],
        want: impl Fn(L::E) -> u32,
        skip: impl Fn(L::E) -> bool,
    ) -> usize {
        let mut compared = 0;
        for rot in 0..16 {
            let rotated: Vec<L::E> = (0..all.len()).map(|i| all[(i + rot) % all.len()]).collect();
            for w in rotated.chunks_exact(16) {
                // SAFETY: 8 elements at each of `w[0..]` and `w[8..]`.
                let got = lanes16(unsafe { L::load16(w.as_ptr(), w[8..].as_ptr()) });
                for (g, &e) in got.iter().zip(w) {
                    if !skip(e) {
                        assert_eq!(*g, want(e), "lane of {}", std::any::type_name::<L>());
                        compared += 1;
                    }
                }
            }
        }
        compared
    }

    /// Every 512-bit load (block selection's AVX-512 kernel) gives the
    /// scalar decode's bits in every lane of both halves: all 256 fp8 bytes
    /// in each fp8 form (`2⁻⁸ ×` the value for the scaled ones; NaN bytes
    /// too, but for the finite forms, which never see one), all 65,536
    /// bfloat16 and float16 patterns (a NaN compared as a NaN).
    #[test]
    fn every_sixteen_lane_load_is_the_scalar_decode_on_every_bit_pattern() {
        if crate::simd::avx512_for_test().is_none() {
            return;
        }
        let bytes: Vec<u8> = (0..=255u8).collect();
        let nan_byte = |b: u8| b & 0x7F == 0x7F;
        let fp8 = |b: u8| fp8_e4m3fn_to_f32(b).to_bits();
        let scaled = |b: u8| match fp8_e4m3fn_to_f32(b) {
            v if v.is_nan() => v.to_bits(),
            v => (v / 256.0).to_bits(),
        };
        let patterns: Vec<u16> = (0..=u16::MAX).collect();
        // A NaN pattern is compared as the decode's quiet NaN of the same
        // sign (both decodes quiet a signalling one).
        let quiet = |v: f32| match v.is_nan() {
            true => f32::from_bits(v.to_bits() | 0x0040_0000).to_bits(),
            false => v.to_bits(),
        };
        // SAFETY: AVX-512 detected above (AVX2, FMA and F16C with it).
        let compared = unsafe {
            [
                every_element_in_every_lane::<Fp8>(&bytes, fp8, |_| false),
                every_element_in_every_lane::<Fp8Finite>(&bytes, fp8, nan_byte),
                every_element_in_every_lane::<Fp8Scaled>(&bytes, scaled, |_| false),
                every_element_in_every_lane::<Fp8ScaledFinite>(&bytes, scaled, nan_byte),
                every_element_in_every_lane::<Bf16>(
                    &patterns,
                    |b| bf16_to_f32(b).to_bits(),
                    |_| false,
                ),
                every_element_in_every_lane::<F16>(&patterns, |b| quiet(f16_to_f32(b)), |_| false),
            ]
        };
        assert_eq!(compared, [4096, 4064, 4096, 4064, 1 << 20, 1 << 20]);
    }
}
