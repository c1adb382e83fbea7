//! Eight encoded elements to eight `f32` lanes, exactly, for the AVX2
//! kernels that read low-precision keys in place: each is the scalar
//! decode of [`super`] lane by lane (the tests below check every bit
//! pattern), so a kernel's arithmetic on decoded lanes is the arithmetic
//! on the same values given as float32.

use std::arch::x86_64::*;

/// Eight bfloat16 values at `p`: the upper halves of the `f32`s.
///
/// # Safety
/// `p` must be readable for 8 `u16`s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_bf16(p: *const u16) -> __m256 {
    // SAFETY: 16 bytes at `p` are readable (the contract); unaligned load.
    let raw = unsafe { _mm_loadu_si128(p.cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
}

/// Eight IEEE float16 values at `p` (F16C: exact, subnormals included).
///
/// # Safety
/// `p` must be readable for 8 `u16`s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_f16(p: *const u16) -> __m256 {
    // SAFETY: 16 bytes at `p` are readable (the contract); unaligned load.
    let raw = unsafe { _mm_loadu_si128(p.cast()) };
    _mm256_cvtph_ps(raw)
}

/// e4m3fn bytes (in sixteen 16-bit lanes) as float16 bits that hold the
/// value `2⁻⁸ ×` theirs: `seeeemmm` → `s0eeeemmm0000000` (a normal e4m3fn
/// is a normal float16, a subnormal a subnormal), and `0x7F`/`0xFF` → the
/// float16 NaN `0x7E00` (which widens to the scalar table's `0x7FC0_0000`).
/// The AVX-512 kernels' form; eight lanes are [`fp8x8_scaled_f16_bits`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8_as_f16_bits_256(x: __m256i) -> __m256i {
    let m = _mm256_and_si256(x, _mm256_set1_epi16(0x7F));
    let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(x, _mm256_set1_epi16(0x80)));
    let h = _mm256_or_si256(_mm256_slli_epi16::<7>(m), sign);
    let nan = _mm256_cmpeq_epi16(m, _mm256_set1_epi16(0x7F));
    _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00), nan)
}

/// [`fp8_as_f16_bits_256`] for bytes known not to be NaN (`0x7F`/`0xFF`):
/// `t = x << 7` puts the magnitude in place and the sign at bit 14, and
/// `t + (t & 0x4000)` carries the sign into bit 15 (three operations
/// instead of seven). A NaN byte would come out as ±480.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8_as_f16_bits_256_finite(x: __m256i) -> __m256i {
    let t = _mm256_slli_epi16::<7>(x);
    _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)))
}

/// Eight e4m3fn bytes (the low 64 bits of `raw`) as the float16 bits of
/// `2⁻⁸ ×` their values, for bytes known not to be NaN (`0x7F` / `0xFF`):
/// sign-extended to 16 bits, `s…s seeeemmm << 7` holds the magnitude at
/// bits 7–13 and copies of the sign at bits 14 and 15, so clearing bit 14
/// leaves `s0eeeemmm0000000` — a normal e4m3fn a normal float16, a
/// subnormal a subnormal (three operations). A NaN byte would come out as
/// `±1.875`. The kernels that read fp8 keys this way carry the `2⁸` on the
/// query instead (exact: a power of two).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8x8_scaled_f16_bits_finite(raw: __m128i) -> __m128i {
    let t = _mm_slli_epi16::<7>(_mm_cvtepi8_epi16(raw));
    _mm_and_si128(t, _mm_set1_epi16(!0x4000))
}

/// [`fp8x8_scaled_f16_bits_finite`] for any bytes: `0x7F` / `0xFF` become
/// the float16 NaN `0x7E00` (which widens to the scalar table's
/// `0x7FC0_0000`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8x8_scaled_f16_bits(raw: __m128i) -> __m128i {
    let nan8 = _mm_cmpeq_epi8(_mm_and_si128(raw, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
    let h = fp8x8_scaled_f16_bits_finite(raw);
    _mm_blendv_epi8(h, _mm_set1_epi16(0x7E00), _mm_cvtepi8_epi16(nan8))
}

/// Sixteen e4m3fn bytes as the float16 bits of `2⁻⁸ ×` their values, in
/// sixteen 16-bit lanes, for bytes known not to be NaN:
/// [`fp8x8_scaled_f16_bits_finite`] on 256-bit registers (the indexer's
/// AVX2 transpose moves these bits before it widens them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8x16_scaled_f16_bits_finite(raw: __m128i) -> __m256i {
    let t = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(raw));
    _mm256_and_si256(t, _mm256_set1_epi16(!0x4000))
}

/// [`fp8x16_scaled_f16_bits_finite`] for any bytes: `0x7F` / `0xFF` become
/// the float16 NaN `0x7E00`, as in [`fp8x8_scaled_f16_bits`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8x16_scaled_f16_bits(raw: __m128i) -> __m256i {
    let nan8 = _mm_cmpeq_epi8(_mm_and_si128(raw, _mm_set1_epi8(0x7F)), _mm_set1_epi8(0x7F));
    let h = fp8x16_scaled_f16_bits_finite(raw);
    _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00), _mm256_cvtepi8_epi16(nan8))
}

/// Eight float8 e4m3fn values at `p`, each `× 2⁻⁸` (exact: float16 holds
/// every one, F16C widens subnormals exactly); NaN bytes are NaN.
///
/// # Safety
/// `p` must be readable for 8 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_fp8_scaled(p: *const u8) -> __m256 {
    // SAFETY: 8 bytes at `p` are readable (the contract); unaligned load.
    let raw = unsafe { _mm_loadl_epi64(p.cast()) };
    _mm256_cvtph_ps(fp8x8_scaled_f16_bits(raw))
}

/// [`load8_fp8_scaled`] of bytes known not to be NaN.
///
/// # Safety
/// `p` must be readable for 8 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_fp8_scaled_finite(p: *const u8) -> __m256 {
    // SAFETY: 8 bytes at `p` are readable (the contract); unaligned load.
    let raw = unsafe { _mm_loadl_epi64(p.cast()) };
    _mm256_cvtph_ps(fp8x8_scaled_f16_bits_finite(raw))
}

/// `q × 2⁸`, exact element by element, when no element overflows (the
/// query a kernel reading [`load8_fp8_scaled`] keys multiplies: `(2⁸ q) ·
/// (2⁻⁸ k)` is the real product `q · k`, so every FMA rounds the same);
/// `None` when some `|q_i| · 2⁸` would not be finite (the caller then
/// decodes the keys unscaled).
pub(crate) fn fp8_folded_query(q: &[f32]) -> Option<Vec<f32>> {
    let folded: Vec<f32> = q.iter().map(|&x| x * 256.0).collect();
    let exact = q
        .iter()
        .zip(&folded)
        .all(|(&x, &y)| y.is_finite() || !x.is_finite());
    exact.then_some(folded)
}

/// Whether any of `bytes` is an e4m3fn NaN (`0x7F` / `0xFF`): 32 bytes an
/// operation (the portable [`super::fp8_has_nan_portable`] compiles to 16);
/// [`super::fp8_has_nan_at`] dispatches here.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8_has_nan_avx2(bytes: &[u8]) -> bool {
    let (m, nan) = (_mm256_set1_epi8(0x7F), _mm256_set1_epi8(0x7F));
    let mut runs = bytes.chunks_exact(128);
    for run in runs.by_ref() {
        let mut any = _mm256_setzero_si256();
        for v in run.chunks_exact(32) {
            // SAFETY: `v` is 32 in-bounds bytes; unaligned load.
            let x = unsafe { _mm256_loadu_si256(v.as_ptr().cast()) };
            any = _mm256_or_si256(any, _mm256_cmpeq_epi8(_mm256_and_si256(x, m), nan));
        }
        if _mm256_testz_si256(any, any) == 0 {
            return true;
        }
    }
    super::fp8_has_nan_portable(runs.remainder())
}

/// Eight float8 e4m3fn values at `p`: through float16 (F16C widens
/// subnormals exactly), then `× 2⁸`, an exact multiply of a normal float32
/// (so no float subnormal ever enters an arithmetic instruction).
///
/// # Safety
/// `p` must be readable for 8 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load8_fp8(p: *const u8) -> __m256 {
    // SAFETY: 8 bytes at `p` are readable (the contract).
    _mm256_mul_ps(unsafe { load8_fp8_scaled(p) }, _mm256_set1_ps(256.0))
}

/// `src` (e4m3fn bytes) decoded into `dst`, 16 at a time, exactly as the
/// scalar table decodes them ([`super::Encoded::decode_at`] dispatches
/// here).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_fp8_avx2(src: &[u8], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n` elements of `src` and `dst` exist.
        unsafe {
            let lo = load8_fp8(src.as_ptr().add(i));
            let hi = load8_fp8(src.as_ptr().add(i + 8));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), lo);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i + 8), hi);
        }
        i += 16;
    }
    for (o, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *o = super::fp8_e4m3fn_to_f32(b);
    }
}

/// `src` (bfloat16 bits, or float16 with `f16`) decoded into `dst`, 8 at a
/// time, exactly as the scalar decodes do ([`super::Encoded::decode_at`]
/// dispatches here).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_u16_avx2(src: &[u16], dst: &mut [f32], f16: bool) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n` elements of `src` and `dst` exist.
        unsafe {
            let p = src.as_ptr().add(i);
            let v = if f16 { load8_f16(p) } else { load8_bf16(p) };
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for (o, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *o = if f16 {
            super::f16_to_f32(b)
        } else {
            super::bf16_to_f32(b)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{bf16_to_f32, f16_to_f32, fp8_e4m3fn_to_f32, Encoded};
    use crate::simd::{Avx2, Isa};

    /// The AVX2 fp8 decode, through the key loads' dispatch.
    fn decode_fp8(token: Avx2, src: &[u8], dst: &mut [f32]) {
        Encoded::Fp8E4m3(src).decode_at(Isa::Avx2(token), 0, dst);
    }

    /// The AVX2 bfloat16 / float16 decode, through the same dispatch.
    fn decode_u16(token: Avx2, src: &[u16], dst: &mut [f32], f16: bool) {
        let enc = if f16 {
            Encoded::F16(src)
        } else {
            Encoded::Bf16(src)
        };
        enc.decode_at(Isa::Avx2(token), 0, dst);
    }

    /// The AVX2 NaN scan, through its family's dispatch.
    fn fp8_has_nan(token: Avx2, bytes: &[u8]) -> bool {
        crate::keys::fp8_has_nan_at(Isa::Avx2(token), bytes)
    }

    fn lanes(v: __m256) -> [u32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out.map(f32::to_bits)
    }

    /// Every e4m3fn byte decodes to the scalar table's bits; every bfloat16
    /// and float16 pattern to the scalar decode's bits (NaNs included: both
    /// quiet a signalling one).
    #[test]
    fn the_simd_decodes_equal_the_scalar_decodes_on_every_bit_pattern() {
        if crate::simd::avx2_for_test().is_none() {
            return;
        }
        let bytes: Vec<u8> = (0..=255u8).collect();
        let mut dst = vec![0f32; 256 + 5];
        decode_fp8(
            crate::simd::avx2_for_test().unwrap(),
            &[&bytes[..], &bytes[..5]].concat(),
            &mut dst,
        );
        for (i, v) in dst.iter().enumerate() {
            assert_eq!(
                v.to_bits(),
                fp8_e4m3fn_to_f32(bytes[i % 256]).to_bits(),
                "byte {i}"
            );
        }
        // SAFETY: AVX2, FMA and F16C detected above.
        unsafe { finite_decodes_match(&bytes) };
        use crate::keys::fp8_has_nan;
        assert!(fp8_has_nan(&[0, 1, 0xFF]) && fp8_has_nan(&[0x7F]) && !fp8_has_nan(&bytes[..127]));
        for chunk in bytes.chunks(8) {
            // SAFETY: F16C/AVX2 detected above; `chunk` holds 8 bytes.
            let got = lanes(unsafe { load8_fp8(chunk.as_ptr()) });
            let want = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| fp8_e4m3fn_to_f32(chunk[i]).to_bits());
            assert_eq!(got, want, "fp8 bytes {chunk:02x?}");
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let token = crate::simd::avx2_for_test().unwrap();
        for f16 in [false, true] {
            // 65,536 + 3: the 8-wide loop and the scalar tail.
            let src = [&all[..], &all[..3]].concat();
            let mut dst = vec![0f32; src.len()];
            decode_u16(token, &src, &mut dst, f16);
            for (&b, v) in src.iter().zip(&dst) {
                let want = if f16 { f16_to_f32(b) } else { bf16_to_f32(b) };
                assert!(
                    v.to_bits() == want.to_bits() || (want.is_nan() && v.is_nan()),
                    "{b:#06x}"
                );
            }
        }
        for chunk in all.chunks(8) {
            // SAFETY: as above, 8 u16s.
            let bf = lanes(unsafe { load8_bf16(chunk.as_ptr()) });
            // SAFETY: as above.
            let hf = lanes(unsafe { load8_f16(chunk.as_ptr()) });
            for i in 0..8 {
                assert_eq!(bf[i], bf16_to_f32(chunk[i]).to_bits());
                assert_eq!(hf[i], f16_to_f32(chunk[i]).to_bits(), "{:#06x}", chunk[i]);
            }
        }
    }

    /// The scaled fp8 loads are `2⁻⁸ ×` the scalar decode on every byte
    /// (the NaN-exact one on all 256, NaNs included; the finite one on the
    /// 254 that are not NaN), and the folded query puts the `2⁸` back
    /// exactly, refusing a query that would overflow.
    #[test]
    fn the_scaled_fp8_loads_are_the_decode_times_two_to_the_minus_eight_on_every_byte() {
        if crate::simd::avx2_for_test().is_none() {
            return;
        }
        let bytes: Vec<u8> = (0..=255u8).collect();
        for chunk in bytes.chunks(8) {
            // SAFETY: F16C/AVX2 detected above; `chunk` holds 8 bytes.
            let (got, fin) = unsafe {
                (
                    lanes(load8_fp8_scaled(chunk.as_ptr())),
                    lanes(load8_fp8_scaled_finite(chunk.as_ptr())),
                )
            };
            for i in 0..8 {
                let want = fp8_e4m3fn_to_f32(chunk[i]);
                let scaled = want / 256.0;
                assert!(want.is_nan() || scaled * 256.0 == want, "{:#04x}", chunk[i]);
                let want_bits = if want.is_nan() {
                    want.to_bits()
                } else {
                    scaled.to_bits()
                };
                assert_eq!(got[i], want_bits, "{:#04x}", chunk[i]);
                if chunk[i] & 0x7F != 0x7F {
                    assert_eq!(fin[i], want_bits, "finite {:#04x}", chunk[i]);
                }
            }
        }
        let q = [
            1.5f32,
            -3.0,
            f32::MIN_POSITIVE / 3.0,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NAN,
        ];
        let f = fp8_folded_query(&q).unwrap();
        for (x, y) in q.iter().zip(&f) {
            assert!((x.is_nan() && y.is_nan()) || (*y / 256.0).to_bits() == x.to_bits());
        }
        assert!(fp8_folded_query(&[1.0, f32::MAX / 255.0]).is_none());
    }

    /// The sixteen-lane scaled fp8 bits widen to `2⁻⁸ ×` the scalar decode
    /// on every byte, in every lane (the NaN-exact form on all 256, NaNs
    /// included; the finite form on the 254 that are not NaN).
    #[test]
    fn the_sixteen_lane_scaled_fp8_bits_are_the_decode_times_two_to_the_minus_eight() {
        if crate::simd::avx2_for_test().is_none() {
            return;
        }
        // SAFETY: AVX2, FMA and F16C detected above.
        unsafe { sixteen_lanes_match() }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn sixteen_lanes_match() {
        let bytes: Vec<u8> = (0..=255u8).collect();
        // Every byte in every lane: 16 rotations of the 256 bytes.
        for rot in 0..16 {
            let rotated: Vec<u8> = (0..256).map(|i| bytes[(i + rot) % 256]).collect();
            for chunk in rotated.chunks(16) {
                // SAFETY: 16 readable bytes.
                let raw = unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) };
                for (finite, h) in [
                    (false, fp8x16_scaled_f16_bits(raw)),
                    (true, fp8x16_scaled_f16_bits_finite(raw)),
                ] {
                    let lo = lanes(_mm256_cvtph_ps(_mm256_castsi256_si128(h)));
                    let hi = lanes(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)));
                    for (i, got) in lo.iter().chain(&hi).enumerate() {
                        let b = chunk[i];
                        let want = fp8_e4m3fn_to_f32(b);
                        if want.is_nan() {
                            assert!(finite || *got == want.to_bits(), "{b:#04x}");
                        } else {
                            assert_eq!(*got, (want / 256.0).to_bits(), "{b:#04x} {finite}");
                        }
                    }
                }
            }
        }
    }

    /// The AVX2 NaN scan finds a NaN byte wherever it sits (every offset
    /// of a 300-byte run, both NaN bytes) and no other byte.
    #[test]
    fn the_avx2_nan_scan_finds_every_nan_byte_and_nothing_else() {
        let Some(token) = crate::simd::avx2_for_test() else {
            return;
        };
        let clean: Vec<u8> = (0..300).map(|i| (i % 256) as u8 & 0x7E).collect();
        assert!(!fp8_has_nan(token, &clean));
        let all_but_nan: Vec<u8> = (0..=255u8).filter(|b| b & 0x7F != 0x7F).collect();
        assert!(!fp8_has_nan(token, &all_but_nan));
        for at in 0..clean.len() {
            for nan in [0x7F, 0xFF] {
                let mut b = clean.clone();
                b[at] = nan;
                assert!(fp8_has_nan(token, &b), "{nan:#04x} at {at}");
                assert!(fp8_has_nan(token, &b[at..]) && !fp8_has_nan(token, &b[at + 1..]));
            }
        }
    }

    /// The NaN-free fp8 decodes on every byte but the two NaNs.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn finite_decodes_match(bytes: &[u8]) {
        let lanes = |v: __m256| {
            let mut out = [0f32; 8];
            // SAFETY: `out` holds 8 floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
            out.map(f32::to_bits)
        };
        let scale = _mm256_set1_ps(256.0);
        let check = |got: [u32; 8], src: &[u8]| {
            for i in 0..8 {
                if src[i] & 0x7F != 0x7F {
                    assert_eq!(
                        got[i],
                        fp8_e4m3fn_to_f32(src[i]).to_bits(),
                        "{:#04x}",
                        src[i]
                    );
                }
            }
        };
        for chunk in bytes.chunks(16) {
            // SAFETY: 16 and 8 readable bytes.
            let (x16, x8) = unsafe {
                (
                    _mm_loadu_si128(chunk.as_ptr().cast()),
                    _mm_loadl_epi64(chunk.as_ptr().cast()),
                )
            };
            let h = fp8_as_f16_bits_256_finite(_mm256_cvtepu8_epi16(x16));
            let lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale);
            let hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)), scale);
            check(lanes(lo), &chunk[..8]);
            check(lanes(hi), &chunk[8..]);
            let h8 = fp8x8_scaled_f16_bits_finite(x8);
            check(
                lanes(_mm256_mul_ps(_mm256_cvtph_ps(h8), scale)),
                &chunk[..8],
            );
        }
    }
}
