//! The element formats engines keep index keys and queries in, decoded
//! exactly to `f32`, read in place.
//!
//! - **float32**: read as it is.
//! - **float16** (IEEE binary16): every value, subnormals, infinities and
//!   NaN included, is exactly an `f32`; decoded from the bits.
//! - **bfloat16**: the upper half of an `f32`, so decoding is a shift.
//! - **float8 e4m3fn** (the OCP "FN" variant vLLM and DeepSeek use): 1 sign,
//!   4 exponent (bias 7) and 3 mantissa bits, no infinities, `0x7F`/`0xFF`
//!   are NaN, the largest finite value is 448. Decoded by a 256-entry table
//!   built from that definition.
//!
//! A decode is exact, so scoring decoded values equals, bit for bit, scoring
//! the same values given as `f32`: a low-precision key changes nothing but
//! the bytes read. Encoded rows are never widened into a copy of the whole
//! array; a kernel decodes one row (or a chunk of rows) at a time.
//!
//! [`paged`] reads an engine's paged cache of such keys through its block
//! table; both the lightning indexer and block selection use it.
//!
//! [`Heads`] and [`CompressedBatch`] name the sizes InfLLM-v2's, NSA's and
//! MoBA's entry points read such queries and keys with.

#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes;
pub mod paged;
mod shape;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use paged::{BlockTable, PageLayout, PagedCache};
pub use shape::{CompressedBatch, Heads};

use crate::simd::{dispatch, Isa};

/// Whether any byte is an e4m3fn NaN (`0x7F` or `0xFF`): 32 bytes an
/// operation where the CPU has AVX2 ([`fp8_has_nan_at`] the best level).
/// Only the SIMD decodes ask (x86-64 only; the family is compiled off it
/// for its tests).
#[cfg(target_arch = "x86_64")]
pub(crate) fn fp8_has_nan(bytes: &[u8]) -> bool {
    fp8_has_nan_at(Isa::best(), bytes)
}

/// [`fp8_has_nan`] at `isa`: the family's one dispatch (no AVX-512
/// kernel: 32 bytes an operation is already faster than the bytes come).
#[cfg(any(target_arch = "x86_64", test))]
pub(crate) fn fp8_has_nan_at(isa: Isa, bytes: &[u8]) -> bool {
    // SAFETY (bounds): none to state; the kernel reads `bytes` through its
    // bounds-checked chunks.
    dispatch!("keys.fp8_has_nan", isa, {
        avx512 => avx2,
        avx2(_t) => x86::fp8_has_nan_avx2(bytes),
        scalar => fp8_has_nan_portable(bytes),
    })
}

/// [`fp8_has_nan`] without SIMD.
#[cfg(any(target_arch = "x86_64", test))]
pub(crate) fn fp8_has_nan_portable(bytes: &[u8]) -> bool {
    // Branch-free over 64-byte runs, so it vectorises.
    bytes
        .chunks(64)
        .any(|c| c.iter().fold(false, |acc, &b| acc | (b & 0x7F == 0x7F)))
}

/// An element format of keys or queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    F32,
    F16,
    Bf16,
    /// float8 e4m3fn, no scale of its own (a per-key scale is separate).
    Fp8E4m3,
}

impl Format {
    /// The name NumPy / ml_dtypes give the dtype.
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "float32",
            Format::F16 => "float16",
            Format::Bf16 => "bfloat16",
            Format::Fp8E4m3 => "float8_e4m3fn",
        }
    }

    /// The format of that name (as [`Format::name`] spells it).
    pub fn from_name(name: &str) -> Option<Format> {
        [Format::F32, Format::F16, Format::Bf16, Format::Fp8E4m3]
            .into_iter()
            .find(|f| f.name() == name)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::Bf16 => 2,
            Format::Fp8E4m3 => 1,
        }
    }
}

/// A row-major array of encoded elements, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum Encoded<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
    Fp8E4m3(&'a [u8]),
}

/// An owned copy of [`Encoded`] values (see [`Encoded::abs`]).
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedEncoded {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Bf16(Vec<u16>),
    Fp8E4m3(Vec<u8>),
}

impl OwnedEncoded {
    /// The values, borrowed in their format.
    pub fn encoded(&self) -> Encoded<'_> {
        match self {
            OwnedEncoded::F32(v) => Encoded::F32(v),
            OwnedEncoded::F16(v) => Encoded::F16(v),
            OwnedEncoded::Bf16(v) => Encoded::Bf16(v),
            OwnedEncoded::Fp8E4m3(v) => Encoded::Fp8E4m3(v),
        }
    }
}

impl<'a> Encoded<'a> {
    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            Encoded::F32(s) => s.len(),
            Encoded::F16(s) | Encoded::Bf16(s) => s.len(),
            Encoded::Fp8E4m3(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value's absolute value, in the same format: the sign bit
    /// cleared, which is exact in each (a NaN stays a NaN).
    pub fn abs(&self) -> OwnedEncoded {
        match self {
            Encoded::F32(s) => OwnedEncoded::F32(s.iter().map(|x| x.abs()).collect()),
            Encoded::F16(s) => OwnedEncoded::F16(s.iter().map(|x| x & 0x7FFF).collect()),
            Encoded::Bf16(s) => OwnedEncoded::Bf16(s.iter().map(|x| x & 0x7FFF).collect()),
            Encoded::Fp8E4m3(s) => OwnedEncoded::Fp8E4m3(s.iter().map(|x| x & 0x7F).collect()),
        }
    }

    pub fn format(&self) -> Format {
        match self {
            Encoded::F32(_) => Format::F32,
            Encoded::F16(_) => Format::F16,
            Encoded::Bf16(_) => Format::Bf16,
            Encoded::Fp8E4m3(_) => Format::Fp8E4m3,
        }
    }

    /// Elements `start .. end`, as an array of the same format.
    ///
    /// # Panics
    /// If the range is out of bounds (callers check shapes first).
    pub fn slice(&self, start: usize, end: usize) -> Encoded<'a> {
        match *self {
            Encoded::F32(s) => Encoded::F32(&s[start..end]),
            Encoded::F16(s) => Encoded::F16(&s[start..end]),
            Encoded::Bf16(s) => Encoded::Bf16(&s[start..end]),
            Encoded::Fp8E4m3(s) => Encoded::Fp8E4m3(&s[start..end]),
        }
    }

    /// The bytes of elements `start .. start + len`, clipped to the end (an
    /// empty slice past it): what a kernel prefetches ahead.
    pub fn bytes(&self, start: usize, len: usize) -> &'a [u8] {
        let n = self.len();
        let (a, b) = (start.min(n), start.saturating_add(len).min(n));
        match *self {
            Encoded::F32(s) => bytemuck::cast_slice(&s[a..b]),
            Encoded::F16(s) | Encoded::Bf16(s) => bytemuck::cast_slice(&s[a..b]),
            Encoded::Fp8E4m3(s) => &s[a..b],
        }
    }

    /// Decodes elements `start .. start + out.len()` into `out`.
    ///
    /// # Panics
    /// If the range is past the end (callers check shapes first).
    pub fn decode(&self, start: usize, out: &mut [f32]) {
        self.decode_at(Isa::best(), start, out)
    }

    /// [`Encoded::decode`] at `isa`: the key loads' one dispatch (no
    /// AVX-512 kernel: the AVX2 one runs there).
    pub(crate) fn decode_at(&self, isa: Isa, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        if let Encoded::F32(s) = self {
            out.copy_from_slice(&s[start..end]);
            return;
        }
        // SAFETY (bounds): none to state; the kernels read and write the
        // (bounds-checked) slices they are handed, up to the shorter.
        dispatch!("keys.decode", isa, {
            avx512 => avx2,
            avx2(_t) => match *self {
                Encoded::F32(s) => out.copy_from_slice(&s[start..end]),
                Encoded::F16(s) => x86::decode_u16_avx2(&s[start..end], out, true),
                Encoded::Bf16(s) => x86::decode_u16_avx2(&s[start..end], out, false),
                Encoded::Fp8E4m3(s) => x86::decode_fp8_avx2(&s[start..end], out),
            },
            scalar => self.decode_portable(start, out),
        })
    }

    /// [`Encoded::decode`] without SIMD.
    fn decode_portable(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Encoded::F32(s) => out.copy_from_slice(&s[start..end]),
            Encoded::F16(s) | Encoded::Bf16(s) => {
                let f16 = matches!(self, Encoded::F16(_));
                let dec = if f16 { f16_to_f32 } else { bf16_to_f32 };
                for (o, &b) in out.iter_mut().zip(&s[start..end]) {
                    *o = dec(b);
                }
            }
            Encoded::Fp8E4m3(s) => {
                let table = fp8_table();
                for (o, &b) in out.iter_mut().zip(&s[start..end]) {
                    *o = table[b as usize];
                }
            }
        }
    }
}

/// Hints the cache to fetch one key's `bytes` for a read a few keys later
/// (the AMX screen's re-score, whose keys lie far apart); nothing where the
/// kernels do not prefetch (off x86-64).
#[inline]
pub(crate) fn prefetch_key(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch(bytes, 0, bytes.len(), CacheLevel::L1);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The cache level a prefetch fills (not an instruction-set level: that is
/// [`crate::simd::Level`]). The SIMD kernels prefetch, so x86-64 only. Each
/// site's level is the one measured faster there; how far ahead a site
/// reads does not decide it alone (NSA's staged tiles ask for a 64 KiB
/// batch ahead with [`CacheLevel::L1`], past a 32 KiB L1, and ran faster on
/// AMD Zen 4 than with [`CacheLevel::L2`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CacheLevel {
    /// `prefetcht0`: every cache level, the first-level data cache
    /// included.
    L1,
    /// `prefetcht1`: the second level and beyond, not the first (which
    /// then keeps the lines being read).
    L2,
}

/// Hints the cache to fetch bytes `from .. to` of `bytes`, clipped to them:
/// one prefetch per 64-byte line. Keys streamed from memory and used once
/// are fetched this way ahead of the kernel (the hardware prefetcher loses
/// the stream at every page of a paged cache, and does not run far enough
/// ahead for float32 keys). Addresses outside `bytes` are never formed.
/// Only x86-64 builds prefetch (elsewhere the kernels leave it to the
/// hardware), so this exists on x86-64 only.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8], from: usize, to: usize, level: CacheLevel) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    let ptr = bytes.as_ptr() as *const i8;
    let end = to.min(bytes.len());
    let mut at = from;
    while at < end {
        // SAFETY: `at < end <= bytes.len()`: within `bytes`; a prefetch
        // reads nothing architecturally.
        unsafe {
            match level {
                CacheLevel::L1 => _mm_prefetch::<_MM_HINT_T0>(ptr.add(at)),
                CacheLevel::L2 => _mm_prefetch::<_MM_HINT_T1>(ptr.add(at)),
            }
        };
        at += 64;
    }
}

/// Little-endian bfloat16 bytes (two per element) decoded into `out`.
pub(crate) fn decode_bf16(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Little-endian float16 bytes (two per element) decoded into `out`.
pub(crate) fn decode_f16(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// bfloat16 bits to `f32`: the upper half of the `f32`'s bits.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// IEEE binary16 bits to `f32`, exactly (subnormals normalised, infinities
/// kept; a NaN keeps its payload and is quieted, as F16C converts it).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits & 0x8000) as u32) << 16;
    let exp = ((bits >> 10) & 0x1F) as u32;
    let man = (bits & 0x3FF) as u32;
    let magnitude = match (exp, man) {
        (0, 0) => 0,
        // Subnormal: man · 2⁻²⁴, exact in f32.
        (0, m) => (m as f32 * f32::from_bits(0x3380_0000)).to_bits(),
        (0x1F, 0) => 0x7F80_0000,
        // NaN: the payload widened, quieted (as F16C's conversion does, so
        // every level gives the same bits).
        (0x1F, m) => 0x7FC0_0000 | (m << 13),
        (e, m) => ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// float8 e4m3fn bits to `f32`, from the format's definition.
pub fn fp8_e4m3fn_to_f32(bits: u8) -> f32 {
    let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((bits >> 3) & 0xF) as i32;
    let man = (bits & 0x7) as f32;
    if exp == 0xF && bits & 0x7 == 0x7 {
        return f32::NAN;
    }
    if exp == 0 {
        // Subnormal: man/8 · 2⁻⁶ (exact: powers of two and small integers).
        return sign * man * (1.0 / 512.0);
    }
    sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
}

/// The 256 e4m3fn values as `f32` bits, computed at compile time from the
/// format's fields (a constant, so no lazy initialisation: nothing a forked
/// child could find half-done).
const FP8_TABLE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 0;
    while b < 256 {
        let sign = ((b as u32) & 0x80) << 24;
        let exp = ((b >> 3) & 0xF) as u32;
        let man = (b & 0x7) as u32;
        let bits = if exp == 0xF && man == 0x7 {
            0x7FC0_0000 // NaN, as `f32::NAN`
        } else if exp == 0 && man == 0 {
            sign
        } else if exp == 0 {
            // Subnormal man/8 · 2⁻⁶: normalise the mantissa's leading bit p.
            let p = 31 - man.leading_zeros(); // 0, 1 or 2
            let e = 127 - 9 + p;
            sign | (e << 23) | ((man << (23 - p)) & 0x7F_FFFF)
        } else {
            sign | ((exp + 127 - 7) << 23) | (man << 20)
        };
        t[b] = f32::from_bits(bits);
        b += 1;
    }
    t
};

fn fp8_table() -> &'static [f32; 256] {
    &FP8_TABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every binary16 value decodes to the f32 Rust's own `as` conversion of
    /// its f64 value gives (computed independently from the definition).
    #[test]
    fn every_float16_decodes_exactly() {
        for bits in 0..=u16::MAX {
            let sign = if bits & 0x8000 != 0 { -1.0f64 } else { 1.0 };
            let exp = ((bits >> 10) & 0x1F) as i32;
            let man = (bits & 0x3FF) as f64;
            let want = match exp {
                0 => sign * man * 2f64.powi(-24),
                0x1F if man == 0.0 => sign * f64::INFINITY,
                0x1F => f64::NAN,
                e => sign * (1.0 + man / 1024.0) * 2f64.powi(e - 15),
            };
            let got = f16_to_f32(bits);
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(got.to_bits(), (want as f32).to_bits(), "{bits:#06x}");
            }
        }
    }

    /// The e4m3fn table: the format's landmarks.
    #[test]
    fn float8_e4m3fn_has_no_infinities_and_tops_out_at_448() {
        assert_eq!(fp8_e4m3fn_to_f32(0x00), 0.0);
        assert_eq!(fp8_e4m3fn_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(fp8_e4m3fn_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3fn_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3fn_to_f32(0xFE), -448.0);
        assert_eq!(fp8_e4m3fn_to_f32(0x01), 2f32.powi(-9));
        assert!(fp8_e4m3fn_to_f32(0x7F).is_nan() && fp8_e4m3fn_to_f32(0xFF).is_nan());
        let finite = (0..=255u8)
            .filter(|&b| fp8_e4m3fn_to_f32(b).is_finite())
            .count();
        assert_eq!(finite, 254);
        for b in 0..=255u8 {
            assert_eq!(
                fp8_table()[b as usize].to_bits(),
                fp8_e4m3fn_to_f32(b).to_bits()
            );
        }
    }

    #[test]
    fn bfloat16_is_the_upper_half_of_a_float32() {
        for x in [0.0f32, -0.0, 1.0, -2.5, 3.0e38, f32::INFINITY, 1.0e-40] {
            let bits = (x.to_bits() >> 16) as u16;
            assert_eq!(bf16_to_f32(bits).to_bits(), bits as u32 * 65536);
        }
    }
}
