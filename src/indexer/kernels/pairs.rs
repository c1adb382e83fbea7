//! The bfloat16-pair level: the indexer's dot products two dimensions per
//! instruction (AVX512-BF16's `VDPBF16PS`), with the float32 kernels' bits.
//!
//! # The instruction
//!
//! `VDPBF16PS acc, a, b` treats each 32-bit lane of `a` and `b` as a pair of
//! bfloat16 values (element `2j` the low half, `2j + 1` the high half) and
//! computes, per lane, `t = fma(a_hi, b_hi, acc)` then `r = fma(a_lo, b_lo,
//! t)`, each rounded to nearest-even, with denormals-are-zero on the inputs
//! and on `acc` and flush-to-zero on `t` and `r` (tininess after rounding),
//! whatever MXCSR says (Intel SDM, `VDPBF16PS` pseudocode; measured on AMD
//! EPYC Zen 4 against 184 candidate models, exactly one of which matched
//! all 900,000 adversarial inputs: this one). [`dp_model`] is that
//! semantics in portable Rust: the software model every CPU runs, so the
//! layout and order logic below are tested bit for bit where the
//! instruction does not exist.
//!
//! # Why the pair level gives the float32 kernel's bits
//!
//! The indexer's canonical order is one chain per (head, key): `dot =
//! fma(q_i, k_i, dot)` for `i = 0 .. d` in order from `+0.0`
//! ([`super::portable`]). Storing dimension `2i` in the **high** half of
//! pair `i` and `2i + 1` in the low half (keys and queries alike) makes one
//! instruction run two steps of that chain, in that order. The two differ
//! only where denormals-are-zero or flush-to-zero act, and the admission
//! rule ([`admits`]: every operand bfloat16-exact, the keys' and the
//! query's smallest exponents summing to at least −112; why it suffices is
//! in [`crate::simd::bf16dp`]) keeps every block where they could act on
//! the float32 kernel.
//!
//! A block that fails the rule is scored by the float32 kernel of the level
//! below (the fallback [`crate::simd::Isa::at_most`] describes), so the
//! answer is the float32 kernel's on every input. What would break it: a
//! pair layout with `2i` in the low half (the instruction would add
//! `q_{2i+1} k_{2i+1}` first), an accumulator split across lanes, or
//! admitting a block on the keys' exponents alone (a query of tiny
//! elements reaches the flushed range: with exponents in `[−80, −60]` on
//! both sides every score differs).
//!
//! The ReLU, the weights and the head fold stay float32 FMAs in head order,
//! as in every kernel; only the dot products run in pairs.

use super::{slot, Tiles, BLOCK};
#[cfg(target_arch = "x86_64")]
pub(super) use crate::simd::bf16dp::summary_of_smallest;
pub(super) use crate::simd::bf16dp::{admits, min_exponent};
/// The pair of dimensions `2i` (high half: multiplied first) and `2i + 1`.
pub(super) use crate::simd::bf16dp::{dp_model, pack};

/// Lanes per vector of the pair kernel (a 512-bit register of float32).
pub(super) const LANES: usize = 16;
const _: () = assert!(BLOCK == 2 * LANES);

/// The transposed block `kt` (`[d, BLOCK]`, float32) as pairs `kp`
/// (`[d / 2, BLOCK]`): `kp[i · BLOCK + r] = pack(kt[2i][r], kt[2i + 1][r])`.
/// Returns the block's exponent summary ([`min_exponent`]).
pub(super) fn pack_block(kt: &[f32], d: usize, kp: &mut [u32]) -> Option<i32> {
    assert!(d.is_multiple_of(2) && kt.len() == d * BLOCK && kp.len() == d / 2 * BLOCK);
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = crate::simd::avx512_token() {
        // SAFETY: the token proves AVX-512 F and BW (and AVX2).
        return unsafe { pack_block_avx512(t, kt, kp) };
    }
    pack_block_body(kt, kp)
}

/// [`pack_block`]'s pairs from the block's keys as bfloat16 rows (`rows`,
/// `[BLOCK, d]`, [`super::rows::block_rows`]): `kp[i · BLOCK + r] =
/// pack(k_r[2i], k_r[2i + 1])`, by bit moves alone.
pub(super) fn transpose_rows(rows: &[u16], d: usize, kp: &mut [u32]) {
    assert!(d.is_multiple_of(2) && rows.len() == BLOCK * d && kp.len() == d / 2 * BLOCK);
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = crate::simd::avx512_token() {
        // SAFETY: the token proves AVX-512 F, BW, DQ, VL, AVX2, FMA and F16C.
        return unsafe { super::avx512::transpose_pairs(t, rows, d, kp) };
    }
    transpose_rows_body(rows, d, kp);
}

/// [`transpose_rows`] a pair at a time.
pub(super) fn transpose_rows_body(rows: &[u16], d: usize, kp: &mut [u32]) {
    for (i, lanes) in kp.chunks_exact_mut(BLOCK).enumerate() {
        for (r, p) in lanes.iter_mut().enumerate() {
            let (hi, lo) = (rows[r * d + 2 * i], rows[r * d + 2 * i + 1]);
            *p = u32::from(hi) << 16 | u32::from(lo);
        }
    }
}

/// [`pack_block`] in 512-bit registers: each pair row from two rows of
/// `kt` by one select, the summary in the same pass (an OR of the values,
/// for bits below the bfloat16's; the unsigned minimum of `|x| − 1`, which
/// puts zeros last, for the smallest nonzero magnitude and so the smallest
/// exponent and any subnormal). The same pairs and summary as
/// [`pack_block_body`] on every input.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
fn pack_block_avx512(_: crate::simd::Avx512, kt: &[f32], kp: &mut [u32]) -> Option<i32> {
    use std::arch::x86_64::*;
    assert!(kt.len() == 2 * kp.len() && kp.len().is_multiple_of(BLOCK));
    let (src, dst) = (kt.as_ptr().cast::<i32>(), kp.as_mut_ptr().cast::<i32>());
    let hi = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    let magnitude = _mm512_set1_epi32(0x7FFF_FFFF);
    let one = _mm512_set1_epi32(1);
    let (mut or, mut min) = (_mm512_setzero_si512(), _mm512_set1_epi32(-1));
    for i in 0..kp.len() / BLOCK {
        for half in [0, LANES] {
            // SAFETY: `i < d / 2` and `half + LANES <= BLOCK`: `kt` rows
            // `2i` and `2i + 1` and `kp` row `i` (the lengths asserted).
            unsafe {
                let e = _mm512_loadu_si512(src.add(2 * i * BLOCK + half).cast());
                let o = _mm512_loadu_si512(src.add((2 * i + 1) * BLOCK + half).cast());
                // `hi ? e : o >> 16`, bit by bit.
                let p = _mm512_ternarylogic_epi32::<0xCA>(hi, e, _mm512_srli_epi32::<16>(o));
                _mm512_storeu_si512(dst.add(i * BLOCK + half).cast(), p);
                or = _mm512_ternarylogic_epi32::<0xFE>(or, e, o);
                for x in [e, o] {
                    let m = _mm512_sub_epi32(_mm512_and_si512(x, magnitude), one);
                    min = _mm512_min_epu32(min, m);
                }
            }
        }
    }
    let low = _mm512_reduce_or_epi32(_mm512_andnot_si512(hi, or));
    let least = _mm512_reduce_min_epu32(min) as u32;
    // `|x| − 1` wraps only for zeros: `least + 1` is the smallest nonzero
    // magnitude.
    match low {
        0 => summary_of_smallest((least != u32::MAX).then(|| least + 1)),
        _ => None,
    }
}

/// [`pack_block`]'s body.
#[inline(always)]
pub(super) fn pack_block_body(kt: &[f32], kp: &mut [u32]) -> Option<i32> {
    let summary = min_exponent(kt.iter().map(|x| x.to_bits()));
    for (i, lanes) in kp.chunks_exact_mut(BLOCK).enumerate() {
        let even = &kt[2 * i * BLOCK..(2 * i + 1) * BLOCK];
        let odd = &kt[(2 * i + 1) * BLOCK..(2 * i + 2) * BLOCK];
        for ((p, &e), &o) in lanes.iter_mut().zip(even).zip(odd) {
            *p = pack(e, o);
        }
    }
    summary
}

/// A query's heads as pairs in head tiles of eights ([`Tiles::Eights`] with
/// `d / 2` pairs per head: pair `i` of head `head` at `slot(.., d / 2,
/// head)`), and its exponent summary. Made from the query's float32 tiles.
pub(super) struct QueryPairs {
    pub qp: Vec<u32>,
    pub summary: Option<i32>,
}

impl QueryPairs {
    /// The pairs of `q` (`qt` in `tiles`, `h` heads of `d`, `d` even).
    pub fn new(tiles: Tiles, h: usize, d: usize, qt: &[f32]) -> Self {
        assert!(d.is_multiple_of(2) && qt.len() == h * d);
        let d2 = d / 2;
        let mut qp = vec![0u32; h * d2];
        for head in 0..h {
            let (base, stride) = slot(tiles, h, d, head);
            let (pbase, pstride) = slot(Tiles::Eights, h, d2, head);
            for i in 0..d2 {
                let (e, o) = (qt[base + 2 * i * stride], qt[base + (2 * i + 1) * stride]);
                qp[pbase + i * pstride] = pack(e, o);
            }
        }
        QueryPairs {
            qp,
            summary: min_exponent(qt.iter().map(|x| x.to_bits())),
        }
    }
}

/// The operations the pair kernel's skeleton ([`pair_sums`]) needs of a
/// vector of [`LANES`] float32 lanes (`V`) and of bfloat16 pairs (`P`): the
/// instruction's own registers, or the software model's arrays.
pub(super) trait PairOps: Copy {
    type V: Copy;
    type P: Copy;
    fn zero(self) -> Self::V;
    fn splat(self, x: f32) -> Self::V;
    fn splat_pair(self, x: u32) -> Self::P;
    /// [`LANES`] floats at `p`.
    ///
    /// # Safety
    /// `p` points at [`LANES`] readable floats.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// # Safety
    /// `p` points at [`LANES`] writable floats.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    /// # Safety
    /// `p` points at [`LANES`] readable pairs.
    unsafe fn load_pairs(self, p: *const u32) -> Self::P;
    /// Each lane's `VDPBF16PS`: `acc + a_hi b_hi + a_lo b_lo`, in that order.
    fn dp(self, acc: Self::V, a: Self::P, b: Self::P) -> Self::V;
    /// `x <= 0 ? 0 : x` per lane (NaN kept).
    fn relu(self, x: Self::V) -> Self::V;
    /// `fma(a, b, c)` per lane.
    fn fmadd(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// A hint to fetch line `i` of `run` (nothing past it; the model:
    /// nothing at all).
    fn prefetch_line(self, run: &[u8], i: usize);
}

/// The software model's lanes: arrays, each lane through [`dp_model`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Model;

impl PairOps for Model {
    type V = [f32; LANES];
    type P = [u32; LANES];
    fn zero(self) -> Self::V {
        [0.0; LANES]
    }
    fn splat(self, x: f32) -> Self::V {
        [x; LANES]
    }
    fn splat_pair(self, x: u32) -> Self::P {
        [x; LANES]
    }
    unsafe fn load(self, p: *const f32) -> Self::V {
        // SAFETY: `p` points at LANES readable floats (the contract).
        unsafe { p.cast::<[f32; LANES]>().read_unaligned() }
    }
    unsafe fn store(self, p: *mut f32, v: Self::V) {
        // SAFETY: `p` points at LANES writable floats (the contract).
        unsafe { p.cast::<[f32; LANES]>().write_unaligned(v) }
    }
    unsafe fn load_pairs(self, p: *const u32) -> Self::P {
        // SAFETY: `p` points at LANES readable pairs (the contract).
        unsafe { p.cast::<[u32; LANES]>().read_unaligned() }
    }
    fn dp(self, acc: Self::V, a: Self::P, b: Self::P) -> Self::V {
        std::array::from_fn(|l| dp_model(acc[l], a[l], b[l]))
    }
    fn relu(self, x: Self::V) -> Self::V {
        x.map(super::relu)
    }
    fn fmadd(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    fn prefetch_line(self, _: &[u8], _: usize) {}
}

/// For every key `r` of the block, `acc_r = fma(w_h, relu(dot_hr), acc_r)`
/// in head order, each `dot_hr` one chain over the pairs in order: what
/// [`super::portable::weighted_relu_sums`] computes, in pairs (`qp` the
/// query's pairs in tiles of eights, [`QueryPairs`]; `kp` `[d / 2, BLOCK]`,
/// [`pack_block`]). Tiles of 8, 4, then 1 heads; `next`'s lines (the
/// next block's bytes) prefetched along the way, spread over the tiles.
///
/// # Safety
/// The operations `s` stands for run on this CPU (a token inside `s`
/// proves it); the slices' lengths are asserted.
#[inline(always)]
pub(super) unsafe fn pair_sums<S: PairOps, const RELU: bool>(
    s: S,
    qp: &[u32],
    kp: &[u32],
    w: &[f32],
    d2: usize,
    acc: &mut [f32; BLOCK],
    next: &[u8],
) {
    let h = w.len();
    assert!(qp.len() == h * d2 && kp.len() == d2 * BLOCK);
    // One run of `next`'s lines per tile call, a line per pair.
    let tiles = h / 8 + usize::from(h % 8 >= 4) + h % 4;
    let mut runs = super::prefetch_runs(next, tiles);
    let mut run = || runs.next().unwrap_or_default();
    let mut h0 = 0;
    while h0 + 8 <= h {
        // SAFETY: heads `h0 .. h0 + 8 <= h`; the lengths asserted above.
        unsafe { tile::<S, 8, RELU>(s, qp, kp, w, d2, h0, acc, run()) };
        h0 += 8;
    }
    if h0 + 4 <= h {
        // SAFETY: heads `h0 .. h0 + 4 <= h`.
        unsafe { tile::<S, 4, RELU>(s, qp, kp, w, d2, h0, acc, run()) };
        h0 += 4;
    }
    for h0 in h0..h {
        // SAFETY: head `h0 < h`.
        unsafe { tile::<S, 1, RELU>(s, qp, kp, w, d2, h0, acc, run()) };
    }
}

/// Heads `h0 .. h0 + G` (a tile of the query's pairs) against the block,
/// folded into `acc` in head order; the lines of `pf` prefetched, one per
/// pair (the rest after).
///
/// # Safety
/// `qp.len() == w.len() · d2`, `kp.len() == d2 · BLOCK`, `h0 + G <=
/// w.len()` with `h0 .. h0 + G` a tile of [`QueryPairs`]' layout; the CPU
/// runs `s`'s operations.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
#[allow(clippy::too_many_arguments)]
unsafe fn tile<S: PairOps, const G: usize, const RELU: bool>(
    s: S,
    qp: &[u32],
    kp: &[u32],
    w: &[f32],
    d2: usize,
    h0: usize,
    acc: &mut [f32; BLOCK],
    pf: &[u8],
) {
    let (qp, kp) = (qp.as_ptr(), kp.as_ptr());
    let mut a = [[s.zero(); 2]; G];
    for i in 0..d2 {
        s.prefetch_line(pf, i);
        // SAFETY: `i < d2`: pair row `i` of `kp` (`BLOCK` lanes), and pair
        // `i` of the tile of heads `h0 .. h0 + G` (the contract).
        unsafe {
            let k0 = s.load_pairs(kp.add(i * BLOCK));
            let k1 = s.load_pairs(kp.add(i * BLOCK + LANES));
            let q = qp.add(h0 * d2 + i * G);
            for j in 0..G {
                let qv = s.splat_pair(*q.add(j));
                a[j][0] = s.dp(a[j][0], qv, k0);
                a[j][1] = s.dp(a[j][1], qv, k1);
            }
        }
    }
    for i in d2..pf.len().div_ceil(64) {
        s.prefetch_line(pf, i);
    }
    let ap = acc.as_mut_ptr();
    // SAFETY: `acc` holds `BLOCK = 2 × LANES` floats.
    let mut sum = unsafe { [s.load(ap), s.load(ap.add(LANES))] };
    for j in 0..G {
        let wv = s.splat(w[h0 + j]);
        for p in 0..2 {
            let x = match RELU {
                true => s.relu(a[j][p]),
                false => a[j][p],
            };
            sum[p] = s.fmadd(wv, x, sum[p]);
        }
    }
    // SAFETY: as above.
    unsafe {
        s.store(ap, sum[0]);
        s.store(ap.add(LANES), sum[1]);
    }
}

/// The instruction's lanes: 512-bit registers, `VDPBF16PS` for the pairs.
#[cfg(target_arch = "x86_64")]
pub(super) mod hw {
    use super::{PairOps, BLOCK, LANES};
    use crate::simd::bf16dp::dp;
    use crate::simd::Avx512Bf16;
    use std::arch::x86_64::*;

    /// The operations, each reached only with the token (which only
    /// detection, and the model check, make): every `unsafe` below runs
    /// AVX-512 F or AVX512-BF16 instructions the token proves.
    #[derive(Clone, Copy)]
    struct Hw(#[allow(dead_code)] Avx512Bf16);

    impl PairOps for Hw {
        type V = __m512;
        type P = __m512i;
        #[inline(always)]
        fn zero(self) -> __m512 {
            // SAFETY: AVX-512 F (the token).
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        fn splat(self, x: f32) -> __m512 {
            // SAFETY: AVX-512 F (the token).
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        fn splat_pair(self, x: u32) -> __m512i {
            // SAFETY: AVX-512 F (the token).
            unsafe { _mm512_set1_epi32(x as i32) }
        }
        #[inline(always)]
        unsafe fn load(self, p: *const f32) -> __m512 {
            // SAFETY: AVX-512 F (the token); `p` points at 16 readable floats.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32, v: __m512) {
            // SAFETY: AVX-512 F (the token); `p` points at 16 writable floats.
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn load_pairs(self, p: *const u32) -> __m512i {
            // SAFETY: AVX-512 F (the token); `p` points at 16 readable pairs.
            unsafe { _mm512_loadu_si512(p.cast()) }
        }
        #[inline(always)]
        fn dp(self, acc: __m512, a: __m512i, b: __m512i) -> __m512 {
            // SAFETY: AVX512-BF16 (the token).
            unsafe { dp(acc, a, b) }
        }
        #[inline(always)]
        fn relu(self, x: __m512) -> __m512 {
            // SAFETY: AVX-512 F (the token). `x <= 0 ? 0 : x`, NaN kept.
            unsafe {
                let zero = _mm512_setzero_ps();
                _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, zero), zero)
            }
        }
        #[inline(always)]
        fn fmadd(self, a: __m512, b: __m512, c: __m512) -> __m512 {
            // SAFETY: AVX-512 F (the token).
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn prefetch_line(self, run: &[u8], i: usize) {
            super::super::prefetch_line(run, i);
        }
    }

    /// [`super::pair_sums`] with the instruction.
    ///
    /// # Safety
    /// None beyond the token's (the lengths are asserted inside).
    #[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(in super::super) unsafe fn sums<const RELU: bool>(
        t: Avx512Bf16,
        qp: &[u32],
        kp: &[u32],
        w: &[f32],
        d2: usize,
        acc: &mut [f32; BLOCK],
        next: &[u8],
    ) {
        const _: () = assert!(LANES == 16);
        // SAFETY: `Hw`'s operations run on this CPU (the token).
        unsafe { super::pair_sums::<Hw, RELU>(Hw(t), qp, kp, w, d2, acc, next) }
    }
}
