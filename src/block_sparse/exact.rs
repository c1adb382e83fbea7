//! Block selection made exact: the free blocks chosen are those whose
//! **real** block scores (the max over the block's visible keys of `q · k`,
//! of the decoded operands; a NaN product sum absent) are the largest, ties
//! to the lower block id — the blocks `kvselect check` accepts at
//! `rtol = 0`. The float32 block maxima screen; the blocks their rounding
//! can have misplaced at the threshold are re-scored in float64.
//!
//! # Why it holds
//!
//! A float32 dot product here is 8 lanes of `⌈d/8⌉` FMAs each, then a tree
//! of 3 sums (module docs of `super`): its error is at most
//! `γ_{⌈d/8⌉+3} Σ_i |q_i k_i|` (Higham §3.1), plus `2⁻¹⁵⁰` per rounding into
//! the subnormal range, so at most `E_b = γ_{⌈d/8⌉+4} A G_b + η` with `A =
//! Σ_i |q_i|` (per row) and `G_b` the largest `|k_ti|` of block `b` (made as
//! the keys are scored: the codes' magnitudes, a NaN code highest). A max
//! of values each within `E_b` of its real value is within `E_b` of the real
//! max, so the real block score lies in `[ŝ_b − E_b, ŝ_b + E_b]`; the rest
//! is the argument of `crate::indexer`'s exact selection (a chosen block
//! whose lower end is above every unchosen upper end is in, and so on), the
//! band re-scored in float64 with every product exact. A non-finite score
//! or bound is the whole line (a float32 overflow is finite in float64).
//!
//! # What would break it
//!
//! A kernel with longer chains than the count above, a `G_b` that misses a
//! key of the block the kernel read, or a re-score that differs from the
//! rule (a NaN product sum counted, a key past the row's visibility read).

use super::select::select_blocks;
use super::BlockSparseConfig;
use crate::keys::{Encoded, Format};
use crate::rounding::{self, gamma32, rank64, ETA16};
use crate::simd::{dispatch, Isa};

/// A row's terms of its block scores' error bound.
pub(super) struct Bound {
    /// `γ_{⌈d/8⌉+4} Σ_i |q_i|`, rounded up (with room for this module's
    /// float64 roundings).
    scale: f64,
    /// The underflow term `η`.
    eta: f64,
}

impl Bound {
    /// The bound's terms of a row `q` (its `d` decoded elements).
    pub fn of(q: &[f32]) -> Bound {
        let d = q.len();
        let a: f64 = q.iter().map(|&x| f64::from(x.abs())).sum();
        let gamma = gamma32(d.div_ceil(8) + 4);
        let room = (1.0 + 2.0 * (d + 2) as f64 * f64::EPSILON) * (1.0 + 1.0 / (1u64 << 20) as f64);
        Bound {
            scale: gamma * a * room,
            eta: ETA16 * (d + 8) as f64,
        }
    }

    /// `[ŝ − E, ŝ + E]` for a block score `s` whose keys' largest magnitude
    /// is `g`; the whole line when anything is not finite.
    #[inline]
    fn interval(&self, s: f32, g: f32) -> (f64, f64) {
        rounding::interval(s, self.scale * f64::from(g) + self.eta)
    }
}

/// The row's selection, exact (see the module docs), ascending into `sel`:
/// `score(b)` is block `b`'s float32 max, `mag(b)` its keys' largest
/// magnitude, `rescore(b)` its float64 score (the max over the keys the row
/// sees, NaN sums absent, `-inf` if none).
#[allow(clippy::too_many_arguments)]
pub(super) fn select_exact(
    nb: usize,
    score: impl Fn(usize) -> f32,
    mag: impl Fn(usize) -> f32,
    bound: &Bound,
    mut rescore: impl FnMut(usize) -> f64,
    cfg: &BlockSparseConfig,
    cand: &mut Vec<(f32, usize)>,
    sel: &mut Vec<usize>,
) {
    select_blocks(nb, &score, cfg, cand, sel);
    if nb == 0 {
        return;
    }
    // The free blocks and how many of them the rule takes (as select_blocks).
    let init_end = cfg.init_blocks.min(nb);
    let local_start = (nb - cfg.local_blocks.min(nb)).max(init_end);
    let free = init_end..local_start;
    let chosen: Vec<usize> = sel.iter().copied().filter(|b| free.contains(b)).collect();
    let want = chosen.len();
    if want == 0 || want == free.len() {
        return; // none or all of the free blocks: nothing to decide
    }
    let iv = |b: usize| bound.interval(score(b) + 0.0, mag(b));
    let lo_min = chosen
        .iter()
        .map(|&b| iv(b).0)
        .fold(f64::INFINITY, f64::min);
    let mut is_chosen = vec![false; nb];
    for &b in &chosen {
        is_chosen[b] = true;
    }
    let mut up_max = f64::NEG_INFINITY;
    let mut band: Vec<usize> = Vec::new();
    for b in free.clone().filter(|&b| !is_chosen[b]) {
        let up = iv(b).1;
        if up >= lo_min {
            up_max = up_max.max(up);
            band.push(b);
        }
    }
    if band.is_empty() {
        return; // the float32 choice is the real one
    }
    let mut kept: Vec<usize> = Vec::with_capacity(want);
    for &b in &chosen {
        if iv(b).0 <= up_max {
            band.push(b);
        } else {
            kept.push(b);
        }
    }
    let exact: Vec<f64> = band.iter().map(|&b| rescore(b)).collect();
    let mut order: Vec<usize> = (0..band.len()).collect();
    order.sort_unstable_by_key(|&j| std::cmp::Reverse(rank64(exact[j], band[j])));
    kept.extend(order[..want - kept.len()].iter().map(|&j| band[j]));
    sel.clear();
    sel.extend(0..init_end);
    kept.sort_unstable();
    sel.extend(kept);
    sel.extend(local_start..nb);
}

/// Block `b`'s float64 score for a row `q` (`d` decoded elements): the max
/// over keys `b·bs .. min((b+1)·bs, vis)` of `Σ_i q_i k_i` summed in
/// dimension order (every product exact), a NaN sum absent; `-inf` if none.
/// `keys(c0, c1, buf)` decodes keys `c0 .. c1` into `buf`.
pub(super) fn block_score64(
    q: &[f32],
    b: usize,
    bs: usize,
    vis: usize,
    keys: impl Fn(usize, usize, &mut [f32]),
    buf: &mut Vec<f32>,
) -> f64 {
    let d = q.len();
    let (c0, c1) = (b * bs, ((b + 1) * bs).min(vis));
    if c1 <= c0 || d == 0 {
        return f64::NEG_INFINITY;
    }
    buf.resize((c1 - c0) * d, 0.0);
    keys(c0, c1, buf);
    let mut best = f64::NEG_INFINITY;
    for k in buf.chunks_exact(d) {
        let s: f64 = q
            .iter()
            .zip(k)
            .fold(0.0, |acc, (&x, &y)| acc + f64::from(x) * f64::from(y));
        if s > best {
            best = s;
        }
    }
    best
}

/// The largest magnitude among elements `a .. b` of `enc`, as a float32
/// (the codes' magnitudes order as their values, a NaN code highest, so a
/// NaN element makes it NaN): one pass over the codes at `isa`'s width.
pub(super) fn abs_max(isa: Isa, enc: &Encoded<'_>, a: usize, b: usize) -> f32 {
    // SAFETY (bounds): none; the body slices `enc` (checked indexing).
    dispatch!("block_sparse.key_max", isa, {
        avx512(token) => x86::abs_max_avx512(token, enc, a, b),
        avx2(token) => x86::abs_max_avx2(token, enc, a, b),
        scalar => abs_max_body(enc, a, b),
    })
}

/// [`abs_max`]'s body, written once (each level compiles it with its own
/// instructions: an unsigned max over 8-, 16- or 32-bit codes).
#[inline(always)]
pub(super) fn abs_max_body(enc: &Encoded<'_>, a: usize, b: usize) -> f32 {
    magnitude_of(enc.format(), code_max(enc, a, b))
}

/// The largest magnitude code among elements `a .. b` of `enc` (each code
/// with its sign bit cleared; 0 when the range is empty): what
/// [`magnitude_of`] turns into [`abs_max`]'s value. A max, so any split of
/// a range, in any order, gives the same code (the kernels take it a few
/// keys at a time as they read them).
#[inline(always)]
pub(super) fn code_max(enc: &Encoded<'_>, a: usize, b: usize) -> u32 {
    match enc {
        Encoded::F32(s) => s[a..b]
            .iter()
            .fold(0u32, |m, x| m.max(x.to_bits() & 0x7FFF_FFFF)),
        Encoded::Bf16(s) | Encoded::F16(s) => {
            u32::from(s[a..b].iter().fold(0u16, |m, &x| m.max(x & 0x7FFF)))
        }
        Encoded::Fp8E4m3(s) => u32::from(s[a..b].iter().fold(0u8, |m, &x| m.max(x & 0x7F))),
    }
}

/// The value of a magnitude code of `format` ([`code_max`]) as a float32:
/// the codes' magnitudes order as their values, a NaN code highest, so the
/// largest code is the largest magnitude, or NaN.
pub(super) fn magnitude_of(format: Format, code: u32) -> f32 {
    match format {
        Format::F32 => f32::from_bits(code),
        Format::Bf16 => f32::from_bits(code << 16),
        Format::F16 => {
            let mut out = [0.0f32];
            Encoded::F16(&[code as u16]).decode(0, &mut out);
            out[0]
        }
        Format::Fp8E4m3 => {
            let mut out = [0.0f32];
            Encoded::Fp8E4m3(&[code as u8]).decode(0, &mut out);
            out[0]
        }
    }
}

/// A block's key magnitude merged with another part's: the larger, and
/// NaN sticky (a block's start, `-inf`, reads as nothing).
pub(super) fn merge_magnitude(old: f32, m: f32) -> f32 {
    if old.is_nan() || m.is_nan() {
        f32::NAN
    } else {
        old.max(m)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::abs_max_body;
    use crate::keys::Encoded;
    use crate::simd::{Avx2, Avx512};

    /// [`abs_max_body`] compiled for AVX2 (the token proves the CPU has it).
    #[target_feature(enable = "avx2")]
    pub(super) fn abs_max_avx2(_: Avx2, enc: &Encoded<'_>, a: usize, b: usize) -> f32 {
        abs_max_body(enc, a, b)
    }

    /// [`abs_max_body`] compiled for AVX-512 (the token proves the CPU has it).
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) fn abs_max_avx512(_: Avx512, enc: &Encoded<'_>, a: usize, b: usize) -> f32 {
        abs_max_body(enc, a, b)
    }
}

/// Runs the family at `isa` once (the reach test's probe).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let x = [1.0f32, -3.0, 2.0, f32::NAN];
    assert_eq!(abs_max(isa, &Encoded::F32(&x), 0, 3), 3.0);
    assert!(abs_max(isa, &Encoded::F32(&x), 0, 4).is_nan());
}
