//! The AVX2 + FMA kernel: tiles of 6 heads × 16 of the block's keys in two
//! 8-lane registers, one chain per (head, register): 12 in flight.

use super::{prefetch_line, prefetch_runs, Src, BLOCK};
use crate::keys::lanes::{Bf16, Fp8, Fp8Finite, Fp8Scaled, Fp8ScaledFinite, Load, F16, F32};
use crate::keys::x86 as decode;
use crate::keys::Encoded;
use crate::simd::Avx2;
use std::arch::x86_64::*;

const LANES: usize = 8;
/// Keys per tile (two registers).
const TILE_KEYS: usize = 2 * LANES;
const _: () = assert!(BLOCK.is_multiple_of(TILE_KEYS));

/// `out[b][a] = r[a][b]`: an 8 × 8 transpose (32-bit pairs, 64-bit pairs,
/// then 128-bit halves).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t: [__m256; 8] = std::array::from_fn(|j| match j % 2 {
        0 => _mm256_unpacklo_ps(r[j], r[j + 1]),
        _ => _mm256_unpackhi_ps(r[j - 1], r[j]),
    });
    // u[4g + c], half L: rows 4g .. 4g + 4 of column 4L + c.
    let u: [__m256; 8] = std::array::from_fn(|j| {
        let (g, c) = (j / 4 * 4, j % 4);
        let (a, b) = (t[g + c / 2], t[g + c / 2 + 2]);
        match c % 2 {
            0 => _mm256_shuffle_ps::<0x44>(a, b),
            _ => _mm256_shuffle_ps::<0xEE>(a, b),
        }
    });
    std::array::from_fn(|j| match j < 4 {
        true => _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4]),
        false => _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j]),
    })
}

/// [`super::portable::transpose`] of the decoded keys, in 8 × 8 tiles
/// (zero rows past `n`), decoding as it loads; fp8 keys with `src.scaled`
/// as `2⁻⁸ ×` their values (exact; the caller's query carries the `2⁸`).
///
/// # Safety
/// `src.enc.len() >= n * d`, `n <= BLOCK`, `kt.len() >= d * BLOCK` (the
/// token proves the CPU can run it).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn transpose(_: Avx2, src: Src<'_>, n: usize, d: usize, kt: &mut [f32]) {
    // One match per block, not per load: each format's loop is its own.
    // SAFETY: (every arm) the contract, for the format's elements.
    unsafe {
        match src.enc {
            Encoded::F32(s) => transpose_as::<F32>(s, n, d, kt),
            Encoded::Bf16(s) => transpose_16::<Bf16>(s, n, d, kt),
            Encoded::F16(s) => transpose_16::<F16>(s, n, d, kt),
            Encoded::Fp8E4m3(s) => match (src.scaled, src.finite) {
                (true, true) => transpose_16::<Fp8ScaledFinite>(s, n, d, kt),
                (true, false) => transpose_16::<Fp8Scaled>(s, n, d, kt),
                (false, true) => transpose_as::<Fp8Finite>(s, n, d, kt),
                (false, false) => transpose_as::<Fp8>(s, n, d, kt),
            },
        }
    }
}

/// [`transpose`] of `L` elements `e`.
///
/// # Safety
/// As [`transpose`], with `e.len() >= n * d`.
#[inline(always)]
unsafe fn transpose_as<L: Load>(e: &[L::E], n: usize, d: usize, kt: &mut [f32]) {
    let (p, dst) = (e.as_ptr(), kt.as_mut_ptr());
    for r0 in (0..BLOCK).step_by(LANES) {
        for c0 in (0..d).step_by(LANES) {
            // SAFETY: `r0 < BLOCK`, `c0 < d`; the rest is the contract.
            unsafe { tile8::<L>(p, n, d, r0, c0, dst) };
        }
    }
}

/// Rows `r0 .. r0 + 8`, dimensions `c0 .. min(c0 + 8, d)` of the
/// transposed block: one 8 × 8 tile of `L` elements at `p` (zero lanes
/// past `n` keys, the format's own tail load past `d`).
///
/// # Safety
/// `p` holds `n <= BLOCK` rows of `d` elements; `dst` points at `d *
/// BLOCK` writable floats; `r0 < BLOCK` a multiple of 8, `c0 < d`.
#[inline(always)]
unsafe fn tile8<L: Load>(p: *const L::E, n: usize, d: usize, r0: usize, c0: usize, dst: *mut f32) {
    let rows = n.saturating_sub(r0).min(LANES);
    let cols = LANES.min(d - c0);
    let tile: [__m256; 8] = if rows == LANES && cols == LANES {
        // SAFETY: rows `r0 .. r0 + 8 <= n`, elements `c0 .. c0 + 8 <= d`.
        std::array::from_fn(|j| unsafe { L::load8(p.add((r0 + j) * d + c0)) })
    } else {
        // A ragged edge: the format's own load of the `cols` elements
        // there (the same decode as a full tile's), zero lanes past them
        // and zero rows past `n`.
        std::array::from_fn(|j| match j < rows {
            // SAFETY: row `r0 + j < n`, elements `c0 .. c0 + cols <= d`.
            true => unsafe { L::load_tail(p.add((r0 + j) * d + c0), cols) },
            false => _mm256_setzero_ps(),
        })
    };
    let t = transpose8(tile);
    for (c, v) in t.iter().enumerate().take(cols) {
        // SAFETY: row `c0 + c < d` of `dst`, lanes `r0 .. r0 + 8 <= BLOCK`.
        unsafe { _mm256_storeu_ps(dst.add((c0 + c) * BLOCK + r0), *v) };
    }
}

/// A format whose elements are (or decode to) 16-bit patterns that widen
/// to `f32` exactly: the transpose moves sixteen of them per register
/// (half the shuffles of `f32` lanes) and widens after.
trait Bits16: Load {
    /// Elements `0 .. 16` at `p` as sixteen 16-bit lanes.
    ///
    /// # Safety
    /// `p` readable for 16 elements; AVX2, FMA and F16C available.
    unsafe fn bits16(p: *const Self::E) -> __m256i;
    /// Eight 16-bit lanes as the eight floats they stand for (the format's
    /// exact decode): float16 bits by F16C, unless the format says otherwise
    /// (bfloat16).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available.
    #[inline(always)]
    unsafe fn widen(h: __m128i) -> __m256 {
        // SAFETY: F16C (the contract): exact, subnormals included.
        unsafe { _mm256_cvtph_ps(h) }
    }
}

impl Bits16 for Bf16 {
    #[inline(always)]
    unsafe fn bits16(p: *const u16) -> __m256i {
        // SAFETY: 32 readable bytes (the contract); unaligned load.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn widen(h: __m128i) -> __m256 {
        // SAFETY: AVX2 (the contract). bfloat16 is the upper half of an f32.
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))) }
    }
}

impl Bits16 for F16 {
    #[inline(always)]
    unsafe fn bits16(p: *const u16) -> __m256i {
        // SAFETY: 32 readable bytes (the contract); unaligned load.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
}

impl Bits16 for Fp8ScaledFinite {
    #[inline(always)]
    unsafe fn bits16(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes (the contract); AVX2 for the decode.
        unsafe { decode::fp8x16_scaled_f16_bits_finite(_mm_loadu_si128(p.cast())) }
    }
}

impl Bits16 for Fp8Scaled {
    #[inline(always)]
    unsafe fn bits16(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes (the contract); AVX2 for the decode.
        unsafe { decode::fp8x16_scaled_f16_bits(_mm_loadu_si128(p.cast())) }
    }
}

/// [`transpose_as`] of a [`Bits16`] format (bfloat16, float16, fp8 read
/// as `2⁻⁸ ×` its values): 8 full rows × 16 dimensions at a time as 16-bit
/// lanes ([`tile16`]: half the shuffles, and for fp8 a third of the decode
/// operations, of 8-element loads); the rest (partial rows, the last `d %
/// 16` dimensions) in [`tile8`]s.
///
/// # Safety
/// As [`transpose_as`].
#[inline(always)]
unsafe fn transpose_16<L: Bits16>(e: &[L::E], n: usize, d: usize, kt: &mut [f32]) {
    let (p, dst) = (e.as_ptr(), kt.as_mut_ptr());
    for r0 in (0..BLOCK).step_by(LANES) {
        let mut c0 = 0;
        if n >= r0 + LANES {
            while c0 + 2 * LANES <= d {
                // SAFETY: rows `r0 .. r0 + 8 <= n`, elements `c0 .. c0 + 16 <= d`.
                unsafe { tile16::<L>(p, d, r0, c0, dst) };
                c0 += 2 * LANES;
            }
        }
        while c0 < d {
            // SAFETY: `r0 < BLOCK`, `c0 < d`; the rest is the contract.
            unsafe { tile8::<L>(p, n, d, r0, c0, dst) };
            c0 += LANES;
        }
    }
}

/// Rows `r0 .. r0 + 8`, dimensions `c0 .. c0 + 16` of the transposed
/// block at `p`: each row's 16 elements become 16 16-bit lanes
/// ([`Bits16::bits16`]), an 8 × 8 transpose of 16-bit lanes runs in each
/// 128-bit half (dimensions `c0 ..` in the low half, `c0 + 8 ..` in the
/// high one), and each half widens to one row of eight floats.
///
/// # Safety
/// Rows `r0 .. r0 + 8` of `d` elements at `p` are keys of the block, `c0 +
/// 16 <= d`, `dst` points at `d * BLOCK` writable floats, `r0 + 8 <=
/// BLOCK`; the CPU has AVX2, FMA and F16C.
#[inline(always)]
unsafe fn tile16<L: Bits16>(p: *const L::E, d: usize, r0: usize, c0: usize, dst: *mut f32) {
    // SAFETY: row `r0 + j`'s elements `c0 .. c0 + 16 <= d` (the contract).
    let x: [__m256i; 8] = std::array::from_fn(|j| unsafe { L::bits16(p.add((r0 + j) * d + c0)) });
    // t[2k]: rows 2k, 2k + 1 interleaved, elements 0–3 (of each half);
    // t[2k + 1]: elements 4–7.
    let t: [__m256i; 8] = std::array::from_fn(|j| match j % 2 {
        0 => _mm256_unpacklo_epi16(x[j], x[j + 1]),
        _ => _mm256_unpackhi_epi16(x[j - 1], x[j]),
    });
    // u[4g + c]: rows 4g .. 4g + 4, elements 2c and 2c + 1.
    let u: [__m256i; 8] = std::array::from_fn(|j| {
        let (g, c) = (j / 4 * 4, j % 4);
        let (a, b) = (t[g + c / 2], t[g + c / 2 + 2]);
        match c % 2 {
            0 => _mm256_unpacklo_epi32(a, b),
            _ => _mm256_unpackhi_epi32(a, b),
        }
    });
    for e in 0..LANES {
        // Element `e` of the 8 rows: of dimension `c0 + e` in the low
        // half, `c0 + 8 + e` in the high one.
        let (a, b) = (u[e / 2], u[4 + e / 2]);
        let v = match e % 2 {
            0 => _mm256_unpacklo_epi64(a, b),
            _ => _mm256_unpackhi_epi64(a, b),
        };
        // SAFETY: F16C and AVX2 (the contract); rows `c0 + e` and `c0 + 8
        // + e < d` of `dst`, lanes `r0 .. r0 + 8 <= BLOCK`.
        unsafe {
            let lo = L::widen(_mm256_castsi256_si128(v));
            let hi = L::widen(_mm256_extracti128_si256::<1>(v));
            _mm256_storeu_ps(dst.add((c0 + e) * BLOCK + r0), lo);
            _mm256_storeu_ps(dst.add((c0 + LANES + e) * BLOCK + r0), hi);
        }
    }
}

/// [`super::portable::weighted_relu_sums`] over the query's [`super::Tiles::Sixes`]
/// tiles: each 6-head tile against the block's two halves of 16 keys (12
/// chains), then the tile of the 1–5 heads left — 1 or 2 heads against all
/// 32 keys at once (4 or 8 chains), 3 to 5 against each half (6 to 10).
///
/// # Safety
/// `qt.len() >= d * w.len()` in the [`super::Tiles::Sixes`] layout, `kt.len() >=
/// d * BLOCK` (the token proves the CPU can run it).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_relu_sums<const RELU: bool>(
    _: Avx2,
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    acc: &mut [f32; BLOCK],
    next: &[u8],
) {
    let h = w.len();
    let sixes = h / 6 * 6;
    let rest = h - sixes;
    let halves = BLOCK / TILE_KEYS;
    let calls = sixes / 6 * halves
        + if rest > 2 {
            halves
        } else {
            usize::from(rest > 0)
        };
    let mut runs = prefetch_runs(next, calls);
    let mut pf = || runs.next().unwrap_or_default();
    for h0 in (0..sixes).step_by(6) {
        for r0 in (0..BLOCK).step_by(TILE_KEYS) {
            // SAFETY: heads `h0 .. h0 + 6 <= h` (a tile), keys `r0 .. r0 + 16 <= BLOCK`.
            unsafe { tile::<6, 2, RELU>(qt, kt, w, d, h0, r0, acc, pf()) };
        }
    }
    let h0 = sixes;
    for r0 in (0..BLOCK).step_by(TILE_KEYS) {
        // SAFETY: heads `h0 .. h0 + rest = h`, the last tile; keys `r0 ..
        // r0 + 16 <= BLOCK`.
        unsafe {
            match rest {
                3 => tile::<3, 2, RELU>(qt, kt, w, d, h0, r0, acc, pf()),
                4 => tile::<4, 2, RELU>(qt, kt, w, d, h0, r0, acc, pf()),
                5 => tile::<5, 2, RELU>(qt, kt, w, d, h0, r0, acc, pf()),
                _ => {}
            }
        }
    }
    // SAFETY: as above, the tile's `rest` heads against all `BLOCK = 32` keys.
    unsafe {
        match rest {
            1 => tile::<1, 4, RELU>(qt, kt, w, d, h0, 0, acc, pf()),
            2 => tile::<2, 4, RELU>(qt, kt, w, d, h0, 0, acc, pf()),
            _ => {}
        }
    }
}

/// Heads `h0 .. h0 + G` (one whole tile of the query's layout) against keys
/// `r0 .. r0 + 8R` of the block, folded into their sums in head order; the
/// lines of `pf` prefetched, one per dimension (the rest after).
///
/// # Safety
/// `qt.len() >= d * w.len()`, `kt.len() >= d * BLOCK`, `h0 .. h0 + G` a
/// tile of the [`super::Tiles::Sixes`] layout (so its element `i` of head `h0 + j`
/// is at `h0 · d + i · G + j`), `r0 + 8R <= BLOCK`; the CPU has AVX2 and
/// FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const G: usize, const R: usize, const RELU: bool>(
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    h0: usize,
    r0: usize,
    acc: &mut [f32; BLOCK],
    pf: &[u8],
) {
    let (qp, kp) = (qt.as_ptr(), kt.as_ptr());
    let mut a = [[_mm256_setzero_ps(); R]; G];
    for i in 0..d {
        prefetch_line(pf, i);
        // SAFETY: `i < d`: lanes `r0 .. r0 + 8R` of row `i` of `kt`, and
        // element `i` of heads `h0 .. h0 + G <= h` in `qt` (the contract).
        unsafe {
            let k: [__m256; R] =
                std::array::from_fn(|p| _mm256_loadu_ps(kp.add(i * BLOCK + r0 + p * LANES)));
            let q = qp.add(h0 * d + i * G);
            for j in 0..G {
                let qv = _mm256_set1_ps(*q.add(j));
                for p in 0..R {
                    a[j][p] = _mm256_fmadd_ps(qv, k[p], a[j][p]);
                }
            }
        }
    }
    for i in d..pf.len().div_ceil(64) {
        prefetch_line(pf, i);
    }
    let zero = _mm256_setzero_ps();
    let ap = acc[r0..r0 + R * LANES].as_mut_ptr();
    // SAFETY: `ap` points at `8R` floats.
    let mut s: [__m256; R] = std::array::from_fn(|p| unsafe { _mm256_loadu_ps(ap.add(p * LANES)) });
    for j in 0..G {
        let wv = _mm256_set1_ps(w[h0 + j]);
        for p in 0..R {
            // relu: `x <= 0 ? 0 : x` (NaN is not `<= 0`: kept); with no
            // activation the dot product as it is.
            let x = a[j][p];
            let x = match RELU {
                true => _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, zero), x),
                false => x,
            };
            s[p] = _mm256_fmadd_ps(wv, x, s[p]);
        }
    }
    for (p, v) in s.iter().enumerate() {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(ap.add(p * LANES), *v) };
    }
}
