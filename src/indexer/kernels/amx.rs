//! The AMX screen: a block's dot products as tile products (`TDPBF16PS`,
//! [`crate::simd::amx`]), for the exact selection to rule positions out
//! with — never a score kvselect returns.
//!
//! # What it computes
//!
//! For a block of [`BLOCK`] keys and one query, the `32 × H` dot products
//! `q_h · k_r` in tiles of 16 keys × 16 heads, 32 dimensions per
//! instruction: the block's keys as bfloat16 rows are the rows of `A` (bf16
//! keys read in place, fp8 keys decoded exactly, [`block_rows`]), the
//! query's pairs the rows of `B` ([`QueryTiles`]). Then per key the
//! weights and the ReLU folded with the heads across 16 lanes (an FMA per
//! 16 heads into each lane, then the lanes summed), `× c_t` by the caller.
//! Taken on a block only where the pair level's admission holds
//! ([`super::pairs::admits`]: every operand bfloat16-exact and no product
//! or partial sum in the flushed range, in whatever order it is summed), no
//! key is NaN or infinite, and the query's and the block's magnitudes keep
//! every partial sum — of each head's dot product, of the fold, of the
//! scaled score — below `2¹²⁰` (so no order of the sums overflows where
//! another would not: an overflow to `-inf` the ReLU turned into 0 would
//! put a screened score far outside the bound).
//!
//! # Why the bound holds
//!
//! Per instruction a product passes at most 16 steps of its chain, the sum
//! of the two chains and the add into `C`; later instructions add to `C`
//! `d / 32 − 1` more times: at most `17 + d / 32 ≤ d − 14` roundings for
//! `d` a multiple of 32 (the only `d` the screen takes), against the
//! canonical chain's `d`. A head's term passes at most `⌈H / 16⌉ + 4`
//! roundings in the fold (against the canonical fold's `H`: at most 4
//! more, when `H < 5`, within the dot products' slack of 14), and the
//! scale one. So each screened score obeys the
//! bound the exact selection already uses (`super::super::exact`,
//! `γ_{d+H+2}` of `|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`; no flush can act under
//! the admission): it lies within `E_t` of the real score, as the float32
//! kernels' does. What the selection does with it is
//! `super::super::screen`'s: every position the screen cannot rule out is
//! scored again by the float32 kernels, so the rows and every reported
//! score are theirs, bit for bit.
//!
//! What would break it: a `d` that is not a multiple of 32 (a partial tile
//! would read past the rows), a tile shape with more than 16 pairs per row
//! (longer chains than the count above), or admitting a block on the keys'
//! exponents alone.

use super::{relu, slot, Query, BLOCK};
use crate::keys::Encoded;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use crate::simd::amx::Amx;
use crate::simd::amx::{tile_model, TILE};

/// Partial sums above this could overflow float32 in some order of the
/// sums and not in another: such a block is not screened.
const MAX_MAGNITUDE: f64 = 1.329_227_995_784_916e36; // 2¹²⁰

/// How the screen's tile products are run: by the instruction, or (in
/// tests, on every CPU) by its software model.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AmxRun {
    /// [`tile_model`], tile by tile: the tests' stand-in for the
    /// instruction, running the same layout logic.
    #[cfg_attr(not(test), allow(dead_code))]
    Model,
    /// `TDPBF16PS`, with the token that proves the CPU runs it as the model.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    Hw(Amx),
}

impl AmxRun {
    /// The screen for a call at `level` with `d` dimensions: the
    /// instruction where the process may use it ([`crate::simd::amx_screen`])
    /// and the level is AVX-512's (the fold's), `d` a multiple of 32.
    pub(crate) fn of(level: crate::simd::Isa, d: usize) -> Option<AmxRun> {
        if d == 0 || !d.is_multiple_of(2 * TILE) {
            return None;
        }
        #[cfg(test)]
        if let Some(forced) = tests_force::get() {
            return forced;
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let crate::simd::Isa::Avx512(_) | crate::simd::Isa::Avx512Bf16(_) = level {
            return crate::simd::amx_screen().map(AmxRun::Hw);
        }
        let _ = level;
        None
    }
}

/// A query as the tiles' `B` operand: `qb[k · hp + n]` the pair `(q_n[2k],
/// q_n[2k + 1])` (element `2k` the low half, as the keys' bfloat16 rows
/// hold it), the heads past `H` zero up to `hp`, a multiple of 16; the
/// weights zero-padded likewise; `a = Σ_h |w_h| Σ_i |q_hi|` (bounding the
/// fold's partial sums over `max |k|`) and `qmax = max_h Σ_i |q_hi|` (one
/// head's dot product's).
pub(super) struct QueryTiles {
    pub qb: Vec<u32>,
    /// Read by the instruction's fold only.
    #[cfg_attr(
        not(all(target_arch = "x86_64", target_os = "linux")),
        allow(dead_code)
    )]
    pub wp: Vec<f32>,
    pub hp: usize,
    pub a: f64,
    pub qmax: f64,
}

impl QueryTiles {
    /// The tiles of `q` (`d` even).
    pub fn new(q: &Query) -> Self {
        let (h, d) = (q.h, q.d);
        let hp = h.div_ceil(TILE) * TILE;
        let mut qb = vec![0u32; d / 2 * hp];
        let mut wp = vec![0.0f32; hp];
        let (mut a, mut qmax) = (0.0f64, 0.0f64);
        for head in 0..h {
            let (base, stride) = slot(q.tiles, h, d, head);
            let x = |i: usize| q.qt[base + i * stride];
            for k in 0..d / 2 {
                qb[k * hp + head] = super::pairs::pack(x(2 * k + 1), x(2 * k));
            }
            let s: f64 = (0..d).map(|i| f64::from(x(i).abs())).sum();
            a += f64::from(q.w[head].abs()) * s;
            qmax = qmax.max(s);
            wp[head] = q.w[head];
        }
        QueryTiles {
            qb,
            wp,
            hp,
            a,
            qmax,
        }
    }

    /// Whether a block whose largest `|k|` is `kmax` and whose bound term
    /// is `g` keeps every partial sum of this query's scores far from
    /// overflow: each head's dot product (`qmax · kmax`: a small weight
    /// does not shrink it), the fold (`a · kmax`) and the scaled score (`a ·
    /// g`). (NaN anywhere fails every comparison.)
    pub fn bounded(&self, kmax: f64, g: f32) -> bool {
        self.qmax * kmax < MAX_MAGNITUDE
            && self.a * kmax < MAX_MAGNITUDE
            && self.a * f64::from(g) < MAX_MAGNITUDE
    }
}

/// A block of keys as the tiles' `A` operand: `rows[r · d + i]` key `r`'s
/// element `i` as a bfloat16 (`[BLOCK, d]`, zero past the `n` keys given),
/// decoded exactly from fp8 e4m3 or copied from bfloat16; `None` for other
/// formats and for blocks the screen does not take (a NaN or infinity).
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
        // fp8 e4m3 values are never subnormal bfloat16s, and their nonzero
        // exponents are at least −9: the summary −9 is below the block's
        // own (so it admits no query the block's would not).
        Encoded::Fp8E4m3(k) => {
            rows.resize(BLOCK * d, 0);
            let (head, tail) = rows.split_at_mut(n * d);
            tail.fill(0);
            let kmax = decode_fp8(&k[..n * d], head)?;
            (&rows[..], kmax, Some(-9))
        }
        _ => return None,
    };
    (kmax < 0x7F80).then(|| (rows, f32::from_bits(u32::from(kmax) << 16), summary))
}

/// fp8 e4m3 codes as bfloat16 bits, exactly, and the largest `|x|`'s bits;
/// `None` (the rest unwritten) if a code is NaN.
fn decode_fp8(src: &[u8], dst: &mut [u16]) -> Option<u16> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let Some(t) = crate::simd::avx512_token() {
        // SAFETY: the token proves AVX-512 F and BW.
        return unsafe { hw::decode_fp8(t, src, dst) };
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

/// The largest `|x|` of bfloat16 bits `rows` (`& 0x7FFF`: NaN above infinity)
/// and the exponent summary: `None` with a subnormal, else the smallest
/// exponent of the nonzero finite values (`i32::MAX / 4` with none).
fn scan(rows: &[u16]) -> (u16, Option<i32>) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let Some(t) = crate::simd::avx512_token() {
        // SAFETY: the token proves AVX-512 F and BW.
        return unsafe { hw::scan(t, rows) };
    }
    scan_body(rows)
}

/// [`scan`]'s body, branch-free over the values (so a compiler vectorises
/// it): the largest magnitude and, in the same pass, the summary
/// [`super::pairs::min_exponent`] gives the values as float32 bits (its rule
/// on bfloat16 bits, which are always bfloat16-exact).
#[inline(always)]
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

/// The block's scores before the scale, `Σ_h w_h relu(q_h · k_r)` for every
/// key `r`, the dot products by the tiles (`run`) of `rows` ([`block_rows`],
/// a whole block), into `acc`; `dots` is scratch. The model folds the
/// heads in order, the hardware across lanes: both within the bound.
pub(super) fn sums(
    run: AmxRun,
    q: &Query,
    tiles: &QueryTiles,
    rows: &[u16],
    dots: &mut Vec<f32>,
    acc: &mut [f32; BLOCK],
) {
    let (d, hp) = (q.d, tiles.hp);
    assert!(d.is_multiple_of(2 * TILE) && rows.len() == BLOCK * d && tiles.qb.len() == d / 2 * hp);
    dots.resize(BLOCK * hp, 0.0);
    match run {
        AmxRun::Model => {
            model_dots(&tiles.qb, hp, d, rows, dots);
            fold(q, hp, dots, acc);
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        AmxRun::Hw(t) => {
            // SAFETY: the caller configured this thread's tiles (`begin`);
            // the slices' lengths are asserted above; the token proves
            // AVX-512 F for the fold.
            unsafe {
                hw::dots(t, &tiles.qb, hp, d, rows, dots);
                hw::fold(t.avx512(), q.relu, &tiles.wp, hp, dots, acc);
            }
        }
    }
}

/// Configures this thread's tiles for [`sums`] under `run` (nothing for the
/// model); [`end`] when done.
pub(super) fn begin(run: AmxRun) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let AmxRun::Hw(t) = run {
        crate::simd::amx::hw::configure(t);
    }
    let _ = run;
}

/// Releases this thread's tiles after [`begin`].
pub(super) fn end(run: AmxRun) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let AmxRun::Hw(t) = run {
        crate::simd::amx::hw::release(t);
    }
    let _ = run;
}

/// The tiles' dot products in software: `dots[r · hp + h]` for key `r`,
/// head `h < hp`, one [`tile_model`] per 16 keys × 16 heads × 16 pairs, the
/// pairs' tiles in order into the same `C` (as the instruction runs them).
fn model_dots(qb: &[u32], hp: usize, d: usize, rows: &[u16], dots: &mut [f32]) {
    let pair = |r: usize, k: usize| {
        u32::from(rows[r * d + 2 * k]) | u32::from(rows[r * d + 2 * k + 1]) << 16
    };
    for r0 in (0..BLOCK).step_by(TILE) {
        for h0 in (0..hp).step_by(TILE) {
            let mut c = [[0.0f32; TILE]; TILE];
            for p0 in (0..d / 2).step_by(TILE) {
                tile_model(
                    &mut c,
                    |m, k| pair(r0 + m, p0 + k),
                    |k, n| qb[(p0 + k) * hp + h0 + n],
                    TILE,
                );
            }
            for (m, row) in c.iter().enumerate() {
                dots[(r0 + m) * hp + h0..][..TILE].copy_from_slice(row);
            }
        }
    }
}

/// The fold of the block's dot products (`dots[r · hp + h]`) in head order:
/// `acc_r = fma(w_h, relu(dot_rh), acc_r)`.
fn fold(q: &Query, hp: usize, dots: &[f32], acc: &mut [f32; BLOCK]) {
    for (r, a) in acc.iter_mut().enumerate() {
        for (h, &wh) in q.w.iter().enumerate() {
            let x = dots[r * hp + h];
            *a = wh.mul_add(if q.relu { relu(x) } else { x }, *a);
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod hw {
    use super::{BLOCK, FP8_SUBNORMAL, TILE};
    use crate::simd::{amx::Amx, Avx512};
    use std::arch::asm;
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

    /// [`super::scan_body`] compiled for AVX-512.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) fn scan(_: Avx512, rows: &[u16]) -> (u16, Option<i32>) {
        super::scan_body(rows)
    }

    /// The fold with the heads across the lanes: per key, 16 partial sums
    /// `fma(w_h, relu(dot_h), ·)` over the heads `h ≡ j (mod 16)`, then
    /// summed across the lanes — another order than the float32 kernels'
    /// (each term passes `⌈hp / 16⌉ + 4` roundings), within the same bound
    /// (`super`'s docs).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) fn fold(
        _: Avx512,
        relu: bool,
        wp: &[f32],
        hp: usize,
        dots: &[f32],
        acc: &mut [f32; BLOCK],
    ) {
        assert!(wp.len() == hp && dots.len() >= BLOCK * hp && hp.is_multiple_of(16));
        let zero = _mm512_setzero_ps();
        for (r, a) in acc.iter_mut().enumerate() {
            let mut s = zero;
            for h in (0..hp).step_by(16) {
                // SAFETY: `r · hp + h + 16 <= BLOCK · hp` and `h + 16 <= hp`
                // (asserted): 16 floats each (unaligned).
                let (x, w) = unsafe {
                    (
                        _mm512_loadu_ps(dots.as_ptr().add(r * hp + h)),
                        _mm512_loadu_ps(wp.as_ptr().add(h)),
                    )
                };
                // `max(0, x)` returns `x` when it is NaN (the second
                // operand), as the model's ReLU keeps NaN.
                let x = match relu {
                    true => _mm512_max_ps(zero, x),
                    false => x,
                };
                s = _mm512_fmadd_ps(w, x, s);
            }
            *a = _mm512_reduce_add_ps(s);
        }
    }

    /// The tiles' dot products: `dots[r · hp + h]` for key `r`, head `h <
    /// hp`. Per 32 heads: four accumulator tiles (keys 0–15 and 16–31 ×
    /// heads 0–15 and 16–31), each tile of the block's rows and of the
    /// query's pairs loaded once per 32 dimensions; a last 16 heads alone.
    ///
    /// # Safety
    ///
    /// This thread's tiles must be configured ([`crate::simd::amx::hw::configure`]);
    /// `qb` holds `d / 2 · hp` pairs, `rows` `BLOCK · d` bfloat16, `dots`
    /// `BLOCK · hp` floats; `hp` a multiple of 16 and `d` of 32.
    pub(super) unsafe fn dots(
        _: Amx,
        qb: &[u32],
        hp: usize,
        d: usize,
        rows: &[u16],
        dots: &mut [f32],
    ) {
        debug_assert!(
            qb.len() == d / 2 * hp && rows.len() == BLOCK * d && dots.len() >= BLOCK * hp
        );
        let chunks = d / (2 * TILE);
        // Bytes between rows: a key's bfloat16 (`A`), the query's pair rows
        // (`B`, `hp` pairs of 4 bytes), the dot products' key rows.
        let (ks, qs) = (d * 2, hp * 4);
        let mut h0 = 0;
        while h0 < hp {
            let two = h0 + 2 * TILE <= hp;
            // SAFETY: per chunk `c` the loads read 16 rows of 64 bytes: `A`
            // at keys 0–15 and 16–31, bytes `64c ..` of each row of `rows`;
            // `B` at pair rows `16c ..` of `qb`, heads `h0 ..` (and `h0 + 16
            // ..` at +64 when `two`); the stores write keys 0–31's heads `h0
            // .. h0 + 16` (`+ 32` when `two`) of `dots` — all within the
            // lengths the caller guarantees.
            unsafe {
                let k0 = rows.as_ptr();
                let k1 = k0.add(TILE * d);
                let q = qb.as_ptr().add(h0);
                let o0 = dots.as_mut_ptr().add(h0);
                let o1 = o0.add(TILE * hp);
                if two {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        "2:",
                        "tileloadd tmm4, [{k0} + {ks}*1]",
                        "tileloadd tmm5, [{k1} + {ks}*1]",
                        "tileloadd tmm6, [{q} + {qs}*1]",
                        "tileloadd tmm7, [{q} + {qs}*1 + 64]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        "add {k0}, 64",
                        "add {k1}, 64",
                        "add {q}, {qstep}",
                        "dec {n}",
                        "jnz 2b",
                        "tilestored [{o0} + {os}*1], tmm0",
                        "tilestored [{o0} + {os}*1 + 64], tmm1",
                        "tilestored [{o1} + {os}*1], tmm2",
                        "tilestored [{o1} + {os}*1 + 64], tmm3",
                        k0 = inout(reg) k0 => _,
                        k1 = inout(reg) k1 => _,
                        q = inout(reg) q => _,
                        n = inout(reg) chunks => _,
                        ks = in(reg) ks,
                        qs = in(reg) qs,
                        qstep = in(reg) TILE * qs,
                        o0 = in(reg) o0,
                        o1 = in(reg) o1,
                        os = in(reg) qs,
                        options(nostack),
                    );
                } else {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm2",
                        "2:",
                        "tileloadd tmm4, [{k0} + {ks}*1]",
                        "tileloadd tmm5, [{k1} + {ks}*1]",
                        "tileloadd tmm6, [{q} + {qs}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "add {k0}, 64",
                        "add {k1}, 64",
                        "add {q}, {qstep}",
                        "dec {n}",
                        "jnz 2b",
                        "tilestored [{o0} + {os}*1], tmm0",
                        "tilestored [{o1} + {os}*1], tmm2",
                        k0 = inout(reg) k0 => _,
                        k1 = inout(reg) k1 => _,
                        q = inout(reg) q => _,
                        n = inout(reg) chunks => _,
                        ks = in(reg) ks,
                        qs = in(reg) qs,
                        qstep = in(reg) TILE * qs,
                        o0 = in(reg) o0,
                        o1 = in(reg) o1,
                        os = in(reg) qs,
                        options(nostack),
                    );
                }
            }
            h0 += if two { 2 * TILE } else { TILE };
        }
    }
}

/// The tests' override of [`AmxRun::of`] (this thread's calls only).
#[cfg(test)]
pub(crate) mod tests_force {
    use super::AmxRun;
    use std::cell::Cell;

    thread_local! {
        static FORCED: Cell<Option<Option<AmxRun>>> = const { Cell::new(None) };
    }

    /// The screen this thread's calls take, if a test forced one.
    pub(super) fn get() -> Option<Option<AmxRun>> {
        FORCED.with(|f| f.get())
    }

    /// Runs `f` with the screen forced to `run` (`None`: no screen).
    pub(crate) fn with<T>(run: Option<AmxRun>, f: impl FnOnce() -> T) -> T {
        FORCED.with(|c| c.set(Some(run)));
        let out = f();
        FORCED.with(|c| c.set(None));
        out
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
        let mut got = vec![0u16; codes.len()];
        let kmax = decode_fp8(&codes, &mut got);
        assert_eq!(got, want);
        assert_eq!(kmax, want.iter().map(|x| x & 0x7FFF).max());
        // Rotated, so the codes the tail took above go through the vectors.
        let (mut codes_r, mut want_r) = (codes.clone(), want.clone());
        codes_r.rotate_left(64);
        want_r.rotate_left(64);
        assert_eq!(decode_fp8(&codes_r, &mut got), kmax);
        assert_eq!(got, want_r);
        // A NaN code anywhere, in the vector part or the tail, is refused.
        for (at, nan) in [3, 40, codes.len() - 1].into_iter().zip([0xFF, 0x7F, 0xFF]) {
            let mut with_nan = codes.clone();
            with_nan[at] = nan;
            assert_eq!(decode_fp8(&with_nan, &mut got), None);
            assert_eq!(decode_fp8_tail(&with_nan, &mut got), None);
        }
    }
}
