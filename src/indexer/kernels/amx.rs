//! The AMX screen: a block's dot products as tile products (`TDPBF16PS`,
//! [`crate::simd::amx`]), for the exact selection to rule positions out
//! with — never a score kvselect returns.
//!
//! # What it computes
//!
//! For a block of [`BLOCK`] keys and one query, the `32 × H` dot products
//! `q_h · k_r` in tiles of 16 keys × 16 heads, 32 dimensions per
//! instruction: the block's keys as bfloat16 rows are the rows of `A` (bf16
//! keys read in place, fp8 keys decoded exactly, [`super::rows`]), the
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

/// The block's scores before the scale, `Σ_h w_h relu(q_h · k_r)` for every
/// key `r`, the dot products by the tiles (`run`) of `rows` ([`super::rows::block_rows`],
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
    use super::{BLOCK, TILE};
    use crate::simd::{amx::Amx, Avx512};
    use std::arch::asm;
    use std::arch::x86_64::*;

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
