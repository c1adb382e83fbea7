//! The AVX2 scan: eight entries per step.

use super::segment_fast;
use crate::simd::Avx2;

/// Eight entries per step: convert to f64, scale and lift with one FMA
/// (a single rounding: the error bound of the module docs only shrinks),
/// truncate (exact for the non-negative values that count), clamp to
/// `S - 1`, then turn padding into segment -1 by the sign of the entry.
/// One bit per entry is set in two 32-bit halves of the mask:
/// `vpsllvd` yields 0 for any count outside `0..32`, so the low half
/// takes segments 0–31 from `1 << seg`, the high half segments 32–63
/// from `1 << (seg - 32)`, and padding (-1) sets nothing in either.
///
/// The shifts are inline assembly on purpose: the `_mm256_sllv_epi32`
/// intrinsic is lowered through a generic shift plus an explicit
/// out-of-range select, which costs four extra instructions per eight
/// entries for a behaviour the instruction already has.
///
/// # Safety
/// `_token` proves AVX2+FMA; with `COPY`, `dst.len() == row.len()` is
/// asserted (in release builds too) before any store.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn occupancy_avx2<const COPY: bool>(
    _token: Avx2,
    row: &[i32],
    dst: &mut [i32],
    ratio: f64,
    s_last: i32,
    full: u64,
) -> u64 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    let vratio = _mm256_set1_pd(ratio);
    let vlift = _mm256_set1_pd(super::LIFT);
    let vlast = _mm256_set1_epi32(s_last);
    let one = _mm256_set1_epi32(1);
    let thirty_two = _mm256_set1_epi32(32);
    let minus_one = _mm256_set1_epi32(-1);
    let mut lo = _mm256_setzero_si256();
    let mut hi = _mm256_setzero_si256();

    // `1 << count` per 32-bit lane, 0 for a count outside 0..32. A
    // macro, not a function, so the asm sits in this AVX2 function.
    macro_rules! shift_left {
        ($one:expr, $count:expr) => {{
            let out: __m256i;
            // SAFETY: a register-only AVX2 instruction (this function
            // requires AVX2); no memory, stack or flags touched.
            unsafe {
                asm!(
                    "vpsllvd {out}, {one}, {count}",
                    out = lateout(ymm_reg) out,
                    one = in(ymm_reg) $one,
                    count = in(ymm_reg) $count,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
            out
        }};
    }

    #[inline(always)]
    fn fold(v: __m256i) -> u32 {
        // SAFETY: only called from this AVX2 function, inlined into it.
        unsafe {
            let x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let x = _mm_or_si128(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
            let x = _mm_or_si128(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
            _mm_cvtsi128_si32(x) as u32
        }
    }
    let reduce = |lo: __m256i, hi: __m256i| (fold(lo) as u64) | ((fold(hi) as u64) << 32);

    // With COPY, `dst` receives `row` as it is scanned (apply's fused
    // copy): the stores ride along with loads the scan makes anyway.
    assert!(
        !COPY || dst.len() == row.len(),
        "the fused copy needs a destination of the row's length"
    );
    let mut done = 0;
    let mut chunks = row.chunks_exact(super::portable::CHUNK);
    for chunk in chunks.by_ref() {
        for (j, v8) in chunk.chunks_exact(8).enumerate() {
            // SAFETY: `v8` is 8 in-bounds i32s; the load is unaligned.
            let v = unsafe { _mm256_loadu_si256(v8.as_ptr() as *const __m256i) };
            if COPY {
                // An assembly store, so that the copy stays fused with the
                // scan and each entry is read once for both. An intrinsic
                // (or plain) store here can be recognised as a copy and
                // hoisted into a `memcpy` per chunk ahead of the scan,
                // which reads every entry twice (docs/kernels.md has the
                // profile).
                // SAFETY: `dst` has `row`'s length (asserted above), so
                // these 8 slots (at the same offset as `v8`) are in
                // bounds; the store writes only them, no stack or flags.
                unsafe {
                    asm!(
                        "vmovdqu ymmword ptr [{p}], {v}",
                        p = in(reg) dst.as_mut_ptr().add(done + 8 * j),
                        v = in(ymm_reg) v,
                        options(nostack, preserves_flags),
                    );
                }
            }
            let a = _mm256_cvtepi32_pd(_mm256_castsi256_si128(v));
            let b = _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(v));
            let sa = _mm256_cvttpd_epi32(_mm256_fmadd_pd(a, vratio, vlift));
            let sb = _mm256_cvttpd_epi32(_mm256_fmadd_pd(b, vratio, vlift));
            let seg = _mm256_min_epi32(_mm256_set_m128i(sb, sa), vlast);
            // Padding (sign bit set) becomes segment -1.
            let seg = _mm256_castps_si256(_mm256_blendv_ps(
                _mm256_castsi256_ps(seg),
                _mm256_castsi256_ps(minus_one),
                _mm256_castsi256_ps(v),
            ));
            lo = _mm256_or_si256(lo, shift_left!(one, seg));
            hi = _mm256_or_si256(hi, shift_left!(one, _mm256_sub_epi32(seg, thirty_two)));
        }
        done += chunk.len();
        if reduce(lo, hi) & full == full {
            if COPY {
                dst[done..].copy_from_slice(&row[done..]);
            }
            return reduce(lo, hi);
        }
    }
    let mut mask = reduce(lo, hi);
    if COPY {
        dst[done..].copy_from_slice(&row[done..]);
    }
    for &x in chunks.remainder() {
        if x >= 0 {
            mask |= 1u64 << segment_fast(x, ratio, s_last);
        }
    }
    mask
}
