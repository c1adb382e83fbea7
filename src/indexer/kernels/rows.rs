//! A block of keys as bfloat16 rows: fp8 e4m3 keys decoded exactly, bfloat16
//! keys read in place, with the block's largest magnitude and the exponent
//! summary the pair level admits on ([`super::pairs::admits`]). The AMX
//! screen's `A` operand ([`super::amx`]) and the pair level's source
//! ([`super::pairs::transpose_rows`]).
//!
//! Every fp8 e4m3 value is exactly a bfloat16 (3 mantissa bits in 7, its
//! exponents −9 ..= 8 inside bfloat16's normal range, the subnormals too):
//! the rows are the keys' values, not roundings of them. A NaN or an
//! infinity refuses the block (the callers score it as float32), so the
//! largest magnitude is finite.

use super::BLOCK;
use crate::keys::Encoded;

/// The exponent summary of every block of fp8 e4m3 keys: their values are
/// never subnormal bfloat16s and their nonzero exponents are at least −9,
/// so −9 is at or below any block's own (it admits no query the block's
/// own summary would not).
pub(super) const FP8_SUMMARY: Option<i32> = Some(-9);

/// A block of keys as bfloat16 rows: `rows[r · d + i]` key `r`'s
/// element `i` as a bfloat16 (`[BLOCK, d]`, zero past the `n` keys given),
/// decoded exactly from fp8 e4m3 or copied from bfloat16; `None` for other
/// formats and for blocks with a NaN or infinity.
/// Else the block's largest `|k|` and the exponent summary
/// [`super::pairs::admits`] reads (`None` inside: a subnormal).
pub(super) fn block_rows<'r>(
    enc: Encoded<'r>,
    n: usize,
    d: usize,
    rows: &'r mut Vec<u16>,
) -> Option<(&'r [u16], f32, Option<i32>)> {
    let (rows, kmax, summary) = match enc {
        // A whole block of bfloat16 keys is read in place.
        Encoded::Bf16(k) if n == BLOCK => {
            let (kmax, summary) = scan(&k[..n * d]);
            (&k[..n * d], kmax, summary)
        }
        Encoded::Bf16(k) => {
            rows.resize(BLOCK * d, 0);
            let (head, tail) = rows.split_at_mut(n * d);
            head.copy_from_slice(&k[..n * d]);
            tail.fill(0);
            let (kmax, summary) = scan(rows);
            (&rows[..], kmax, summary)
        }
        Encoded::Fp8E4m3(k) => {
            rows.resize(BLOCK * d, 0);
            let (head, tail) = rows.split_at_mut(n * d);
            tail.fill(0);
            let kmax = decode_fp8(&k[..n * d], head)?;
            (&rows[..], kmax, FP8_SUMMARY)
        }
        _ => return None,
    };
    (kmax < 0x7F80).then(|| (rows, f32::from_bits(u32::from(kmax) << 16), summary))
}

/// fp8 e4m3 codes as bfloat16 bits, exactly, and the largest `|x|`'s bits;
/// `None` (the rest unwritten) if a code is NaN.
fn decode_fp8(src: &[u8], dst: &mut [u16]) -> Option<u16> {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = crate::simd::avx512_token() {
        if x86::has_vbmi() {
            // SAFETY: the token proves AVX-512 F and BW (and AVX2),
            // detection AVX512-VBMI.
            return unsafe { x86::decode_fp8_vbmi(t, src, dst) };
        }
        // SAFETY: the token proves AVX-512 F and BW (and AVX2).
        return unsafe { x86::decode_fp8(t, src, dst) };
    }
    decode_fp8_tail(src, dst)
}

/// [`decode_fp8`] a code at a time.
fn decode_fp8_tail(src: &[u8], dst: &mut [u16]) -> Option<u16> {
    let mut kmax = 0u16;
    for (o, &b) in dst.iter_mut().zip(src) {
        if b & 0x7F == 0x7F {
            return None;
        }
        *o = fp8_bf16(b);
        kmax = kmax.max(*o & 0x7FFF);
    }
    Some(kmax)
}

/// One fp8 e4m3 code (not NaN) as bfloat16 bits: `2^(e − 7) (1 + m/8)` has
/// the bfloat16 exponent field `e + 120` and mantissa `m << 4`, so a normal
/// code's bits are `(code & 0x7F) << 4` plus `120 << 7`; a subnormal is
/// `m · 2⁻⁹` ([`FP8_SUBNORMAL`]).
#[inline(always)]
fn fp8_bf16(b: u8) -> u16 {
    let mag = u16::from(b & 0x7F);
    let sign = u16::from(b & 0x80) << 8;
    sign | if mag < 8 {
        FP8_SUBNORMAL[mag as usize]
    } else {
        (mag << 4) + (120 << 7)
    }
}

/// `m · 2⁻⁹` as bfloat16 bits for `m < 8` (fp8 e4m3's zero and subnormals),
/// then zeros to 32 entries (the AVX-512 table's width).
const FP8_SUBNORMAL: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut m = 1;
    while m < 8 {
        // `m · 2⁻⁹ = 2^(p − 9) (m / 2^p)` for `2^p ≤ m < 2^(p+1)`.
        let p = 7 - (m as u8).leading_zeros() as i32;
        let frac = ((m << (7 - p)) & 0x7F) as u16; // the mantissa bits below the leading one
        t[m] = (((p - 9 + 127) as u16) << 7) | frac;
        m += 1;
    }
    t
};

/// The bfloat16 bits of every fp8 e4m3 magnitude `0 ..= 0x7E` (and of
/// `0x7F`, NaN, the arithmetic's `0x43F0`), split into low and high bytes:
/// the byte tables of the VBMI decode.
#[cfg(target_arch = "x86_64")]
const FP8_BYTES: [[u8; 128]; 2] = {
    let mut t = [[0u8; 128]; 2];
    let mut m = 0;
    while m < 128 {
        let bits = match m < 8 {
            true => FP8_SUBNORMAL[m],
            false => ((m as u16) << 4) + (120 << 7),
        };
        t[0][m] = bits as u8;
        t[1][m] = (bits >> 8) as u8;
        m += 1;
    }
    t
};

/// The largest `|x|` of bfloat16 bits `rows` (`& 0x7FFF`: NaN above infinity)
/// and the exponent summary: `None` with a subnormal, else the smallest
/// exponent of the nonzero finite values (`i32::MAX / 4` with none).
fn scan(rows: &[u16]) -> (u16, Option<i32>) {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = crate::simd::avx512_token() {
        // SAFETY: the token proves AVX-512 F and BW (and AVX2).
        return unsafe { x86::scan(t, rows) };
    }
    scan_body(rows)
}

/// [`scan`] a value at a time: the largest magnitude and, in the same pass,
/// the summary
/// [`super::pairs::min_exponent`] gives the values as float32 bits (its rule
/// on bfloat16 bits, which are always bfloat16-exact).
fn scan_body(rows: &[u16]) -> (u16, Option<i32>) {
    let (mut kmax, mut sub, mut emin) = (0u16, 0u16, 0xFFu16);
    for &x in rows {
        let m = x & 0x7FFF;
        let e = m >> 7;
        kmax = kmax.max(m);
        sub |= u16::from(e == 0 && m != 0);
        emin = emin.min(if e == 0 { 0xFF } else { e });
    }
    let summary = match (sub, emin) {
        (0, 0xFF) => Some(i32::MAX / 4),
        (0, e) => Some(i32::from(e) - 127),
        _ => None,
    };
    (kmax, summary)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{FP8_BYTES, FP8_SUBNORMAL};
    use crate::simd::Avx512;
    use std::arch::x86_64::*;

    /// [`super::decode_fp8`] in AVX-512: 32 codes a step, each magnitude by
    /// the normal codes' arithmetic, the subnormal ones replaced from a
    /// 32-entry table (one masked permute), the sign merged back in one
    /// ternary-logic op. A NaN magnitude (`0x7F`) comes out of the
    /// arithmetic as `NAN_BITS` (`0x43F0`), above every other code's (448 is
    /// `0x43E0`): the codes hold a NaN exactly when their largest magnitude
    /// is that.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) fn decode_fp8(_: Avx512, src: &[u8], dst: &mut [u16]) -> Option<u16> {
        /// `(0x7F << 4) + (120 << 7)`: what a NaN magnitude decodes to.
        const NAN_BITS: u16 = 0x43F0;
        assert!(dst.len() >= src.len());
        // SAFETY: the table holds 32 u16 (an unaligned load).
        let table = unsafe { _mm512_loadu_si512(FP8_SUBNORMAL.as_ptr().cast()) };
        let (mask, bias, eight) = (
            _mm512_set1_epi16(0x7F),
            _mm512_set1_epi16(120 << 7),
            _mm512_set1_epi16(8),
        );
        let sign = _mm512_set1_epi16(i16::MIN);
        let mut kmax = _mm512_setzero_si512();
        let whole = src.len() / 32 * 32;
        for i in (0..whole).step_by(32) {
            // SAFETY: `i + 32 <= src.len() <= dst.len()`: 32 bytes read, 32
            // u16 written (unaligned).
            unsafe {
                let x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(src.as_ptr().add(i).cast()));
                let mag = _mm512_and_si512(x, mask);
                let normal = _mm512_add_epi16(_mm512_slli_epi16::<4>(mag), bias);
                let small = _mm512_cmplt_epu16_mask(mag, eight);
                let m = _mm512_mask_permutexvar_epi16(normal, small, mag, table);
                kmax = _mm512_max_epu16(kmax, m);
                // `(sign & (x << 8)) | m`: the code's bit 7 as bit 15.
                let out = _mm512_ternarylogic_epi32::<0xEA>(sign, _mm512_slli_epi16::<8>(x), m);
                _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), out);
            }
        }
        let mut lanes = [0u16; 32];
        // SAFETY: `lanes` holds 32 u16 (an unaligned store).
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), kmax) };
        let kmax = lanes.into_iter().max().unwrap_or(0);
        if kmax == NAN_BITS {
            return None;
        }
        let tail = super::decode_fp8_tail(&src[whole..], &mut dst[whole..])?;
        Some(kmax.max(tail))
    }

    /// Whether this CPU has AVX512-VBMI (byte permutes: Zen 4, Intel Ice
    /// Lake and later; not Skylake-X nor Cooper Lake).
    pub(super) fn has_vbmi() -> bool {
        static VBMI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *VBMI.get_or_init(|| std::arch::is_x86_feature_detected!("avx512vbmi"))
    }

    /// [`super::decode_fp8`] by byte tables, 64 codes a step: each code's
    /// low and high result bytes looked up by its seven magnitude bits (two
    /// 128-entry two-register permutes, [`FP8_BYTES`]), the sign merged into
    /// the high byte, the bytes interleaved into bfloat16s. The codes'
    /// quadwords are put in the order the interleave (within 128-bit lanes)
    /// needs first. The largest magnitude from the codes: their low seven
    /// bits order as the values do, NaN (`0x7F`) the largest.
    ///
    /// # Safety
    /// The CPU has AVX512-VBMI (the token proves the rest).
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2")]
    pub(super) unsafe fn decode_fp8_vbmi(_: Avx512, src: &[u8], dst: &mut [u16]) -> Option<u16> {
        assert!(dst.len() >= src.len());
        // SAFETY: each table row holds 128 bytes: two 64-byte loads.
        let [(lo0, lo1), (hi0, hi1)] = FP8_BYTES.map(|t| unsafe {
            (
                _mm512_loadu_si512(t.as_ptr().cast()),
                _mm512_loadu_si512(t.as_ptr().add(64).cast()),
            )
        });
        // Lane `L` of the codes: quadwords `L` and `4 + L` (codes `8L ..`
        // and `32 + 8L ..`), so the interleaves give codes 0-31, 32-63.
        let order = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0);
        let (sign, magnitude) = (_mm512_set1_epi8(i8::MIN), _mm512_set1_epi8(0x7F));
        let mut largest = _mm512_setzero_si512();
        let whole = src.len() / 64 * 64;
        for i in (0..whole).step_by(64) {
            // SAFETY: `i + 64 <= src.len() <= dst.len()`: 64 bytes read, 64
            // u16 written (unaligned).
            unsafe {
                let codes = _mm512_loadu_si512(src.as_ptr().add(i).cast());
                largest = _mm512_max_epu8(largest, _mm512_and_si512(codes, magnitude));
                let c = _mm512_permutexvar_epi64(order, codes);
                let lo = _mm512_permutex2var_epi8(lo0, c, lo1);
                // `(sign & c) | table`: the code's sign bit on the high byte.
                let hi = _mm512_ternarylogic_epi32::<0xEA>(
                    sign,
                    c,
                    _mm512_permutex2var_epi8(hi0, c, hi1),
                );
                let out = dst.as_mut_ptr().add(i);
                _mm512_storeu_si512(out.cast(), _mm512_unpacklo_epi8(lo, hi));
                _mm512_storeu_si512(out.add(32).cast(), _mm512_unpackhi_epi8(lo, hi));
            }
        }
        let mut lanes = [0u8; 64];
        // SAFETY: `lanes` holds 64 bytes (an unaligned store).
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), largest) };
        match lanes.into_iter().max().unwrap_or(0) {
            0x7F => None,
            m => {
                let tail = super::decode_fp8_tail(&src[whole..], &mut dst[whole..])?;
                Some(super::fp8_bf16(m).max(tail))
            }
        }
    }

    /// [`super::scan_body`] in AVX-512, 32 values a step: the largest
    /// magnitude, and the unsigned minimum of `|x| − 1` (zeros wrap to the
    /// top, so it is the smallest nonzero magnitude less one: below `0x7F`
    /// exactly when a value is subnormal, and its exponent field the
    /// smallest nonzero one).
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) fn scan(_: Avx512, rows: &[u16]) -> (u16, Option<i32>) {
        let (magnitude, one) = (_mm512_set1_epi16(0x7FFF), _mm512_set1_epi16(1));
        let (mut kmax, mut least) = (_mm512_setzero_si512(), _mm512_set1_epi16(-1));
        let whole = rows.len() / 32 * 32;
        for i in (0..whole).step_by(32) {
            // SAFETY: `i + 32 <= rows.len()`: 32 u16 read (unaligned).
            let x = unsafe { _mm512_loadu_si512(rows.as_ptr().add(i).cast()) };
            let m = _mm512_and_si512(x, magnitude);
            kmax = _mm512_max_epu16(kmax, m);
            least = _mm512_min_epu16(least, _mm512_sub_epi16(m, one));
        }
        let (mut a, mut b) = ([0u16; 32], [0u16; 32]);
        // SAFETY: `a` and `b` hold 32 u16 each (unaligned stores).
        unsafe {
            _mm512_storeu_si512(a.as_mut_ptr().cast(), kmax);
            _mm512_storeu_si512(b.as_mut_ptr().cast(), least);
        }
        let (mut kmax, least) = (a.into_iter().max().unwrap_or(0), b.into_iter().min());
        let mut least = least.unwrap_or(u16::MAX);
        for &x in &rows[whole..] {
            let m = x & 0x7FFF;
            least = least.min(m.wrapping_sub(1));
            kmax = kmax.max(m);
        }
        // `|x| − 1` wraps only for zeros: `least + 1` is the smallest
        // nonzero magnitude, the upper half of its float32.
        let smallest = (least != u16::MAX).then(|| u32::from(least + 1) << 16);
        (kmax, super::super::pairs::summary_of_smallest(smallest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fp8 e4m3 code but NaN decodes to the bfloat16 of its value
    /// (the crate's fp8 table), one code at a time and 32 at a time.
    #[test]
    fn fp8_codes_decode_to_their_bfloat16() {
        let codes: Vec<u8> = (0..=255u8).filter(|b| b & 0x7F != 0x7F).collect();
        let mut want = vec![0u16; codes.len()];
        let mut one = [0.0f32];
        for (w, &b) in want.iter_mut().zip(&codes) {
            Encoded::Fp8E4m3(std::slice::from_ref(&b)).decode(0, &mut one);
            assert_eq!(one[0].to_bits() & 0xFFFF, 0);
            *w = (one[0].to_bits() >> 16) as u16;
            assert_eq!(fp8_bf16(b), *w, "code {b:#04x}");
        }
        // Every decode this CPU runs: the portable one, AVX-512's, the
        // byte tables' (skipped visibly where the CPU lacks them).
        type Decode = Box<dyn Fn(&[u8], &mut [u16]) -> Option<u16>>;
        #[allow(unused_mut)]
        let mut decodes: Vec<(&str, Decode)> = vec![("tail", Box::new(decode_fp8_tail))];
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = crate::simd::avx512_for_test() {
            // SAFETY: the token proves AVX-512 F and BW.
            decodes.push((
                "avx512",
                Box::new(move |s, d| unsafe { x86::decode_fp8(t, s, d) }),
            ));
            match x86::has_vbmi() {
                // SAFETY: as above, and detection found AVX512-VBMI.
                true => decodes.push((
                    "vbmi",
                    Box::new(move |s, d| unsafe { x86::decode_fp8_vbmi(t, s, d) }),
                )),
                false => eprintln!("skipped: this CPU has no AVX512-VBMI"),
            }
        }
        for (name, decode) in &decodes {
            let mut got = vec![0u16; codes.len()];
            let kmax = decode(&codes, &mut got);
            assert_eq!(got, want, "{name}");
            assert_eq!(kmax, want.iter().map(|x| x & 0x7FFF).max(), "{name}");
            // Rotated, so the codes the tail took above go through the
            // vectors; and each length past the vectors' width.
            for by in [64, 100, 190] {
                let (mut codes_r, mut want_r) = (codes.clone(), want.clone());
                codes_r.rotate_left(by);
                want_r.rotate_left(by);
                assert_eq!(decode(&codes_r, &mut got), kmax, "{name}");
                assert_eq!(got, want_r, "{name}");
                for len in [0, 1, 63, 64, 65, 127, 128, 129] {
                    let mut part = vec![0u16; len];
                    let largest = want_r[..len].iter().map(|x| x & 0x7FFF).max();
                    let got = decode(&codes_r[..len], &mut part);
                    assert_eq!(got, largest.or(Some(0)), "{name}, length {len}");
                    assert_eq!(part, want_r[..len], "{name}, length {len}");
                }
            }
            // A NaN code anywhere, in the vector part or the tail, is refused.
            for (at, nan) in [3, 40, 100, codes.len() - 1]
                .into_iter()
                .zip([0xFF, 0x7F, 0x7F, 0xFF])
            {
                let mut with_nan = codes.clone();
                with_nan[at] = nan;
                assert_eq!(decode(&with_nan, &mut got), None, "{name}, NaN at {at}");
            }
        }
    }

    /// The vector scan gives [`scan_body`]'s magnitude and summary on rows
    /// of every exponent, with zeros, subnormals, infinities and NaN
    /// planted, and lengths with a tail past the vectors.
    #[test]
    fn the_scan_gives_the_portable_magnitude_and_summary() {
        // Without AVX-512 both sides are the body (skipped visibly).
        #[cfg(target_arch = "x86_64")]
        let _ = crate::simd::avx512_for_test();
        let mut state = 0x5CA7_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut seen = std::collections::HashSet::new();
        for case in 0..4000 {
            let len = [32 * 128, 32 * 6, 31, 1, 64 + 17][case % 5];
            let (lo, hi) = [(1u16, 254u16), (110, 130), (1, 4)][case / 5 % 3];
            let mut rows: Vec<u16> = (0..len)
                .map(|_| {
                    let x = next();
                    let e = lo + (x % u64::from(hi - lo + 1)) as u16;
                    ((x >> 20) as u16 & 0x8000) | (e << 7) | ((x >> 8) as u16 & 0x7F)
                })
                .collect();
            let planted = [
                0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x7F80, 0xFF80, 0x7FC0, 0x7F81,
            ];
            for _ in 0..next() % 4 {
                let at = (next() % len as u64) as usize;
                rows[at] = planted[(next() % planted.len() as u64) as usize];
            }
            if case % 40 == 0 {
                rows.iter_mut().for_each(|x| *x &= 0x8000);
            }
            let want = scan_body(&rows);
            assert_eq!(scan(&rows), want, "case {case}, length {len}");
            seen.insert(want.1.map(|e| e.min(1000)));
        }
        assert!(seen.contains(&None) && seen.contains(&Some(1000)) && seen.contains(&Some(-126)));
    }
}
