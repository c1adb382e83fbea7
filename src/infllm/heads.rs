//! Stage 1 with the group's query heads in the lanes (`infllm.head_sums`):
//! [`group_sums`], the same bits as [`super::score::group_sums`].
//!
//! # Why a second layout
//!
//! [`super::score::group_sums`] puts 8 keys in a vector's lanes: the
//! compressed keys are first packed as `K^T` (a copy of every key, each
//! call), then scored in tiles of 4 heads by 16 keys (8 accumulators, 6
//! loads for 8 fused multiply-adds). When a KV head's group has 8 query
//! heads or more (NSA's and fla's GQA group of 16), the heads fill the lanes
//! instead: the group's queries are transposed once (`[d][w]`, `w` the
//! heads rounded up to 8, at most 32: 8 KiB for 16 heads at `d = 128`),
//! each compressed key is read in place, and each of its elements is
//! broadcast against `w` heads' query elements. A tile is 8 heads by 12
//! keys, 16 by 6, 24 by 3 or 32 by 2 (at most 12 accumulators and 16
//! registers); each key is loaded once for the whole chunk and nothing is
//! packed. The logits come out key-major (`[key][head]`), so the softmax's
//! maximum is kept in the score pass (a vector maximum a tile), and its
//! exponentials (four vectors side by side, `crate::exp::avx2::exp_n`) and
//! the group sum run over 8 heads a vector.
//!
//! At AVX-512 ([`Staged`], 16 heads a vector) a tile is 16 heads by 16
//! keys or 32 by 8: 16 accumulators of the 32 registers, and a batch of 32
//! keys in whole tiles (32 heads by 6 keys left a tile of 2, four chains
//! waiting on their own latency: 76 against 81 GFMA/s a chunk in cache,
//! Intel Xeon; 12 keys spilled). A tile's bfloat16 rows are widened to
//! float32 first (exactly their values), so each broadcast is a load alone:
//! a bfloat16 element broadcast as 16-bit copies and shifted took two
//! operations on the two 512-bit FMA ports (NSA's bfloat16 cached decode
//! 1.96 against 1.45 ms for float32 keys; widened, within 10% of it).
//!
//! Several queries may share a chunk when every vector's lanes see one key
//! count ([`one_count_a_vector`]): always for a group a multiple of 8 (NSA's
//! `stage` puts two decode queries of a group of 16 in one, four of a group
//! of 8), and for queries of a smaller group that see the same keys
//! (InfLLM-v2's dense decode of a speculative step: sixteen queries of 2
//! heads fill one chunk). The keys are then read once for them, and each
//! broadcast key element feeds four vectors, not two; a vector of several
//! queries adds each lane's `e / Z` into its own query's sums, lane by lane
//! (each query's heads still in order). On Zen 3 a
//! broadcast (from memory, or a register shuffle alike) issues about once a
//! cycle, so 16 heads by 6 keys (one broadcast for two fused multiply-adds)
//! runs at about 0.82 of the floor's rate and 32 heads by 2 keys at 0.90
//! (best of 300 passes over 2,048 keys, `d = 128`, load 3-4); 8 heads by 12
//! keys, one broadcast a multiply-add, at 0.5.
//!
//! Measured (AMD EPYC Zen 3, one thread, NSA's cached decode: 16 heads,
//! 2,048 keys, `d = 128`): the score pass about 0.79 of
//! `kvselect._core._fma_floor`'s rate a query, 0.85-0.87 with two queries
//! a chunk, against about 0.75 for the packed tiles, with no packing (9% of
//! that call).
//!
//! At prefill each query sees few keys (64 on average at 8,192 tokens in
//! blocks of 64), so what a chunk does besides its tiles counts: its
//! queries are transposed by 8×8 register transposes at AVX2 (element by
//! element they took a sixth of the call); the next chunk's query rows
//! (`next`, 256 MiB of queries stream from memory) are asked into the L2 a
//! few lines a tile, since all at once most prefetches were dropped; and a
//! vector's last keys (past its last whole 8) take their exponentials
//! vectors side by side and their `e / Z` a vector at a time. A copy, a
//! prefetch and the same operations on the same lanes: the same bits. A
//! tile of 24 heads by 4 keys (three queries of 16 heads over two chunks)
//! and one of 32 by 3 were slower (registers spilled). From
//! [`super::panels::MIN_QUERIES`] queries a call NSA's `stage` scores on
//! keys packed once into panels instead ([`super::panels`]: no query
//! transposes); this layout serves decode, where a copy of the compressed
//! keys a call would cost more than the few queries' scores.
//!
//! The keys may be float32 or bfloat16 bits ([`Elem`]): a bfloat16 element
//! is broadcast as 16-bit copies shifted into float32 lanes (at AVX-512, a
//! tile's rows are widened into a small float32 buffer first), exactly its
//! float32 value, so the bits are those of its decoded keys (and no copy of
//! the keys is written).
//!
//! # The rule, and why the bits are [`super::score::group_sums`]'s
//!
//! `S_j = Σ_h e_hj / Z_h` (heads in order, from `+0.0`) with `e_hj =
//! exp(s_hj − m_h)`, `s_hj = (q_h · k_j) · scale`, `m_h = max_j s_hj + 0`:
//!
//! - each logit is one chain `acc = fma(q_hc, k_jc, acc)` over `c` in order
//!   from `+0.0`, then `acc · scale` — the packed kernel's chain, whatever
//!   lane it sits in;
//! - the maximum is exact (NaN ignored, as `x > m` and `max(x, m)` both
//!   ignore it; `−0` and `+0` made one by the `+ 0.0`), so its order is
//!   free;
//! - `Z_h` keeps the packed softmax's 8 lanes: key `j` adds into lane `j %
//!   8` in key order from `+0.0`, the keys up to the next multiple of 8 as
//!   `exp(−inf − m_h)` (the packed row's `−inf` padding: `+0` added to a
//!   lane that is `+0` or more or NaN, which changes nothing, so the AVX2
//!   kernel skips it; it is NaN only when `m_h = −inf`, and then every key
//!   of the head already made its lanes NaN), then
//!   `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`;
//! - `e_hj / Z_h` is the same division, added to `S_j` head by head in
//!   order (a chunk of 32 heads after the one before it).
//!
//! [`Staged`] splits a chunk at its pass 1 for a caller that produces the
//! keys as it goes (NSA's decode with Eq. 9's window scores each batch of
//! compressed keys as its compression completes them): the same tiles write
//! the same logits (each its own chain, whichever tile computes it) and keep
//! the same maxima (exact, so the order of the keys is free), then the same
//! softmax and group sum: the same bits. Its tiles may also ask for the
//! caller's next bytes, a line a trip (`prefetcht0`: see
//! [`Staged::score`]).
//!
//! What would break it: a reciprocal multiplied instead of the division, an
//! online (rescaled) softmax, another lane assignment or tree for `Z_h`, the
//! heads summed in another order, a vector holding queries that see
//! different key counts (the AVX2 kernels keep one count a vector for its
//! maximum and softmax: asserted), or a lane's `e / Z` added into another
//! query's sums. `src/infllm/tests.rs` checks the two
//! layouts bit for bit at every level (groups of 8 to 33, key counts off
//! the tiles, infinite and NaN logits), `src/nsa/tests.rs` the rows.

use super::score::Scratch;
use crate::simd::lines::Floats;
use crate::simd::{dispatch, Isa};

/// Heads a chunk: up to four 8-lane vectors.
const CHUNK: usize = 32;

/// Whether a group of `heads` query heads is scored with its heads in the
/// lanes ([`group_sums`]): 8 or more (fewer would leave lanes empty).
pub(crate) fn in_lanes(heads: usize) -> bool {
    heads >= 8
}

/// One KV head's compressed keys where they lie: key `j` is
/// `ck[base + j · stride..][..d]` (`[n_c, n_kv, d]`: `base = g · d`,
/// `stride = n_kv · d`), float32 or bfloat16 bits ([`Elem`]).
pub(crate) struct Rows<'a, E> {
    pub ck: &'a [E],
    pub base: usize,
    pub stride: usize,
}

impl<E> Clone for Rows<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for Rows<'_, E> {}

/// A compressed key's element as the kernels read it: float32, or
/// bfloat16 bits (exactly the float32 `bits << 16`, as `keys::bf16_to_f32`
/// decodes them: the same values, so the same bits downstream).
pub(crate) trait Elem: Copy + Send + Sync {
    /// The element's float32 value.
    fn value(self) -> f32;
    /// The element at `p` in every lane.
    ///
    /// # Safety
    /// AVX2 is available and `p` is readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn splat(p: *const Self) -> std::arch::x86_64::__m256;
    /// The element at `p` in every lane of a 512-bit register.
    ///
    /// # Safety
    /// AVX-512 F and BW are available and `p` is readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn splat16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Whether [`Elem::splat16`] costs arithmetic (bfloat16: a shift after
    /// the broadcast, on the FMA ports): the AVX-512 tiles then widen their
    /// keys' rows to float32 first ([`Elem::widen`]) and broadcast those.
    #[cfg(target_arch = "x86_64")]
    const NARROW: bool;
    /// Elements `0..len` from `p` as float32 values to `out`.
    ///
    /// # Safety
    /// AVX-512 F and BW are available; `len` elements are readable at `p`
    /// and `len` floats writable at `out`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn widen(p: *const Self, len: usize, out: *mut f32);
}

impl Elem for f32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: `p` is readable (the contract).
        unsafe { std::arch::x86_64::_mm256_broadcast_ss(&*p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn splat16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: `p` is readable and AVX-512 F is available (the contract).
        unsafe { std::arch::x86_64::_mm512_set1_ps(p.read()) }
    }
    #[cfg(target_arch = "x86_64")]
    const NARROW: bool = false;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen(p: *const f32, len: usize, out: *mut f32) {
        // SAFETY: `len` floats at each (the contract).
        unsafe { std::ptr::copy_nonoverlapping(p, out, len) }
    }
}

impl Elem for u16 {
    #[inline(always)]
    fn value(self) -> f32 {
        crate::keys::bf16_to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn splat(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // 16 copies of the bits, then each 32-bit lane shifted left by 16:
        // `(b | b << 16) << 16` is `b << 16` in 32 bits.
        // SAFETY: `p` is readable and AVX2 is available (the contract).
        unsafe {
            let b = _mm256_set1_epi16(p.read_unaligned() as i16);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn splat16(p: *const u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // As `splat`, 32 copies.
        // SAFETY: `p` is readable and AVX-512 F/BW are available (the
        // contract).
        unsafe {
            let b = _mm512_set1_epi16(p.read_unaligned() as i16);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(b))
        }
    }
    #[cfg(target_arch = "x86_64")]
    const NARROW: bool = true;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen(p: *const u16, len: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        // Each element's bits shifted into the high half of a 32-bit lane:
        // exactly its float32 value, as `splat16` and `value` give it.
        let mut i = 0;
        // SAFETY: `len` elements at `p` and floats at `out` (the contract),
        // 16 a step while 16 remain; AVX-512 F/BW (the contract).
        unsafe {
            while i + 16 <= len {
                let b = _mm256_loadu_si256(p.add(i).cast());
                let x = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b));
                _mm512_storeu_ps(out.add(i), _mm512_castsi512_ps(x));
                i += 16;
            }
            while i < len {
                *out.add(i) = p.add(i).read_unaligned().value();
                i += 1;
            }
        }
    }
}

/// [`super::score::group_sums`] with the heads in the lanes, for each query
/// `s` of `qs` at once: its `heads` query rows of `d` start at `q[qs[s]..]`,
/// it sees keys `0..n_vis[s]` of `keys`, and its sums go to
/// `scratch.sums[s · n..][..n_vis[s]]` (`n` the largest `n_vis`; zeros when
/// `n_vis[s] == 0`), the same bits as the packed form on that query alone. Several queries share a chunk (the keys read once
/// for all of them) only when `heads` is a multiple of 8, so that each
/// vector holds one query's heads (asserted).
///
/// `next` is what the caller reads next (the next chunk's query rows):
/// asked into the second-level cache a few lines a tile while the first
/// chunk's logits are computed (its misses overlap the arithmetic; all at
/// once, most of the prefetches were dropped). Empty: nothing. No effect
/// on results.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_sums<E: Elem>(
    isa: Isa,
    q: &[f32],
    qs: &[usize],
    heads: usize,
    d: usize,
    keys: Rows<'_, E>,
    n_vis: &[usize],
    scale: f32,
    scratch: &mut Scratch,
    next: &[f32],
) {
    assert_eq!(qs.len(), n_vis.len(), "a key count a query");
    let n_max = n_vis.iter().copied().max().unwrap_or(0);
    scratch.sums.clear();
    scratch.sums.resize(qs.len() * n_max, 0.0);
    let total = qs.len() * heads;
    if n_max == 0 || total == 0 {
        return;
    }
    let Rows { ck, base, stride } = keys;
    assert!(
        one_count_a_vector(heads, n_vis)
            && qs.iter().all(|&o| o + heads * d <= q.len())
            && base + (n_max - 1) * stride + d <= ck.len(),
        "a query or key row past its array, or a vector's queries seeing different key counts"
    );
    let n8 = n_max.next_multiple_of(8);
    let widest = total.min(CHUNK).next_multiple_of(8);
    if scratch.logits.len() < n8 * widest {
        scratch.logits.resize(n8 * widest, 0.0);
    }
    for h0 in (0..total).step_by(CHUNK) {
        let hc = CHUNK.min(total - h0);
        let w = hc.next_multiple_of(8);
        // The chunk's queries transposed, `qt[c · w + l]` = element `c` of
        // head `(h0 + l) % heads` of query `(h0 + l) / heads`; the lanes
        // past the chunk's heads 0 (their sums are never read). A copy: any
        // method gives the same bits (8×8 register transposes at AVX2).
        scratch.qt.clear();
        scratch.qt.resize(d * w, 0.0);
        let rows = QueryRows {
            q,
            qs,
            heads,
            h0,
            hc,
            d,
        };
        let (qt, logits, sums) = (&mut scratch.qt, &mut scratch.logits, &mut scratch.sums);
        let heads_at = Heads {
            h0,
            hc,
            group: heads,
            n_vis,
            n_max,
            next: if h0 == 0 {
                bytemuck::cast_slice(next)
            } else {
                &[]
            },
        };
        // SAFETY (bounds): the transposes slice their arguments; `qt` is
        // `d · w` floats; keys `0..n_max` lie in `ck` (asserted above);
        // `logits` holds `n8 · widest >= n8 · w` floats and `sums` `n_max`
        // for each query; `hc <= w`, `w` one of 8, 16, 24, 32; a vector's
        // lanes see one key count (asserted above).
        dispatch!("infllm.head_sums", isa, {
            avx512 => avx2,
            avx2(t) => {
                avx2::transpose_queries(t, rows, w, qt);
                let qt = &*qt;
                match w {
                    8 => avx2::chunk::<E, 1, 12>(t, qt, keys, d, scale, heads_at, logits, sums),
                    16 => avx2::chunk::<E, 2, 6>(t, qt, keys, d, scale, heads_at, logits, sums),
                    24 => avx2::chunk::<E, 3, 3>(t, qt, keys, d, scale, heads_at, logits, sums),
                    _ => avx2::chunk::<E, 4, 2>(t, qt, keys, d, scale, heads_at, logits, sums),
                }
            },
            scalar => {
                rows.transpose_lanes(0, w, qt);
                portable::chunk(qt, w, keys, d, scale, heads_at, logits, sums)
            },
        });
    }
}

/// Whether every vector of 8 lanes (the queries' heads laid end to end, `heads`
/// a query, 8 lanes at a time: a chunk starts at a multiple of 32) holds
/// heads of queries that see one key count: the AVX2 kernels keep a key
/// count a vector (its maximum's and softmax's keys). True for one query,
/// or a group a multiple of 8 (a vector one query's heads); queries of a
/// smaller group share a vector when they see the same keys.
pub(crate) fn one_count_a_vector(heads: usize, n_vis: &[usize]) -> bool {
    let total = n_vis.len() * heads;
    (0..total).step_by(8).all(|l| {
        let (a, b) = (l / heads, (l + 7).min(total - 1) / heads);
        n_vis[a..=b].iter().all(|&n| n == n_vis[a])
    })
}

/// A chunk's query rows: lane `l < hc` is head `(h0 + l) % heads` of query
/// `(h0 + l) / heads`, its `d` elements at `q[qs[query] + head · d..]`.
#[derive(Clone, Copy)]
struct QueryRows<'a> {
    q: &'a [f32],
    qs: &'a [usize],
    heads: usize,
    h0: usize,
    hc: usize,
    d: usize,
}

impl QueryRows<'_> {
    /// Lane `l`'s row.
    #[inline(always)]
    fn row(&self, l: usize) -> &[f32] {
        let (sq, h) = ((self.h0 + l) / self.heads, (self.h0 + l) % self.heads);
        &self.q[self.qs[sq] + h * self.d..][..self.d]
    }

    /// Lanes `from..hc` transposed into `qt[c · w + l]`, element by element.
    fn transpose_lanes(&self, from: usize, w: usize, qt: &mut [f32]) {
        for l in from..self.hc {
            for (c, &x) in self.row(l).iter().enumerate() {
                qt[c * w + l] = x;
            }
        }
    }
}

/// A chunk's heads: `hc` of them from head `h0` of the queries' heads laid
/// end to end, `group` a query (head `H` is query `H / group`'s), query `s`
/// seeing keys `0..n_vis[s]`, its sums `n_max` apart; `next` the bytes to
/// prefetch meanwhile (see [`group_sums`]).
#[derive(Clone, Copy)]
struct Heads<'a> {
    h0: usize,
    hc: usize,
    group: usize,
    n_vis: &'a [usize],
    n_max: usize,
    // (read by the x86 kernel's prefetch only)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    next: &'a [u8],
}

impl Heads<'_> {
    /// The query of the chunk's lane `l`.
    #[inline(always)]
    fn query(&self, l: usize) -> usize {
        (self.h0 + l) / self.group
    }

    /// The keys lane `l`'s query sees.
    #[inline(always)]
    fn seen(&self, l: usize) -> usize {
        self.n_vis[self.query(l)]
    }

    /// The fewest and the most keys the chunk's queries see.
    fn range(&self) -> (usize, usize) {
        // The chunk's lanes are the heads of queries `query(0) ..=
        // query(hc − 1)`, each of them at least one lane.
        let mut r = (usize::MAX, 0);
        for &n in &self.n_vis[self.query(0)..=self.query(self.hc - 1)] {
            r = (r.0.min(n), r.1.max(n));
        }
        r
    }
}

/// The kernels' shared steps.
#[inline(always)]
pub(super) fn reduce8(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// [`Staged::score`]'s walk over keys `j..j + count`, at every level:
/// tiles of `k_max` keys, then of 2, then 1, none straddling `n_min` (a
/// tile's maxima go to `m`, the keys every query sees, or to `past`, set
/// aside); `pf` handed out `d / 2` lines a tile. `tile(k, n, maxima, pf)`
/// scores keys `j + k .. j + k + n`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn staged_walk<M>(
    n_min: usize,
    j: usize,
    count: usize,
    k_max: usize,
    d: usize,
    mut pf: &[u8],
    m: &mut M,
    past: &mut M,
    mut tile: impl FnMut(usize, usize, &mut M, &[u8]),
) {
    let mut k = 0;
    while k < count {
        let jk = j + k;
        let maxima = if jk < n_min { &mut *m } else { &mut *past };
        // This tile's share of `pf` (a line a step), the rest after it.
        let (now, rest) = pf.split_at(pf.len().min(d / 2 * 64));
        // Tiles of `k_max` keys (the one-pass kernel's: fewer query loads a
        // key than tiles of 2 for a chunk of one query's 8 or 16 heads),
        // then of 2, then 1.
        let n = if k_max > 2 && k + k_max <= count && (jk + k_max - 1 < n_min || jk >= n_min) {
            k_max
        } else if k + 2 <= count && (jk + 1 < n_min || jk >= n_min) {
            2
        } else {
            1
        };
        tile(k, n, maxima, now);
        k += n;
        pf = rest;
    }
}

mod portable {
    use super::{reduce8, Elem, Heads, Rows};
    use crate::exp::exp_scalar;

    /// One chunk of `heads.hc <= w` heads (`w` lanes, 8 to 32), element by
    /// element: the logits key-major into `logits[j · w + l]`, each head's
    /// softmax over them, `e / Z` added into its query's sums head by head.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn chunk<E: Elem>(
        qt: &[f32],
        w: usize,
        keys: Rows<'_, E>,
        d: usize,
        scale: f32,
        heads: Heads<'_>,
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        let (_, n_vis) = heads.range();
        let mut mx = [f32::NEG_INFINITY; super::CHUNK];
        for j in 0..n_vis {
            let row = &keys.ck[keys.base + j * keys.stride..][..d];
            key(
                qt,
                w,
                row,
                scale,
                heads,
                j,
                &mut logits[j * w..(j + 1) * w],
                &mut mx,
            );
        }
        finish(w, heads, &mx, logits, sums);
    }

    /// Key `j`'s logits (`row` its `d` elements) against the chunk's `w`
    /// lanes into `out`, each lane's maximum over the keys its query sees
    /// into `mx`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn key<E: Elem>(
        qt: &[f32],
        w: usize,
        row: &[E],
        scale: f32,
        heads: Heads<'_>,
        j: usize,
        out: &mut [f32],
        mx: &mut [f32; super::CHUNK],
    ) {
        let mut acc = [0.0f32; super::CHUNK];
        for (c, &k) in row.iter().enumerate() {
            let k = k.value();
            let qc = &qt[c * w..(c + 1) * w];
            for (a, &x) in acc.iter_mut().zip(qc) {
                *a = x.mul_add(k, *a);
            }
        }
        for (l, ((o, &a), m)) in out.iter_mut().zip(&acc).zip(mx.iter_mut()).enumerate() {
            *o = a * scale;
            if *o > *m && l < heads.hc && j < heads.seen(l) {
                *m = *o;
            }
        }
    }

    /// [`chunk`] after its logits (`mx` each lane's maximum over its
    /// query's keys): each head's softmax, `e / Z` added into its query's
    /// sums head by head.
    pub(super) fn finish(
        w: usize,
        heads: Heads<'_>,
        mx: &[f32; super::CHUNK],
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        let hc = heads.hc;
        let (_, n_vis) = heads.range();
        let mut z = [0.0f32; super::CHUNK];
        for l in 0..hc {
            let (m, seen) = (mx[l] + 0.0, heads.seen(l));
            let mut lanes = [0.0f32; 8];
            for j in 0..seen.next_multiple_of(8) {
                let x = if j < seen {
                    logits[j * w + l]
                } else {
                    f32::NEG_INFINITY
                };
                let e = exp_scalar(x - m);
                if j < seen {
                    logits[j * w + l] = e;
                }
                lanes[j % 8] += e;
            }
            z[l] = reduce8(lanes);
        }
        for j in 0..n_vis {
            for l in 0..hc {
                if j < heads.seen(l) {
                    sums[heads.query(l) * heads.n_max + j] += logits[j * w + l] / z[l];
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Accumulator arrays are indexed on purpose: they must stay in registers.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use super::{Elem, Heads, QueryRows, Rows};
    use crate::exp::avx2::exp_n;
    use crate::keys::CacheLevel;
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// [`QueryRows::transpose_lanes`] (all lanes) by 8×8 register
    /// transposes: whole groups of 8 lanes and 8 elements, the rest element
    /// by element. The same values in the same places.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn transpose_queries(_: Avx2, rows: QueryRows<'_>, w: usize, qt: &mut [f32]) {
        let (hc, d) = (rows.hc, rows.d);
        let (l8, d8) = (hc / 8 * 8, d / 8 * 8);
        for l0 in (0..l8).step_by(8) {
            let src: [&[f32]; 8] = std::array::from_fn(|t| rows.row(l0 + t));
            for c0 in (0..d8).step_by(8) {
                let mut r = [_mm256_setzero_ps(); 8];
                for t in 0..8 {
                    let x = &src[t][c0..c0 + 8];
                    // SAFETY: `x` is 8 floats.
                    r[t] = unsafe { _mm256_loadu_ps(x.as_ptr()) };
                }
                let c = transpose8(r);
                for t in 0..8 {
                    let o = &mut qt[(c0 + t) * w + l0..][..8];
                    // SAFETY: `o` is 8 floats.
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), c[t]) };
                }
            }
            for (t, row) in src.iter().enumerate() {
                for c in d8..d {
                    qt[c * w + l0 + t] = row[c];
                }
            }
        }
        rows.transpose_lanes(l8, w, qt);
    }

    /// [`super::portable::chunk`] with `V` vectors of 8 heads (`w = 8 V`),
    /// `K` keys a tile (`V · K = 12` accumulators).
    ///
    /// # Safety
    /// `_token` proves AVX2+FMA; `qt.len() >= d · 8V`; keys `0..n_vis`
    /// (`n_vis >= 1`) lie in `keys.ck`; `logits.len() >= round_up(n_vis, 8)
    /// · 8V`; `sums` holds `n_vis` for every query of the chunk's heads;
    /// `heads.hc <= 8V`, and each vector's lanes see one key count
    /// ([`super::one_count_a_vector`]).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn chunk<E: Elem, const V: usize, const K: usize>(
        _token: Avx2,
        qt: &[f32],
        keys: Rows<'_, E>,
        d: usize,
        scale: f32,
        heads: Heads<'_>,
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        // SAFETY: the contract.
        unsafe {
            let mx = pass1::<E, V, K>(qt, keys, d, scale, heads, logits);
            finish::<V>(heads, mx, logits, sums)
        }
    }

    /// [`chunk`]'s pass 1: the logits of keys `0..n_vis`, key-major, and
    /// each lane's maximum over the keys every query of the chunk sees
    /// (`0..n_min`, [`Heads::range`]), returned.
    ///
    /// # Safety
    /// [`chunk`]'s contract.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pass1<E: Elem, const V: usize, const K: usize>(
        qt: &[f32],
        keys: Rows<'_, E>,
        d: usize,
        scale: f32,
        heads: Heads<'_>,
        logits: &mut [f32],
    ) -> [__m256; V] {
        let (n_min, n_vis) = heads.range();
        let lp = logits.as_mut_ptr();
        // Pass 1: the logits, key-major, and each lane's maximum over the
        // keys every query of the chunk sees; then over each vector's own.
        let mut mx = [_mm256_set1_ps(f32::NEG_INFINITY); V];
        // `next`'s lines spread over the whole tiles (all of them when
        // there are none).
        // Few keys (a prefill's: 128 at 8,192 tokens, 256 KiB for 4 KV
        // heads) stay in the L2 between chunks: no prefetch of the next
        // tile's rows (16 instructions a tile of 2 keys).
        let ahead = n_vis > PREFETCH_KEYS_MIN;
        let tiles = n_min / K;
        let per = heads.next.len().div_ceil(64).div_ceil(tiles.max(1)) * 64;
        // The second-level hint here: not measured against the first (the
        // staged tiles' and the panels' were, on AMD Zen 4).
        if tiles == 0 {
            crate::keys::prefetch(heads.next, 0, heads.next.len(), CacheLevel::L2);
        }
        let mut j = 0;
        let mut at = 0;
        while j + K <= n_min {
            crate::keys::prefetch(heads.next, at, at + per, CacheLevel::L2);
            at += per;
            // SAFETY: keys `j..j + K` are below `n_vis`; the contract.
            unsafe { tile::<E, V, K>(qt, keys, d, j, scale, lp, &mut mx, ahead, &[]) };
            j += K;
        }
        while j < n_min {
            // SAFETY: as above, one key.
            unsafe { tile::<E, V, 1>(qt, keys, d, j, scale, lp, &mut mx, ahead, &[]) };
            j += 1;
        }
        let mut past = mx;
        while j < n_vis {
            // SAFETY: as above; the maxima of these keys are set aside.
            unsafe { tile::<E, V, 1>(qt, keys, d, j, scale, lp, &mut past, ahead, &[]) };
            j += 1;
        }
        mx
    }

    /// [`chunk`] after pass 1: `mx` each lane's maximum over keys
    /// `0..n_min`, the logits of keys `0..n_vis` in `logits`; each vector's
    /// maximum over its own keys, the exponentials, `Z` and `e / Z` added
    /// into the sums.
    ///
    /// # Safety
    /// [`chunk`]'s contract (the keys aside).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn finish<const V: usize>(
        heads: Heads<'_>,
        mx: [__m256; V],
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        // SAFETY: the contract.
        unsafe {
            let (m, seen) = maxima::<V>(heads, mx, logits);
            let mut lanes = [[_mm256_setzero_ps(); 8]; V];
            let (n_min, _) = heads.range();
            bulk::<V>(&m, n_min / 8 * 8, logits, &mut lanes);
            finish_from::<V>(heads, &m, &seen, lanes, logits, sums)
        }
    }

    /// [`finish`]'s first step: each vector's maximum over its own keys
    /// past `n_min` folded into `mx`, `+ 0`, and each vector's key count.
    ///
    /// # Safety
    /// [`chunk`]'s contract (the keys aside).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn maxima<const V: usize>(
        heads: Heads<'_>,
        mut mx: [__m256; V],
        logits: &[f32],
    ) -> ([__m256; V], [usize; V]) {
        let (w, hc) = (8 * V, heads.hc);
        let (n_min, _) = heads.range();
        // Each vector's keys (one query's heads a vector).
        let mut seen = [0usize; V];
        for v in 0..V {
            seen[v] = if v * 8 < hc { heads.seen(v * 8) } else { 0 };
        }
        let lp = logits.as_ptr();
        for v in 0..V {
            for j in n_min..seen[v] {
                // SAFETY: `j < n_vis`: its row is in the logits.
                let x = unsafe { _mm256_loadu_ps(lp.add(j * w + v * 8)) };
                mx[v] = _mm256_max_ps(x, mx[v]);
            }
        }
        let mut m = [_mm256_setzero_ps(); V];
        for v in 0..V {
            m[v] = _mm256_add_ps(mx[v], _mm256_setzero_ps());
        }
        (m, seen)
    }

    /// Pass 2 over keys `0..full` (a multiple of 8, every lane's keys):
    /// each lane's exponentials written over the logits and added into its
    /// lane sums `lanes[v][j % 8]`, the chunk's vectors side by side (a
    /// key's row read once).
    ///
    /// # Safety
    /// AVX2+FMA; `logits` holds rows `0..full` of `8V`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bulk<const V: usize>(
        m: &[__m256; V],
        full: usize,
        logits: &mut [f32],
        lanes: &mut [[__m256; 8]; V],
    ) {
        let w = 8 * V;
        let lp = logits.as_mut_ptr();
        for j0 in (0..full).step_by(8) {
            // The block's `8V` vectors (key `t`, vector `v` at `t · V + v`),
            // four exponentials side by side.
            for g in (0..8 * V).step_by(4) {
                let mut x = [_mm256_setzero_ps(); 4];
                for u in 0..4 {
                    let (t, v) = ((g + u) / V, (g + u) % V);
                    // SAFETY: `j0 + t < full`: its row is in the logits.
                    let y = unsafe { _mm256_loadu_ps(lp.add((j0 + t) * w + v * 8)) };
                    x[u] = _mm256_sub_ps(y, m[v]);
                }
                let e = exp_n(x);
                for u in 0..4 {
                    let (t, v) = ((g + u) / V, (g + u) % V);
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_ps(lp.add((j0 + t) * w + v * 8), e[u]) };
                    lanes[v][t] = _mm256_add_ps(lanes[v][t], e[u]);
                }
            }
        }
    }

    /// [`finish`] after pass 2 over keys `0..full` (`full = n_min / 8 ·
    /// 8`, at any level, its lane sums in `lanes`): pass 2 over each
    /// vector's last keys, `Z`, and pass 3.
    ///
    /// # Safety
    /// [`chunk`]'s contract (the keys aside); `m` and `seen` from
    /// [`maxima`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn finish_from<const V: usize>(
        heads: Heads<'_>,
        m: &[__m256; V],
        seen: &[usize; V],
        mut lanes: [[__m256; 8]; V],
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        let (w, hc) = (8 * V, heads.hc);
        let (n_min, n_vis) = heads.range();
        let full = n_min / 8 * 8;
        let lp = logits.as_mut_ptr();
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        // The rest: each vector's own keys, the chunk's vectors side by
        // side. The `−inf` padding to the next multiple of 8 adds
        // `exp(−inf − m) = +0` to a lane sum that is `+0` or more (or NaN),
        // which leaves it as it is: it is skipped.
        for j in full..n_vis {
            let mut x = [ninf; V];
            for v in 0..V {
                if j < seen[v] {
                    // SAFETY: `j < n_vis`: its row is in the logits.
                    let y = unsafe { _mm256_loadu_ps(lp.add(j * w + v * 8)) };
                    x[v] = _mm256_sub_ps(y, m[v]);
                }
            }
            let e = exp_n(x);
            for v in 0..V {
                if j < seen[v] {
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_ps(lp.add(j * w + v * 8), e[v]) };
                    lanes[v][j % 8] = _mm256_add_ps(lanes[v][j % 8], e[v]);
                }
            }
        }
        let mut z = [_mm256_setzero_ps(); V];
        for v in 0..V {
            let l = lanes[v];
            z[v] = _mm256_add_ps(
                _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])),
            );
        }
        // Each lane's query's sums (a vector may hold the heads of several
        // queries of a small group), and whether the vector is one query's.
        let mut lane_at = [[0usize; 8]; V];
        let mut single = [true; V];
        for v in 0..V {
            let lanes = 8.min(hc.saturating_sub(v * 8));
            for l in 0..lanes {
                lane_at[v][l] = heads.query(v * 8 + l) * heads.n_max;
            }
            single[v] = lanes == 0 || lane_at[v][lanes - 1] == lane_at[v][0];
        }
        // Pass 3: `e / Z` by 8 keys, transposed to a head a vector, added to
        // the sums head by head.
        let sp = sums.as_mut_ptr();
        for j0 in (0..n_vis / 8 * 8).step_by(8) {
            for v in 0..V {
                let lanes = 8.min(hc.saturating_sub(v * 8));
                if lanes == 0 || j0 + 8 > seen[v] / 8 * 8 {
                    continue;
                }
                // SAFETY: `j0 + 8 <= seen[v] <= n_max`, the lanes' queries
                // below the queries (`sums` holds `n_max` for each);
                // logits as above.
                unsafe {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for t in 0..8 {
                        let e = _mm256_loadu_ps(lp.add((j0 + t) * w + v * 8));
                        r[t] = _mm256_div_ps(e, z[v]);
                    }
                    let c = transpose8(r);
                    if single[v] {
                        let at = sp.add(lane_at[v][0] + j0);
                        let mut s = _mm256_loadu_ps(at);
                        for l in 0..lanes {
                            s = _mm256_add_ps(s, c[l]);
                        }
                        _mm256_storeu_ps(at, s);
                    } else {
                        // Lane by lane into its query's sums: each query's
                        // heads still in order.
                        for l in 0..lanes {
                            let at = sp.add(lane_at[v][l] + j0);
                            _mm256_storeu_ps(at, _mm256_add_ps(_mm256_loadu_ps(at), c[l]));
                        }
                    }
                }
            }
        }
        // Each vector's last keys (past its last whole 8): `e / Z` a vector,
        // added to its query's sums lane by lane (head order, as above).
        for v in 0..V {
            let lanes = 8.min(hc.saturating_sub(v * 8));
            if lanes == 0 {
                continue;
            }
            for j in seen[v] / 8 * 8..seen[v] {
                let mut r = [0.0f32; 8];
                // SAFETY: `j < seen[v] <= n_vis`: its row is in the logits;
                // `r` is 8 floats.
                unsafe {
                    let e = _mm256_loadu_ps(lp.add(j * w + v * 8));
                    _mm256_storeu_ps(r.as_mut_ptr(), _mm256_div_ps(e, z[v]));
                }
                for (l, &x) in r[..lanes].iter().enumerate() {
                    sums[lane_at[v][l] + j] += x;
                }
            }
        }
    }

    /// [`super::Staged::score`]: keys `j..j + count` (below `n_vis`; key
    /// `j + k`'s row at `keys.base + k · keys.stride`) in tiles of `K` keys
    /// (the one-pass kernel's tile: 12, 6, 3, 2 for 8 to 32 heads), of 2,
    /// or 1 (a key alone, or across `n_min`), the maxima of keys below
    /// `n_min` kept in `mx`, as [`pass1`] keeps them; `pf`'s lines asked
    /// for, a line a trip of the tiles ([`super::Staged::score`]).
    ///
    /// # Safety
    /// `_token` proves AVX2+FMA; the rows lie in `keys.ck`; `qt.len() >= d
    /// · 8V`; `logits` holds rows `0..j + count` of `8V`; `heads.hc <= 8V`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn staged<E: Elem, const V: usize, const K: usize>(
        _token: Avx2,
        qt: &[f32],
        keys: Rows<'_, E>,
        d: usize,
        scale: f32,
        heads: Heads<'_>,
        j: usize,
        count: usize,
        logits: &mut [f32],
        mx: &mut [f32; super::CHUNK],
        pf: &[u8],
    ) {
        let w = 8 * V;
        let (n_min, _) = heads.range();
        let mut m = [_mm256_setzero_ps(); V];
        for v in 0..V {
            // SAFETY: `8V <= 32` floats of `mx`.
            m[v] = unsafe { _mm256_loadu_ps(mx.as_ptr().add(v * 8)) };
        }
        let mut past = [_mm256_set1_ps(f32::NEG_INFINITY); V];
        let lp = logits.as_mut_ptr();
        super::staged_walk(
            n_min,
            j,
            count,
            K,
            d,
            pf,
            &mut m,
            &mut past,
            |k, n, mxk, pf| {
                let at = Rows {
                    ck: keys.ck,
                    base: keys.base + k * keys.stride,
                    stride: keys.stride,
                };
                // SAFETY: AVX2+FMA (the token); rows `k..k + n` of the keys lie
                // in `ck` and logit rows `j + k..` in `logits` (the contract);
                // `tile` reads its keys from `at` and writes rows `0..n` from
                // `lp + (j + k) · w`.
                unsafe {
                    let lpk = lp.add((j + k) * w);
                    match n {
                        1 => tile::<E, V, 1>(qt, at, d, 0, scale, lpk, mxk, false, pf),
                        2 => tile::<E, V, 2>(qt, at, d, 0, scale, lpk, mxk, false, pf),
                        _ => tile::<E, V, K>(qt, at, d, 0, scale, lpk, mxk, false, pf),
                    }
                }
            },
        );
        for v in 0..V {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(mx.as_mut_ptr().add(v * 8), m[v]) };
        }
    }

    /// [`super::Staged::finish`]: [`finish`] with the kept maxima.
    ///
    /// # Safety
    /// `_token` proves AVX2+FMA; [`finish`]'s contract.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn staged_finish<const V: usize>(
        _token: Avx2,
        heads: Heads<'_>,
        mx: &[f32; super::CHUNK],
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        let mut m = [_mm256_setzero_ps(); V];
        for v in 0..V {
            // SAFETY: `8V <= 32` floats of `mx`.
            m[v] = unsafe { _mm256_loadu_ps(mx.as_ptr().add(v * 8)) };
        }
        // SAFETY: the contract.
        unsafe { finish::<V>(heads, m, logits, sums) }
    }

    /// The most keys a chunk reads without prefetching the next tile's rows.
    const PREFETCH_KEYS_MIN: usize = 512;

    /// Keys `j..j + K` against the chunk's `8V` heads: logit `(j + k, l)` to
    /// `lp[(j + k) · 8V + l]`, each lane's maximum into `mx`; the first `d /
    /// 2` lines of `pf` asked for, one a trip (empty: none; the hint as
    /// [`super::Staged::score`] says).
    ///
    /// # Safety
    /// `chunk`'s contract, and `j + K <= n_vis`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<E: Elem, const V: usize, const K: usize>(
        qt: &[f32],
        keys: Rows<'_, E>,
        d: usize,
        j: usize,
        scale: f32,
        lp: *mut f32,
        mx: &mut [__m256; V],
        ahead: bool,
        pf: &[u8],
    ) {
        let w = 8 * V;
        let mut rows = [keys.ck.as_ptr(); K];
        for (k, r) in rows.iter_mut().enumerate() {
            // SAFETY: key `j + k < n_vis` lies in `ck` (the contract).
            *r = unsafe { keys.ck.as_ptr().add(keys.base + (j + k) * keys.stride) };
        }
        // The next tile's rows asked into cache (a prefetch never faults
        // and does not dereference its pointer: past the keys it is a no-op);
        // not when the keys are few (`ahead`: they stay in cache).
        for k in (0..K).filter(|_| ahead) {
            let next = rows[k].wrapping_add(K * keys.stride);
            for c in (0..d).step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(c) as *const i8);
            }
        }
        let qp = qt.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); V]; K];
        // One step: element `c` of the keys into every accumulator.
        let step = |c: usize, acc: &mut [[__m256; V]; K]| {
            // SAFETY: `c < d`: `qt` holds `d · w` floats, each row `d`.
            unsafe {
                let mut qv = [_mm256_setzero_ps(); V];
                for v in 0..V {
                    qv[v] = _mm256_loadu_ps(qp.add(c * w + v * 8));
                }
                for k in 0..K {
                    let b = E::splat(rows[k].add(c));
                    for v in 0..V {
                        acc[k][v] = _mm256_fmadd_ps(qv[v], b, acc[k][v]);
                    }
                }
            }
        };
        // Two elements a trip (the loop's own instructions halved); each
        // chain still runs over `c` in order.
        // `pf`'s lines asked for, one a trip (what the caller reads later,
        // from memory: the misses overlap the multiply-adds), with the
        // `prefetcht0` hint (`Staged::score` says why).
        let lines = pf.len().div_ceil(64);
        let pp = pf.as_ptr() as *const i8;
        let mut c = 0;
        while c + 2 <= d {
            if c / 2 < lines {
                // SAFETY: line `c / 2` starts within `pf`; a prefetch reads
                // nothing architecturally.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(pp.add(c / 2 * 64)) };
            }
            step(c, &mut acc);
            step(c + 1, &mut acc);
            c += 2;
        }
        if c < d {
            step(c, &mut acc);
        }
        let vs = _mm256_set1_ps(scale);
        for k in 0..K {
            for v in 0..V {
                let s = _mm256_mul_ps(acc[k][v], vs);
                // SAFETY: key `j + k < n_vis`: its row of `w` floats is in
                // the logits.
                unsafe { _mm256_storeu_ps(lp.add((j + k) * w + v * 8), s) };
                mx[v] = _mm256_max_ps(s, mx[v]);
            }
        }
    }

    /// `out[l]` lane `t` = `r[t]` lane `l` (an 8×8 transpose).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

/// [`Staged::score`] with 16 or 32 lanes in 512-bit registers: the AVX2
/// kernel's tiles with one or two vectors of 16 heads instead of two or
/// four of 8 (the same logits, each its own chain, and the same per-lane
/// maxima: exact, so the bits are the AVX2 kernel's), and the bulk of
/// their exponentials sixteen lanes a vector before the AVX2 finish.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
mod avx512 {
    use super::{Elem, Floats, Heads, Rows};
    use crate::simd::Avx512;
    use std::arch::x86_64::*;

    /// [`super::avx2::staged`] with `16 V` lanes in `V` 512-bit vectors,
    /// tiles of `K` keys, then 2, then 1 (never straddling `n_min`). A
    /// tile's bfloat16 rows are widened into `wide` first (their float32
    /// values, exactly: the same logits), so that each element's broadcast
    /// is a load alone, not a load and a shift on the FMA ports.
    ///
    /// # Safety
    /// `_token` proves AVX-512 F/BW/DQ/VL; the rows lie in `keys.ck`;
    /// `qt.len() >= d · 16V`; `logits` holds rows `0..j + count` of `16V`;
    /// `heads.hc <= 16V`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn staged<E: Elem, const V: usize, const K: usize>(
        _token: Avx512,
        qt: &[f32],
        keys: Rows<'_, E>,
        d: usize,
        scale: f32,
        heads: Heads<'_>,
        j: usize,
        count: usize,
        logits: &mut [f32],
        mx: &mut [f32; super::CHUNK],
        pf: &[u8],
        wide: &mut Floats,
    ) {
        let w = 16 * V;
        assert!(qt.len() >= d * w && logits.len() >= (j + count) * w);
        let (n_min, _) = heads.range();
        let mut m = [_mm512_setzero_ps(); V];
        for v in 0..V {
            // SAFETY: `16V <= 32` floats of `mx`.
            m[v] = unsafe { _mm512_loadu_ps(mx.as_ptr().add(v * 16)) };
        }
        let mut past = [_mm512_set1_ps(f32::NEG_INFINITY); V];
        let lp = logits.as_mut_ptr();
        super::staged_walk(
            n_min,
            j,
            count,
            K,
            d,
            pf,
            &mut m,
            &mut past,
            |k, n, mxk, pf| {
                let at = Rows {
                    ck: keys.ck,
                    base: keys.base + k * keys.stride,
                    stride: keys.stride,
                };
                // SAFETY: AVX-512 (the token); rows `k..k + n` of the keys lie
                // in `ck` and logit rows `j + k..` in `logits` (the contract,
                // asserted); `tile` reads its keys from `at` (or their
                // float32 copies in `wide`, `n` rows of `d`) and writes rows
                // `0..n` from `lp + (j + k) · w`.
                unsafe {
                    let lpk = lp.add((j + k) * w);
                    if E::NARROW {
                        // Sized once for the largest tile.
                        if wide.len() < K * d {
                            wide.resize(K * d, 0.0);
                        }
                        for r in 0..n {
                            let row = at.ck.as_ptr().add(at.base + r * at.stride);
                            E::widen(row, d, wide.as_mut_ptr().add(r * d));
                        }
                        let at = Rows {
                            ck: &wide[..],
                            base: 0,
                            stride: d,
                        };
                        match n {
                            1 => tile::<f32, V, 1>(qt, at, d, scale, lpk, mxk, pf),
                            2 => tile::<f32, V, 2>(qt, at, d, scale, lpk, mxk, pf),
                            _ => tile::<f32, V, K>(qt, at, d, scale, lpk, mxk, pf),
                        }
                    } else {
                        match n {
                            1 => tile::<E, V, 1>(qt, at, d, scale, lpk, mxk, pf),
                            2 => tile::<E, V, 2>(qt, at, d, scale, lpk, mxk, pf),
                            _ => tile::<E, V, K>(qt, at, d, scale, lpk, mxk, pf),
                        }
                    }
                }
            },
        );
        for v in 0..V {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(mx.as_mut_ptr().add(v * 16), m[v]) };
        }
    }

    /// [`super::avx2::staged_finish`] with pass 2 over the keys every lane
    /// sees (`0..n_min / 8 · 8`, the bulk of a decode's) sixteen lanes a
    /// vector: `U = V / 2` vectors of 512 bits hold the chunk's `V` vectors
    /// of 8 lanes, `crate::exp::avx512::exp` is the AVX2 `exp` lane for
    /// lane, and each lane's 8 sums `lanes[t]` (`t = j % 8`) take the same
    /// additions in the same order; the sums are split back into 8-lane
    /// vectors for [`super::avx2::finish_from`]. The same bits. (At AVX2
    /// the 32 sums of a chunk of 32 heads left the 16 registers.)
    ///
    /// # Safety
    /// `_token` proves AVX-512 F/BW/DQ/VL; `V == 2 U`;
    /// [`super::avx2::finish`]'s contract.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn staged_finish<const V: usize, const U: usize>(
        _token: Avx512,
        heads: Heads<'_>,
        mx: &[f32; super::CHUNK],
        logits: &mut [f32],
        sums: &mut [f32],
    ) {
        assert_eq!(V, 2 * U, "two 8-lane vectors a 512-bit one");
        let mut m8 = [_mm256_setzero_ps(); V];
        for v in 0..V {
            // SAFETY: `8V <= 32` floats of `mx`.
            m8[v] = unsafe { _mm256_loadu_ps(mx.as_ptr().add(v * 8)) };
        }
        let (w, (n_min, _)) = (8 * V, heads.range());
        // SAFETY: the contract.
        let (m8, seen) = unsafe { super::avx2::maxima::<V>(heads, m8, logits) };
        let mut m = [_mm512_setzero_ps(); U];
        for u in 0..U {
            m[u] = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(m8[2 * u]), m8[2 * u + 1]);
        }
        let mut lanes = [[_mm512_setzero_ps(); 8]; U];
        let lp = logits.as_mut_ptr();
        for j0 in (0..n_min / 8 * 8).step_by(8) {
            for t in 0..8 {
                for u in 0..U {
                    // SAFETY: `j0 + t < n_min`: its row is in the logits.
                    unsafe {
                        let at = lp.add((j0 + t) * w + u * 16);
                        let e = crate::exp::avx512::exp(_mm512_sub_ps(_mm512_loadu_ps(at), m[u]));
                        _mm512_storeu_ps(at, e);
                        lanes[u][t] = _mm512_add_ps(lanes[u][t], e);
                    }
                }
            }
        }
        let mut l8 = [[_mm256_setzero_ps(); 8]; V];
        for u in 0..U {
            for t in 0..8 {
                l8[2 * u][t] = _mm512_castps512_ps256(lanes[u][t]);
                l8[2 * u + 1][t] = _mm512_extractf32x8_ps::<1>(lanes[u][t]);
            }
        }
        // SAFETY: the contract; keys `0..n_min / 8 · 8` done as `finish_from`
        // expects.
        unsafe { super::avx2::finish_from::<V>(heads, &m8, &seen, l8, logits, sums) }
    }

    /// Keys `0..K` of `keys` against the chunk's `16V` heads (`qt`, `[d][16
    /// V]`): logit `(k, l)` to `lp[k · 16V + l]`, each lane's maximum into
    /// `mx` as `max(x, m)`; `pf`'s lines asked for, one a trip of two
    /// elements (the hint as [`super::Staged::score`] says).
    ///
    /// # Safety
    /// AVX-512 F/BW; keys `0..K` lie in `keys.ck`; `qt` holds `d · 16V`
    /// floats; `K` rows of `16V` floats at `lp`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn tile<E: Elem, const V: usize, const K: usize>(
        qt: &[f32],
        keys: Rows<'_, E>,
        d: usize,
        scale: f32,
        lp: *mut f32,
        mx: &mut [__m512; V],
        pf: &[u8],
    ) {
        let w = 16 * V;
        let mut rows = [keys.ck.as_ptr(); K];
        for (k, r) in rows.iter_mut().enumerate() {
            // SAFETY: key `k` lies in `ck` (the contract).
            *r = unsafe { keys.ck.as_ptr().add(keys.base + k * keys.stride) };
        }
        let qp = qt.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); V]; K];
        let step = |c: usize, acc: &mut [[__m512; V]; K]| {
            // SAFETY: `c < d`: `qt` holds `d · w` floats, each key row `d`.
            unsafe {
                let mut qv = [_mm512_setzero_ps(); V];
                for v in 0..V {
                    qv[v] = _mm512_loadu_ps(qp.add(c * w + v * 16));
                }
                for k in 0..K {
                    let b = E::splat16(rows[k].add(c));
                    for v in 0..V {
                        acc[k][v] = _mm512_fmadd_ps(qv[v], b, acc[k][v]);
                    }
                }
            }
        };
        let lines = pf.len().div_ceil(64);
        let pp = pf.as_ptr() as *const i8;
        let mut c = 0;
        while c + 2 <= d {
            if c / 2 < lines {
                // SAFETY: line `c / 2` starts within `pf`; a prefetch reads
                // nothing architecturally.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(pp.add(c / 2 * 64)) };
            }
            step(c, &mut acc);
            step(c + 1, &mut acc);
            c += 2;
        }
        if c < d {
            step(c, &mut acc);
        }
        let vs = _mm512_set1_ps(scale);
        for k in 0..K {
            for v in 0..V {
                let s = _mm512_mul_ps(acc[k][v], vs);
                // SAFETY: row `k` of `w` floats at `lp` (the contract).
                unsafe { _mm512_storeu_ps(lp.add(k * w + v * 16), s) };
                mx[v] = _mm512_max_ps(s, mx[v]);
            }
        }
    }
}

/// The kernels a [`Staged`] chunk runs, chosen once by its dispatch
/// (`infllm.staged`).
#[derive(Clone, Copy)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx2(crate::simd::Avx2),
    /// Chunks of 16 or 32 lanes score, and take their bulk of exponentials,
    /// in 512-bit registers; the others, and the rest of every finish, at
    /// AVX2.
    #[cfg(target_arch = "x86_64")]
    Avx512(crate::simd::Avx512),
    Portable,
}

/// One chunk of [`group_sums`] (at most 32 heads of the queries `qs`) whose
/// keys arrive in order from a producer (NSA's decode scores each
/// compressed key as its compression completes it, while its rows are in
/// the first-level cache, rather than writing every key out and streaming
/// them back): [`Staged::score`] writes the logits of the keys given and
/// keeps the lanes' maxima, [`Staged::finish`] runs the softmax and the
/// group sum on them. The same operations on the same values as
/// [`group_sums`] (a logit is its own chain, whatever tile computes it; the
/// maximum is exact, so the order the keys come in is free): the same bits.
pub(crate) struct Staged {
    kernel: Kernel,
    h0: usize,
    hc: usize,
    w: usize,
    group: usize,
    d: usize,
    scale: f32,
    n_vis: Vec<usize>,
    n_max: usize,
    qt: Floats,
    logits: Floats,
    mx: [f32; CHUNK],
    /// A tile's bfloat16 keys widened to float32 (the AVX-512 tiles).
    wide: Floats,
}

impl Staged {
    /// The chunks of [`group_sums`] for queries `qs` (as there: `heads`
    /// rows of `d` at `q[qs[s]..]`, query `s` seeing keys `0..n_vis[s]`,
    /// `n_vis` not all 0), in order, their queries transposed; their
    /// logits buffers taken from `bufs` (and given back by
    /// [`Staged::into_bufs`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn chunks(
        isa: Isa,
        q: &[f32],
        qs: &[usize],
        heads: usize,
        d: usize,
        n_vis: &[usize],
        scale: f32,
        bufs: &mut Vec<Floats>,
    ) -> Vec<Staged> {
        assert_eq!(qs.len(), n_vis.len(), "a key count a query");
        let n_max = n_vis.iter().copied().max().unwrap_or(0);
        let total = qs.len() * heads;
        assert!(
            n_max > 0
                && one_count_a_vector(heads, n_vis)
                && qs.iter().all(|&o| o + heads * d <= q.len()),
            "no keys, a query row past its array, or a vector's queries seeing different key counts"
        );
        (0..total)
            .step_by(CHUNK)
            .map(|h0| {
                let hc = CHUNK.min(total - h0);
                let w = hc.next_multiple_of(8);
                let mut qt = Floats::filled(d * w, 0.0);
                let mut logits = bufs.pop().unwrap_or_default();
                // Every logit read is written first (keys below `n_vis`).
                let len = n_max.next_multiple_of(8) * w;
                if logits.len() < len {
                    logits.resize(len, 0.0);
                }
                let rows = QueryRows {
                    q,
                    qs,
                    heads,
                    h0,
                    hc,
                    d,
                };
                // SAFETY (bounds): the transposes slice their arguments;
                // `qt` is `d · w` floats. The level's kernels are kept for
                // `score` and `finish`.
                let kernel = dispatch!("infllm.staged", isa, {
                    avx512(t) => {
                        avx2::transpose_queries(t.avx2(), rows, w, &mut qt);
                        Kernel::Avx512(t)
                    },
                    avx2(t) => {
                        avx2::transpose_queries(t, rows, w, &mut qt);
                        Kernel::Avx2(t)
                    },
                    scalar => {
                        rows.transpose_lanes(0, w, &mut qt);
                        Kernel::Portable
                    },
                });
                Staged {
                    kernel,
                    h0,
                    hc,
                    w,
                    group: heads,
                    d,
                    scale,
                    n_vis: n_vis.to_vec(),
                    n_max,
                    qt,
                    logits,
                    mx: [f32::NEG_INFINITY; CHUNK],
                    wide: Floats::default(),
                }
            })
            .collect()
    }

    fn heads(&self) -> Heads<'_> {
        Heads {
            h0: self.h0,
            hc: self.hc,
            group: self.group,
            n_vis: &self.n_vis,
            n_max: self.n_max,
            next: &[],
        }
    }

    /// Keys `j..j + count` (key `j + k` at `keys.ck[keys.base + k ·
    /// keys.stride..][..d]`, float32 or bfloat16 bits): their logits, and their maxima kept.
    /// Keys at or past the chunk's key count are skipped. Each key is
    /// given once, in any order, before [`Staged::finish`].
    ///
    /// `pf`: bytes the caller reads later (from memory), asked for meanwhile
    /// (at most `d` lines; nothing at the portable level). No effect on
    /// results. The hint is `prefetcht0` ([`crate::keys::CacheLevel::L1`]:
    /// every cache level). Measured on AMD Zen 4 only: NSA's cached decode
    /// from cold memory took 1.61-1.66 ms a call with it and 2.19-2.22 ms
    /// with `prefetcht1` (float32; 1.5 ms warm with either).
    pub(crate) fn score<E: Elem>(&mut self, keys: Rows<'_, E>, j: usize, count: usize, pf: &[u8]) {
        let (_, n_vis) = self.heads().range();
        let count = count.min(n_vis.saturating_sub(j));
        if count == 0 {
            return;
        }
        assert!(
            keys.base + (count - 1) * keys.stride + self.d <= keys.ck.len(),
            "a key row past its array"
        );
        let Staged {
            w,
            d,
            scale,
            ref qt,
            ref mut logits,
            ref mut mx,
            ref mut wide,
            ..
        } = *self;
        let heads = Heads {
            h0: self.h0,
            hc: self.hc,
            group: self.group,
            n_vis: &self.n_vis,
            n_max: self.n_max,
            next: &[],
        };
        // SAFETY (bounds): rows `0..count` lie in `keys.ck` (asserted);
        // keys `j..j + count` are below `n_vis`, whose logits `logits`
        // holds (`round_up(n_max, 8) · w` floats); `qt` is `d · w` floats;
        // `hc <= w`, a vector's lanes see one key count (asserted in
        // `chunks`).
        match self.kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `t` proves AVX2+FMA (made by the dispatch in
            // `chunks`); the bounds as above.
            Kernel::Avx2(t) => unsafe {
                match w {
                    8 => avx2::staged::<E, 1, 12>(
                        t, qt, keys, d, scale, heads, j, count, logits, mx, pf,
                    ),
                    16 => avx2::staged::<E, 2, 6>(
                        t, qt, keys, d, scale, heads, j, count, logits, mx, pf,
                    ),
                    24 => avx2::staged::<E, 3, 3>(
                        t, qt, keys, d, scale, heads, j, count, logits, mx, pf,
                    ),
                    _ => avx2::staged::<E, 4, 2>(
                        t, qt, keys, d, scale, heads, j, count, logits, mx, pf,
                    ),
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `t` proves AVX-512 (made by the dispatch in `chunks`),
            // and so AVX2+FMA; the bounds as above.
            Kernel::Avx512(t) => unsafe {
                match w {
                    16 => avx512::staged::<E, 1, 16>(
                        t, qt, keys, d, scale, heads, j, count, logits, mx, pf, wide,
                    ),
                    32 => avx512::staged::<E, 2, 8>(
                        t, qt, keys, d, scale, heads, j, count, logits, mx, pf, wide,
                    ),
                    8 => avx2::staged::<E, 1, 12>(
                        t.avx2(),
                        qt,
                        keys,
                        d,
                        scale,
                        heads,
                        j,
                        count,
                        logits,
                        mx,
                        pf,
                    ),
                    _ => avx2::staged::<E, 3, 3>(
                        t.avx2(),
                        qt,
                        keys,
                        d,
                        scale,
                        heads,
                        j,
                        count,
                        logits,
                        mx,
                        pf,
                    ),
                }
            },
            Kernel::Portable => {
                // (the x86 kernels' alone)
                let _ = (pf, &wide);
                for k in 0..count {
                    let row = &keys.ck[keys.base + k * keys.stride..][..d];
                    let out = &mut logits[(j + k) * w..][..w];
                    portable::key(qt, w, row, scale, heads, j + k, out, mx);
                }
            }
        }
    }

    /// The chunk's softmax and group sum once every key it sees was
    /// scored: `e / Z` added into `sums[s · n_max + j]` (`n_max` the
    /// queries' largest key count), head by head. A query's chunks are
    /// finished in order (as [`Staged::chunks`] returns them).
    pub(crate) fn finish(&mut self, sums: &mut [f32]) {
        assert!(
            sums.len() >= self.n_vis.len() * self.n_max,
            "the sums of every query"
        );
        let Staged {
            w,
            ref mut logits,
            ref mx,
            ..
        } = *self;
        let heads = Heads {
            h0: self.h0,
            hc: self.hc,
            group: self.group,
            n_vis: &self.n_vis,
            n_max: self.n_max,
            next: &[],
        };
        // SAFETY (bounds): every key below `n_vis` was scored (the
        // contract of `score`: its logits are written); `sums` holds
        // `n_max` for each query (asserted).
        match self.kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `t` proves AVX2+FMA (made by the dispatch in
            // `chunks`); the bounds as above.
            Kernel::Avx2(t) => unsafe {
                match w {
                    8 => avx2::staged_finish::<1>(t, heads, mx, logits, sums),
                    16 => avx2::staged_finish::<2>(t, heads, mx, logits, sums),
                    24 => avx2::staged_finish::<3>(t, heads, mx, logits, sums),
                    _ => avx2::staged_finish::<4>(t, heads, mx, logits, sums),
                }
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `t` proves AVX-512 and so AVX2+FMA; the bounds as above.
            Kernel::Avx512(t) => unsafe {
                match w {
                    8 => avx2::staged_finish::<1>(t.avx2(), heads, mx, logits, sums),
                    16 => avx512::staged_finish::<2, 1>(t, heads, mx, logits, sums),
                    24 => avx2::staged_finish::<3>(t.avx2(), heads, mx, logits, sums),
                    _ => avx512::staged_finish::<4, 2>(t, heads, mx, logits, sums),
                }
            },
            Kernel::Portable => portable::finish(w, heads, mx, logits, sums),
        }
    }

    /// The chunk's logits buffer, for the next call.
    pub(crate) fn into_bufs(self, bufs: &mut Vec<Floats>) {
        bufs.push(self.logits);
    }
}

/// Runs `infllm.head_sums` once at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn probe(isa: Isa) {
    // 8 heads, d = 1, 3 keys of 0: every head uniform, so each sum is 8 / 3.
    let ck = [0.0f32; 3];
    let mut s = Scratch::default();
    let rows = Rows {
        ck: &ck,
        base: 0,
        stride: 1,
    };
    group_sums(isa, &[1.0; 8], &[0], 8, 1, rows, &[3], 1.0, &mut s, &[]);
    assert!(s.sums.iter().all(|&x| (x - 8.0 / 3.0).abs() < 1e-5));
}

/// Runs `infllm.staged` once at `isa` (the reach test's probe): 8 heads,
/// `d = 1`, 3 keys of 0 given one at a time, so each sum is `8 / 3`.
#[cfg(test)]
pub(crate) fn staged_probe(isa: Isa) {
    let ck = [0.0f32; 3];
    let mut bufs = Vec::new();
    let mut chunks = Staged::chunks(isa, &[1.0; 8], &[0], 8, 1, &[3], 1.0, &mut bufs);
    for j in 0..3 {
        let rows = Rows {
            ck: &ck[j..],
            base: 0,
            stride: 1,
        };
        chunks[0].score(rows, j, 1, &[]);
    }
    let mut sums = [0.0f32; 3];
    chunks[0].finish(&mut sums);
    assert!(sums.iter().all(|&x| (x - 8.0 / 3.0).abs() < 1e-5));
}
