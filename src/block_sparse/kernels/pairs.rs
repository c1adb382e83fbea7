//! The bfloat16-pair step: block selection's dot products two dimensions
//! per instruction (AVX512-BF16's `VDPBF16PS`), with the float32 kernels'
//! bits, where many row tiles read the same keys (a prefill).
//!
//! # The order, in pairs
//!
//! Block selection's canonical order (the module docs of
//! [`crate::block_sparse`]) accumulates a dot product in 8 lanes: lane `j`
//! runs `acc_j = fma(q_i, k_i, acc_j)` over `i = j, j + 8, j + 16, …` in
//! order, and the lanes are summed by a fixed tree. The instruction runs
//! two steps of one lane's chain when its pair is `(j + 16m, j + 16m + 8)`
//! with the first in the **high** half (multiplied first): so lane `j` of
//! 16-dimension group `m` holds [`pack`]`(x[16m + j], x[16m + 8 + j])`, for
//! keys and queries alike, and a 512-bit register holds the 8 lanes of two
//! keys, as the AVX-512 step's accumulators do ([`super::avx512`]). The
//! lanes are then reduced by the same tree, so a step's eight keys' scores
//! are the float32 step's bits wherever the chain of pairs is the chain of
//! FMAs: where [`admits`] says denormals-are-zero and flush-to-zero cannot
//! act (why, in [`crate::simd::bf16dp`]), checked per (row tile, key
//! chunk) on the tile's queries and the chunk's keys. Every other tile and
//! chunk runs the float32 step, and so do the keys a step of eight does not
//! cover (a block's last ones, a masked piece): they read the chunk's
//! float32 keys, which the pairs mirror key for key.
//!
//! `d` must be a multiple of 16 (a dimension past `d` would otherwise be a
//! `fma(0, 0, acc)` the float32 chain does not run, turning a `−0.0` lane
//! into `+0.0`); other `d` run the float32 step.
//!
//! What would break it: a pair of adjacent dimensions (`2i, 2i + 1`: two
//! different lanes' steps), the high and low halves swapped (the second
//! step first), or admitting on the keys' exponents alone.
//!
//! # Where it pays
//!
//! The keys are packed once per chunk and read by every row tile, so the
//! step replaces float32 FMAs only where many tiles read each chunk (the
//! engine's non-streaming path: a prefill, many query heads); a decode's
//! one or two tiles read each key once, from memory, and keep the float32
//! step.

use super::avx2::Step;
use super::MR;
use crate::keys::lanes::Load;
pub(in crate::block_sparse) use crate::simd::bf16dp::PairRun;
use crate::simd::bf16dp::{admits, dp_model, min_exponent, pack, summary_of_smallest};
use std::arch::x86_64::*;

/// Dimensions per pair group: 8 lanes of two dimensions each.
pub(in crate::block_sparse) const GROUP: usize = 16;

/// The pairs of `x` (`d` values, `d` a multiple of [`GROUP`]) into `out`
/// (`d / 2`): `out[8m + j] = pack(x[16m + j], x[16m + 8 + j])`.
fn pack_row(x: &[f32], out: &mut [u32]) {
    for (g, o) in x.chunks_exact(GROUP).zip(out.chunks_exact_mut(GROUP / 2)) {
        for (j, p) in o.iter_mut().enumerate() {
            *p = pack(g[j], g[j + 8]);
        }
    }
}

/// The padded query rows as pairs ([`pack_row`], `dp / 2` a row), and each
/// row tile's exponent summary ([`min_exponent`] of its rows).
pub(in crate::block_sparse) struct PairRows {
    pub(in crate::block_sparse) qp: Vec<u32>,
    pub(in crate::block_sparse) tiles: Vec<Option<i32>>,
}

impl PairRows {
    /// The pairs of `q` (rows of `dp` floats, tiles of [`MR`] rows), or
    /// `None` when `dp` is not a multiple of [`GROUP`] or no tile's
    /// queries are exact bfloat16 values (nothing could run in pairs).
    pub(in crate::block_sparse) fn new(q: &[f32], dp: usize) -> Option<PairRows> {
        if dp == 0 || !dp.is_multiple_of(GROUP) {
            return None;
        }
        let tiles: Vec<_> = q
            .chunks(MR * dp)
            .map(|t| min_exponent(t.iter().map(|x| x.to_bits())))
            .collect();
        if tiles.iter().all(Option::is_none) {
            return None;
        }
        let mut qp = vec![0u32; q.len() / 2];
        for (row, out) in q.chunks_exact(dp).zip(qp.chunks_exact_mut(dp / 2)) {
            pack_row(row, out);
        }
        Some(PairRows { qp, tiles })
    }

    /// Whether tile `t` runs in pairs against keys of summary `keys`.
    pub(in crate::block_sparse) fn admits(&self, t: usize, keys: Option<i32>) -> bool {
        admits(keys, self.tiles.get(t).copied().flatten())
    }

    /// Tile `t`'s rows of pairs.
    pub(in crate::block_sparse) fn tile(&self, t: usize, dp: usize) -> &[u32] {
        let n = MR * dp / 2;
        &self.qp[t * n..(t + 1) * n]
    }
}

/// Where key `k`'s pairs of group `m` start in a packed run of keys of
/// `d` dimensions ([`pack_keys`]): keys `2i` and `2i + 1` share `d` pairs,
/// group by group, key `2i`'s 8 lanes then key `2i + 1`'s, so that one
/// 512-bit load holds both keys' group `m` (the two halves of the step's
/// accumulators).
#[inline(always)]
pub(super) fn pair_at(k: usize, m: usize, d: usize) -> usize {
    k / 2 * d + GROUP * m + k % 2 * 8
}

/// The packed length of `n` keys of `d` dimensions: whole key pairs.
pub(in crate::block_sparse) fn packed_len(n: usize, d: usize) -> usize {
    n.div_ceil(2) * d
}

/// Keys `keys` (`d` values each, `d` a multiple of [`GROUP`]) as pairs
/// into `kp` ([`packed_len`]; key `k`'s group `m` at [`pair_at`], lanes
/// [`pack_row`]'s; an odd count's last half zero). Returns their exponent
/// summary ([`min_exponent`]).
pub(in crate::block_sparse) fn pack_keys(keys: &[f32], d: usize, kp: &mut [u32]) -> Option<i32> {
    assert!(d > 0 && d.is_multiple_of(GROUP) && keys.len().is_multiple_of(d));
    let n = keys.len() / d;
    assert!(kp.len() == packed_len(n, d));
    // An odd count's last key pair has no second key: its half zero, once
    // here for both bodies below (they write every key's pairs).
    if n % 2 == 1 {
        for m in 0..d / GROUP {
            kp[pair_at(n, m, d)..][..GROUP / 2].fill(0);
        }
    }
    if let Some(t) = crate::simd::avx512_token() {
        // SAFETY: the token proves AVX-512 F and VL (and AVX2).
        return unsafe { pack_keys_avx512(t, keys, d, kp) };
    }
    pack_keys_body(keys, d, kp)
}

/// [`pack_keys`]' body (the keys' pairs; the padding is `pack_keys`').
pub(super) fn pack_keys_body(keys: &[f32], d: usize, kp: &mut [u32]) -> Option<i32> {
    for (k, key) in keys.chunks_exact(d).enumerate() {
        for (m, g) in key.chunks_exact(GROUP).enumerate() {
            let at = pair_at(k, m, d);
            pack_row(g, &mut kp[at..at + GROUP / 2]);
        }
    }
    min_exponent(keys.iter().map(|x| x.to_bits()))
}

/// [`pack_keys`] a group at a time in 256-bit registers: the group's pairs
/// by one select (`hi ? x[16m + j] : x[16m + 8 + j] >> 16`), the summary in
/// the same pass as the indexer's pack takes it (an OR for bits below the
/// bfloat16's; the unsigned minimum of `|x| − 1`, zeros last, for the
/// smallest nonzero magnitude).
#[target_feature(enable = "avx512f,avx512vl,avx2")]
fn pack_keys_avx512(_: crate::simd::Avx512, keys: &[f32], d: usize, kp: &mut [u32]) -> Option<i32> {
    let (n, groups) = (keys.len() / d, d / GROUP);
    assert!(keys.len() == n * d && kp.len() == packed_len(n, d) && d == groups * GROUP);
    let (src, dst) = (keys.as_ptr().cast::<__m256i>(), kp.as_mut_ptr());
    let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let magnitude = _mm256_set1_epi32(0x7FFF_FFFF);
    let one = _mm256_set1_epi32(1);
    let (mut or, mut min) = (_mm256_setzero_si256(), _mm256_set1_epi32(-1));
    for k in 0..n {
        for m in 0..groups {
            // SAFETY: group `m` of key `k < n` is `keys[kd + 16m ..][..16]`
            // (two 256-bit halves), and its pairs `kp[pair_at(k, m, d)
            // ..][..8]`, within `packed_len(n, d)`: the lengths asserted.
            unsafe {
                let a = _mm256_loadu_si256(src.add(2 * (k * groups + m)));
                let b = _mm256_loadu_si256(src.add(2 * (k * groups + m) + 1));
                let p = _mm256_ternarylogic_epi32::<0xCA>(hi, a, _mm256_srli_epi32::<16>(b));
                _mm256_storeu_si256(dst.add(pair_at(k, m, d)).cast(), p);
                or = _mm256_ternarylogic_epi32::<0xFE>(or, a, b);
                for x in [a, b] {
                    let below = _mm256_sub_epi32(_mm256_and_si256(x, magnitude), one);
                    min = _mm256_min_epu32(min, below);
                }
            }
        }
    }
    let (mut lanes_or, mut lanes_min) = ([0u32; 8], [0u32; 8]);
    // SAFETY: each array holds 8 lanes (unaligned stores).
    unsafe {
        _mm256_storeu_si256(lanes_or.as_mut_ptr().cast(), _mm256_andnot_si256(hi, or));
        _mm256_storeu_si256(lanes_min.as_mut_ptr().cast(), min);
    }
    let least = lanes_min.into_iter().min().unwrap_or(u32::MAX);
    // `|x| − 1` wraps only for zeros: `least + 1` is the smallest nonzero
    // magnitude.
    match lanes_or.into_iter().fold(0, |a, b| a | b) {
        0 => summary_of_smallest((least != u32::MAX).then(|| least + 1)),
        _ => None,
    }
}

/// The pair step: [`KEYS`] keys a step, their pairs read from a packed copy of
/// the segment's float32 keys ([`pack_keys`], key for key: key `k` of the
/// segment's keys is key `k` of the pairs), against the tile's query
/// pairs; run by the instruction ([`Hw`]) or its model ([`Model`]).
#[derive(Clone, Copy)]
pub(super) struct PairStep<'a, R> {
    pub(super) run: R,
    /// The tile's 4 rows of pairs, `dp / 2` apart.
    pub(super) qp: &'a [u32],
    /// The segment's keys' first byte, and their pairs.
    pub(super) keys_at: usize,
    pub(super) kp: &'a [u32],
}

/// Keys per pair step: four registers of two keys a row.
pub(super) const KEYS: usize = 8;

/// What runs a pair step's [`KEYS`] keys: [`dots_hw`]'s contract.
pub(super) trait Dots: Copy {
    /// # Safety
    /// As [`dots_hw`]; the instructions the implementor stands for
    /// available.
    unsafe fn dots<const ODD: bool>(
        self,
        qp: *const u32,
        dp2: usize,
        kp: *const u32,
        d: usize,
    ) -> [__m128; KEYS];
}

/// The instruction, with the token that proves it.
#[derive(Clone, Copy)]
pub(super) struct Hw(pub(super) crate::simd::Avx512Bf16);

impl Dots for Hw {
    #[inline(always)]
    unsafe fn dots<const ODD: bool>(
        self,
        qp: *const u32,
        dp2: usize,
        kp: *const u32,
        d: usize,
    ) -> [__m128; KEYS] {
        // SAFETY: the token proves the features; the pointers are the
        // contract's.
        unsafe { dots_hw::<ODD>(self.0, qp, dp2, kp, d) }
    }
}

/// The software model, on any x86-64 CPU.
#[derive(Clone, Copy)]
pub(super) struct Model;

impl Dots for Model {
    #[inline(always)]
    unsafe fn dots<const ODD: bool>(
        self,
        qp: *const u32,
        dp2: usize,
        kp: *const u32,
        d: usize,
    ) -> [__m128; KEYS] {
        // SAFETY: the contract's pointers.
        unsafe { dots_model(qp, dp2, kp, usize::from(ODD), d) }
    }
}

impl<R: Dots> Step for PairStep<'_, R> {
    const KEYS: usize = KEYS;
    #[inline(always)]
    unsafe fn fold<L: Load>(
        self,
        _q: *const f32,
        dp: usize,
        k: *const L::E,
        d: usize,
        m: __m128,
    ) -> __m128 {
        // The step's first key, counted from the segment's first.
        let k = (k as usize - self.keys_at) / std::mem::size_of::<L::E>() / d;
        // The key pairs holding keys `k .. k + KEYS` (within the segment,
        // so within the pairs: the contract of `run_pairs`); key `k` is the
        // window's first or second.
        let window = &self.kp[k / 2 * d..(k + KEYS).div_ceil(2) * d];
        // The tile's 4 rows of `dp / 2` pairs (checked here too, so the
        // reads below rest on this function alone).
        let qp = self.qp[..MR * dp / 2].as_ptr();
        let kp = window.as_ptr();
        // SAFETY: `qp` holds 4 rows of `dp / 2` pairs and the window the
        // step's keys' pairs from key `k % 2` (both sliced above); the run's
        // features are its own contract.
        let s = unsafe {
            match k % 2 {
                0 => self.run.dots::<false>(qp, dp / 2, kp, d),
                _ => self.run.dots::<true>(qp, dp / 2, kp, d),
            }
        };
        s.into_iter().fold(m, |m, sj| {
            // SAFETY: SSE, which x86-64 always has.
            unsafe { _mm_max_ps(sj, m) }
        })
    }
}

/// The float32 walk ([`super::avx2::segment_f32`]) with the instruction's
/// step, compiled with the instruction's features so that the step inlines
/// into the walk (its results stay in registers).
///
/// # Safety
/// As [`super::avx2::segment_f32`]; the token proves the features.
#[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn segment_hw(
    step: PairStep<'_, Hw>,
    seg: &super::Segment<'_>,
    keys: &[f32],
    out: super::TileOut<'_>,
) {
    // SAFETY: the token inside `step` proves every feature above.
    unsafe { super::avx2::segment_f32(step, seg, keys, out) }
}

/// The dot products of the 4 rows of pairs at `qp` (stride `dp2`) with the
/// [`KEYS`] keys whose pairs start at `kp` ([`pair_at`]'s layout, `d`
/// dimensions; from its key 0, or with `ODD` its key 1), each as `[r0, r2,
/// r1, r3]`: the AVX-512 step's `dots6` in pairs, two keys more (keys `2p`
/// and `2p + 1` of the step in the low and high halves of one register, each half one key's
/// 8 lanes, reduced by [`super::avx512::reduce`]). From key 0 both halves are one
/// 512-bit load; from key 1 they are two loads and an insert (a piece that
/// starts at an odd key).
///
/// # Safety
/// `qp` readable for `4 · dp2` pairs (`2 · dp2 >= d`), `kp` for the pairs of
/// keys `0 .. KEYS + ODD` ([`packed_len`]).
#[inline]
#[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn dots_hw<const ODD: bool>(
    _: crate::simd::Avx512Bf16,
    qp: *const u32,
    dp2: usize,
    kp: *const u32,
    d: usize,
) -> [__m128; KEYS] {
    use crate::simd::bf16dp::dp;
    const P: usize = KEYS / 2;
    let mut acc = [[_mm512_setzero_ps(); P]; MR];
    let first = usize::from(ODD);
    for g in 0..d / GROUP {
        let mut kv = [_mm512_setzero_si512(); P];
        for (p, v) in kv.iter_mut().enumerate() {
            let at = |k: usize| pair_at(first + k, g, d);
            // SAFETY: keys 2p and 2p + 1 of the step, group g (the contract).
            *v = unsafe {
                match ODD {
                    false => _mm512_loadu_si512(kp.add(at(2 * p)).cast()),
                    true => {
                        let a = _mm256_loadu_si256(kp.add(at(2 * p)).cast());
                        let b = _mm256_loadu_si256(kp.add(at(2 * p + 1)).cast());
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
                    }
                }
            };
        }
        for (r, accr) in acc.iter_mut().enumerate() {
            // SAFETY: row r's pairs 8g .. 8g + 8 are within dp2.
            let qv = _mm512_broadcast_i64x4(unsafe {
                _mm256_loadu_si256(qp.add(r * dp2 + 8 * g).cast())
            });
            for p in 0..P {
                accr[p] = dp(accr[p], qv, kv[p]);
            }
        }
    }
    // SAFETY: the target features above.
    unsafe { super::avx512::reduce::<P, KEYS>(acc) }
}

/// [`dots_hw`] with each lane through [`dp_model`], and the canonical tree
/// written out (`first`: 1 for `ODD`): the tests' stand-in for the
/// instruction on every CPU.
///
/// # Safety
/// As [`dots_hw`]'s pointer contract.
unsafe fn dots_model(
    qp: *const u32,
    dp2: usize,
    kp: *const u32,
    first: usize,
    d: usize,
) -> [__m128; KEYS] {
    std::array::from_fn(|p| {
        let s: [f32; MR] = std::array::from_fn(|r| {
            let mut l = [0.0f32; 8];
            for g in 0..d / GROUP {
                for (j, lj) in l.iter_mut().enumerate() {
                    // SAFETY: lane j of group g of row r and of key p (the
                    // contract).
                    let (a, b) = unsafe {
                        (
                            *qp.add(r * dp2 + 8 * g + j),
                            *kp.add(pair_at(first + p, g, d) + j),
                        )
                    };
                    *lj = dp_model(*lj, a, b);
                }
            }
            ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
        });
        // SAFETY: SSE, which x86-64 always has.
        unsafe { _mm_setr_ps(s[0], s[2], s[1], s[3]) }
    })
}
