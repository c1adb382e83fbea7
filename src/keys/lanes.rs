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
/// fp8 keys known to hold no NaN byte (checked per chunk by the engine): a
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
        // SAFETY: the contract; 8 bytes at each of `a` and `b`.
        unsafe {
            let h = decode::fp8_as_f16_bits_256(_mm256_cvtepu8_epi16(two_halves(a, b)));
            _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0))
        }
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
        // SAFETY: the contract; 8 bytes at each of `a` and `b`.
        unsafe {
            let x = _mm256_cvtepu8_epi16(two_halves(a, b));
            let h = decode::fp8_as_f16_bits_256_finite(x);
            _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0))
        }
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
        // SAFETY: the contract (8 bytes at each; AVX-512 for the join).
        unsafe { join(Self::load8(a), Self::load8(b)) }
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
        // SAFETY: the contract (8 bytes at each; AVX-512 for the join).
        unsafe { join(Self::load8(a), Self::load8(b)) }
    }
    fn zero() -> u8 {
        0
    }
}
