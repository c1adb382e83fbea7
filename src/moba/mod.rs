//! MoBA's block selection (Mixture of Block Attention): the blocks each
//! query attends to, decided by a gate on each past block's mean key.
//!
//! # The rule, as the source states it
//!
//! MoonshotAI/MoBA @61e456bc (`moba/moba_efficient.py`, `moba_attn_varlen`,
//! the rule; `moba/moba_naive.py`, `moba_attn_varlen_naive`, the named
//! variant). Keys are cut into blocks ("chunks") of `block_size` tokens from
//! each sequence's start. For a query at position `p` of its sequence, `c =
//! p / block_size` is its **current block**. The gate of block `b` is
//!
//! ```text
//!     g_b = q · mean_t(k_t),   t over block b's block_size keys
//! ```
//!
//! per query head (GQA keys repeated to the query heads: `moba/wrapper.py`
//! `repeat_interleave`s them, so query head `h` reads KV head `h /
//! (n_q_heads / n_kv_heads)`). Only the **completed past blocks** `b < c`
//! are gated (`gate_chunk_end_mask`: `-inf` where the query precedes the
//! block's end; the sequence's last chunk, the only one that can be partial,
//! is dropped from the gated chunks, `calc_chunks`' `filtered_chunk_indices`),
//! so a block is never gated before it is complete. The query reads
//!
//! - the top `topk − 1` of its past blocks by gate (`moba_topk − 1`, "the last
//!   chunk is always chosen"), all of them when there are fewer, and
//! - its current block, **forced**, attended causally (the self-attention
//!   over `cu_chunk`, `causal=True`), never gated;
//! - at `topk = 1` nothing is gated and the efficient code falls back to
//!   **full causal attention** (`need_moba_attn` false: `flash_attn_varlen_func(
//!   ..., causal=True)`): every block `0 ..= c`.
//!
//! [`Variant::Naive`] (`moba_naive.py`) writes one top-k over every block with
//! future blocks `-inf` and the current block `+inf`, `k = min(topk,
//! n_blocks)`, and masks the future causally afterwards. Its selection is the
//! efficient one's for `topk >= 2` (the `+inf` current block always wins a
//! slot, the `-inf` future blocks that fill a short row are masked out); at
//! `topk = 1` it differs: the naive code reads **the current block alone**.
//! kvselect follows the efficient code (the rule) and names the naive one.
//!
//! Queries may be fewer than keys (`Tq ≤ Tkv`, a continued prefill or a
//! decode step): query `i` of a sequence of `Tq` queries over `Tkv` keys sits
//! at position `Tkv − Tq + i` (both of MoBA's functions take `Tq = Tkv`).
//!
//! # One total order
//!
//! Past blocks are ranked by "gate descending, then block id ascending"
//! ([`rank`]): a tie at the threshold goes to the lower block id (`torch.topk`
//! with `sorted=False` promises no order among ties), NaN ranks below every
//! number, `-0.0` is `+0.0`. Rows are written ascending, `-1` padded.
//!
//! # Numbers: the mean, the gate and their rounding
//!
//! A key is decoded exactly (float32, float16, bfloat16, fp8 e4m3fn; a scaled
//! fp8 key is `k · scale` rounded to float32, read in place through
//! [`crate::keys`]). A block mean is formed as torch's `mean` forms it (ATen's
//! `MeanOps`: the float32 sum times the float32 factor `1 / block_size`):
//! `m = fl(S · fl(1 / B))`, `S` summed in float32 **in token order** (torch
//! promises no order: CUDA reduces in a tree). MoBA then takes the mean in
//! the keys' own dtype (`.mean()` on bfloat16 keys rounds it to bfloat16
//! before `.float()`); kvselect keeps the float32 mean (a deviation, stated in
//! the README: the rounding to bfloat16 is an artefact of the dtype, 2⁻⁸
//! relative, that no exact rule can reproduce). The gate is a dot product of
//! the float32 query and mean in the 8-lane order Quest's scores use: lane `l`
//! accumulates dimensions `l, l + 8, …` by fused multiply-add (dimensions
//! past `d` as `fma(0, 0, acc)`), the lanes added `((l0 + l4) + (l2 + l6)) +
//! ((l1 + l5) + (l3 + l7))` — the same bits at every SIMD level.
//!
//! Against the real gate `g = q · S / B` of the decoded keys, the float32
//! gate errs by at most `γ_{d+B+4} · Σ_i |q_i| ā_i` plus `(d + B + 4) η`
//! (`ā_i = Σ_t |k_ti| / B`, `γ_n = n u / (1 − n u)`, `u = 2⁻²⁴`, `η = 2⁻¹⁴⁹`):
//! the sum errs by `γ_{B−1} Σ_t |k_ti|`, the factor and the product by one
//! rounding each, and each lane's fused sum and the three additions by
//! `γ_{d+3}` of `Σ |q_i m̂_i|`. The differential tests treat two blocks
//! whose exact gates lie within their bounds as tied, and `kvselect check`
//! decides rows in real arithmetic (`kvselect.rules.moba`).
//!
//! What would break it: a block gated before it is complete (the partial
//! block's mean, or `p / B` rounded up), the current block gated instead of
//! forced (it can then lose its slot), `topk` spent without the forced block
//! (`topk` gated blocks), future blocks kept when a row is short, or the
//! naive code's `topk = 1` taken for the efficient one's — each is a planted
//! fault in the tests and a case of `kvselect.testing`.
//!
//! # Layout
//!
//! `mod.rs` (the entry points and the row rule), `kernels.rs` (the
//! `moba.gates`, `moba.lanes`, `moba.top` and `moba.sums` families: portable
//! and AVX2, and `moba.lanes` at AVX-512 too; the other families run their
//! AVX2 kernels at the AVX-512 level), `tests.rs`.
//!
//! # Speed: a prefill's queries eight at a time
//!
//! A prefill's work is per query row (each row's gates on its past blocks
//! and its top blocks; the means are formed once per call), and its queries
//! are four times its keys in bytes at 8 query heads over 2 KV heads. The
//! queries of one block share their past blocks, so `rows` takes them
//! eight at a time, head after head: the eight rows of one head in the
//! vector lanes against the head's means (`moba.lanes`), every query read
//! once, in memory order, while the means stay in the L1 cache, then the
//! eight rows' top blocks together (`moba.top`). Each gate is the same
//! fused sum in the same order as the row-by-row kernel's (`moba.gates`,
//! which a decode step's few rows and a block's last rows under eight still
//! take), and `moba.top`'s key orders as [`rank`] — so the rows are the same
//! at every level, which `rows_eight_queries_at_a_time_equal_the_row_by_row_path_on_every_level`
//! pins.

mod kernels;
#[cfg(test)]
mod tests;

use std::cmp::Ordering;

use crate::error::{check_len, checked_size, ArgumentError};
pub use crate::keys::Heads;
use crate::keys::{BlockTable, Encoded, PagedCache};
use crate::simd::Isa;

/// Runs MoBA's kernel family at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: Isa) {
    kernels::probe(isa)
}

/// Which of MoBA's implementations (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `moba_efficient.py` (the rule): `topk = 1` reads every block `0 ..= c`.
    Efficient,
    /// `moba_naive.py`: `topk = 1` reads the current block alone.
    Naive,
}

/// The heads and dimensions of MoBA's queries and keys ([`Heads`], as
/// InfLLM-v2's and NSA's entry points take them), its block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub heads: Heads,
    pub block_size: usize,
}

impl Shape {
    fn check(&self) -> Result<(), ArgumentError> {
        for (argument, v) in [
            ("n_q_heads", self.heads.n_q_heads),
            ("n_kv_heads", self.heads.n_kv_heads),
            ("d", self.heads.d),
            ("block_size", self.block_size),
        ] {
            if v == 0 {
                return Err(invalid(argument, format!("{argument} must be at least 1")));
            }
        }
        if !self.heads.n_q_heads.is_multiple_of(self.heads.n_kv_heads) {
            let message = format!(
                "q has {} heads, not a multiple of the keys' {} KV heads",
                self.heads.n_q_heads, self.heads.n_kv_heads
            );
            return Err(invalid("q", message));
        }
        checked_size("k", &[self.heads.n_q_heads, self.heads.d]).map(|_| ())
    }

    /// Query heads per KV head.
    fn group(&self) -> usize {
        self.heads.n_q_heads / self.heads.n_kv_heads
    }

    /// `d` rounded up to the kernels' 8 lanes.
    fn d8(&self) -> usize {
        self.heads.d.div_ceil(8) * 8
    }
}

/// The settings every call checks first: the shape's sizes (each at least
/// 1, the query heads a multiple of the KV heads) and, for a selection
/// (`topk` given), `topk` at least 1. The bindings check them before they
/// size an output by them, so that a refused setting is named as itself,
/// not as the output's shape.
pub fn check_settings(shape: Shape, topk: Option<usize>) -> Result<(), ArgumentError> {
    shape.check()?;
    if topk == Some(0) {
        return Err(invalid("topk", "topk must be at least 1 block".into()));
    }
    Ok(())
}

fn invalid(argument: &'static str, message: String) -> ArgumentError {
    ArgumentError::Invalid { argument, message }
}

/// Blocks a query at position `p` reads at most: its current block `p /
/// block_size` and every block before it.
pub fn blocks_seen(p: usize, block_size: usize) -> usize {
    p / block_size.max(1) + 1
}

/// The slots a row needs: `topk` (the forced block counted), or, for the
/// efficient code at `topk = 1` (full causal attention), `max_blocks`, the
/// most blocks a query of the call sees.
pub fn width(variant: Variant, topk: usize, max_blocks: usize) -> usize {
    match (variant, topk) {
        (Variant::Efficient, 1) => max_blocks,
        _ => topk,
    }
}

/// Blocks the query of current block `c` reads beside its current block:
/// `min(topk − 1, c)`, or every past block (`c`) at the efficient code's
/// `topk = 1`, none at the naive code's.
pub fn past_blocks_read(variant: Variant, topk: usize, c: usize) -> usize {
    match (variant, topk) {
        (Variant::Efficient, 1) => c,
        _ => topk.saturating_sub(1).min(c),
    }
}

/// The total order on past blocks: `a` before `b` when its gate is greater,
/// or equal with a lower block id. NaN ranks below every number; `-0.0`
/// equals `+0.0` (numbers compare by value).
pub fn rank(a: (f32, u32), b: (f32, u32)) -> Ordering {
    let by_gate = match (a.0.is_nan(), b.0.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        // Neither is NaN: partial_cmp is total here; -0.0 == +0.0.
        (false, false) => b.0.partial_cmp(&a.0).unwrap_or(Ordering::Equal),
    };
    by_gate.then(a.1.cmp(&b.1))
}

/// Slots up to which [`write_row`] keeps its best blocks by insertion.
const SMALL: usize = 8;

/// Slots up to which [`write_row`] finds its best blocks a pass each.
const PASSES: usize = 2;

/// Block `b`'s gate `g` as one integer that orders as [`rank`] does, the
/// greater first: the gate's bits mapped to an unsigned order (`-0.0` as
/// `+0.0`, NaN below `-inf`) above the block id's complement (the lower id
/// greater). Distinct blocks give distinct keys.
#[inline]
fn order_key(g: f32, b: usize) -> u64 {
    let bits = (g + 0.0).to_bits(); // -0.0 + 0.0 = +0.0, every other value kept
                                    // Negative: all bits flipped; positive: the sign bit set (no branch on
                                    // the sign, which is data).
    let k = bits ^ (((bits as i32 >> 31) as u32) | 0x8000_0000);
    let k = if g.is_nan() { 0 } else { k };
    (u64::from(k) << 32) | u64::from(u32::MAX - b as u32)
}

/// The block id of an [`order_key`].
#[inline]
fn key_block(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// Writes one row: the `n_past` best of `gates` (the past blocks `0 .. c`) by
/// [`rank`], and `c`, ascending, then `-1`. `scratch` is reused.
fn write_row(gates: &[f32], c: usize, n_past: usize, scratch: &mut Vec<u64>, row: &mut [i32]) {
    if n_past >= c {
        for (b, slot) in row.iter_mut().enumerate() {
            *slot = if b <= c { b as i32 } else { -1 };
        }
        return;
    }
    let mut small = [0u64; SMALL];
    let chosen: &mut [u64] = if n_past <= PASSES {
        // One or two slots beside the forced block (MoBA's topk 2 and 3):
        // a pass each for the greatest key below the last found (keys are
        // distinct), with no branch on the data (the gates' order is random,
        // so a kept-or-not branch mispredicts).
        let mut prev = u64::MAX;
        for slot in small.iter_mut().take(n_past) {
            let mut m = 0u64;
            for (b, &g) in gates.iter().enumerate() {
                let e = order_key(g, b);
                m = m.max(if e < prev { e } else { 0 });
            }
            *slot = m;
            prev = m;
        }
        &mut small[..n_past]
    } else if n_past <= SMALL {
        // A few slots (MoBA's topk is 2 to 8): one pass keeping the best
        // `n_past` in order, each slot starting below every key (a key is
        // at least 1: block ids are below u32::MAX); most blocks lose to the
        // last kept at once. `n_past < c` blocks fill every slot.
        let best = &mut small[..n_past];
        for (b, &g) in gates.iter().enumerate() {
            let e = order_key(g, b);
            let Some(&last) = best.last() else { break };
            if e <= last {
                continue;
            }
            let mut i = n_past - 1;
            while i > 0 && e > best[i - 1] {
                best[i] = best[i - 1];
                i -= 1;
            }
            best[i] = e;
        }
        best
    } else {
        scratch.clear();
        scratch.extend(gates.iter().enumerate().map(|(b, &g)| order_key(g, b)));
        scratch.select_nth_unstable_by(n_past - 1, |a, b| b.cmp(a));
        &mut scratch[..n_past]
    };
    // The chosen blocks ascending (by id: the greater key's id is lower),
    // inline for the few slots.
    for j in 1..chosen.len() {
        let e = chosen[j];
        let mut i = j;
        while i > 0 && key_block(chosen[i - 1]) > key_block(e) {
            chosen[i] = chosen[i - 1];
            i -= 1;
        }
        chosen[i] = e;
    }
    for (j, slot) in row.iter_mut().enumerate() {
        *slot = match j.cmp(&n_past) {
            Ordering::Less => key_block(chosen[j]) as i32,
            Ordering::Equal => c as i32,
            Ordering::Greater => -1,
        };
    }
}

/// Rows `t0 .. t1` of one sequence's keys (`row` elements each), as
/// [`kernels::sums`] adds them: in place when they are unscaled float32,
/// bfloat16 or float16, else decoded (times their scale, rounded to float32)
/// into `buf`.
fn key_rows<'a>(
    k: Encoded<'a>,
    scale: Option<&[f32]>,
    row: usize,
    t0: usize,
    t1: usize,
    buf: &'a mut Vec<f32>,
) -> Encoded<'a> {
    if scale.is_none() && !matches!(k, Encoded::Fp8E4m3(_)) {
        return k.slice(t0 * row, t1 * row);
    }
    buf.resize((t1 - t0) * row, 0.0);
    k.decode(t0 * row, buf);
    if let Some(s) = scale {
        for (r, c) in buf.chunks_exact_mut(row).zip(&s[t0..t1]) {
            r.iter_mut().for_each(|v| *v *= c);
        }
    }
    Encoded::F32(buf)
}

/// Key rows a block's sum reads at a time.
const ROWS: usize = 16;

/// Queries whose gates one kernel call computes.
const CHUNK: usize = 16;

/// Groups of eight queries ahead whose rows [`rows`] asks the L2 cache for.
const AHEAD: usize = 4;

/// The float32 means of `n` complete blocks, laid out `[n_kv_heads, n, d8]`,
/// zero padded: each block's sum in token order (`add(t0, t1, acc)` adds
/// rows `t0 .. t1` of the sequence into `acc`, row after row, through
/// [`kernels::sums`]; at most [`ROWS`] rows a call), times `fl(1 /
/// block_size)`.
fn block_means(shape: Shape, n: usize, mut add: impl FnMut(usize, usize, &mut [f32])) -> Vec<f32> {
    let (h, d, d8, bs) = (
        shape.heads.n_kv_heads,
        shape.heads.d,
        shape.d8(),
        shape.block_size,
    );
    let mut means = vec![0.0f32; h * n * d8];
    let mut acc = vec![0.0f32; h * d];
    let factor = 1.0f32 / bs as f32;
    for b in 0..n {
        acc.fill(0.0);
        let mut t = b * bs;
        while t < (b + 1) * bs {
            let t1 = (t + ROWS).min((b + 1) * bs);
            add(t, t1, &mut acc);
            t = t1;
        }
        for g in 0..h {
            let dst = &mut means[(g * n + b) * d8..][..d];
            for (m, s) in dst.iter_mut().zip(&acc[g * d..(g + 1) * d]) {
                *m = s * factor;
            }
        }
    }
    means
}

/// One sequence's rows: queries `q` (`[n_q, n_q_heads, d]` float32), the
/// query `i` at position `n_k − n_q + i`, the means of its complete past
/// blocks (`[n_kv_heads, n_means, d8]`); `out` `[n_q, n_q_heads, w]`.
#[allow(clippy::too_many_arguments)]
fn rows(
    isa: Isa,
    shape: Shape,
    q: &[f32],
    n_k: usize,
    means: &[f32],
    n_means: usize,
    topk: usize,
    variant: Variant,
    w: usize,
    out: &mut [i32],
) {
    let (hq, d, d8, g) = (
        shape.heads.n_q_heads,
        shape.heads.d,
        shape.d8(),
        shape.group(),
    );
    let n_q = q.len() / (hq * d).max(1);
    if n_q == 0 {
        return;
    }
    let (first, bs) = (n_k - n_q, shape.block_size);
    // `count` queries from local query `i0`, all in one block `c`. Query
    // rows are read in place when `d` is a multiple of 8, else copied zero
    // padded. Eight queries at a time while there are eight (and the row
    // keeps 1 to `TOP_MAX` past blocks): head after head, the eight rows of
    // one head in the lanes against its KV head's means (`moba.lanes`),
    // their top blocks together (`moba.top`), so that the queries stream
    // through once, in memory order, and the means stay in the L1 cache.
    // The rest (fewer than eight queries: a decode step, a block's end)
    // and rows keeping more slots: for each KV head, its group's rows
    // against the means, [`CHUNK`] queries a kernel call, so that their
    // gates stay in the L1 cache for the top-k. Both give every row the
    // same gates (the same bits) and the same top blocks ([`rank`]).
    let group = |i0: usize, count: usize, dest: &mut [i32]| {
        let c = (first + i0) / bs;
        let n_past = past_blocks_read(variant, topk, c);
        let mut scratch = Vec::new();
        if n_past >= c {
            for row in dest.chunks_mut(w) {
                write_row(&[], c, n_past, &mut scratch, row);
            }
            return;
        }
        let in_place = d == d8;
        let tiled = if (1..=kernels::TOP_MAX).contains(&n_past) {
            count / 8 * 8
        } else {
            0
        };
        if tiled > 0 {
            let mut q8 = vec![0.0f32; if in_place { 0 } else { 8 * d8 }];
            let mut g8 = vec![0.0f32; 8 * c];
            let mut ids = [0i32; 8 * kernels::TOP_MAX];
            let ids = &mut ids[..8 * n_past];
            for a in (0..tiled).step_by(8) {
                for h in 0..hq {
                    // Each head's step asks the L2 for one `hq`-th of the
                    // eight queries `AHEAD` groups on (`8 · d` of their
                    // `8 · hq · d` floats, in memory order: the group's
                    // steps cover them once), the same amount every step,
                    // so the hardware's prefetch, which follows these
                    // eight rows' pages and does not cross into the next,
                    // is never left to start a group alone. The L2 (not
                    // the L1, which holds the rows being read and the
                    // means) keeps them until their group.
                    let ahead = ((i0 + a + 8 * AHEAD) * hq + 8 * h) * d;
                    kernels::prefetch(q.get(ahead..).unwrap_or_default(), 8 * d);
                    let at = |l: usize| ((i0 + a + l) * hq + h) * d;
                    let rows: [usize; 8] = if in_place {
                        std::array::from_fn(at)
                    } else {
                        for l in 0..8 {
                            q8[l * d8..][..d].copy_from_slice(&q[at(l)..][..d]);
                        }
                        std::array::from_fn(|l| l * d8)
                    };
                    let m = &means[h / g * n_means * d8..][..c * d8];
                    kernels::lanes(isa, if in_place { q } else { &q8 }, &rows, m, d8, &mut g8);
                    kernels::top(isa, &g8, n_past, ids);
                    for l in 0..8 {
                        let row = &mut dest[((a + l) * hq + h) * w..][..w];
                        // Slot by slot: a `fill` of the padding (empty here,
                        // where `w = topk = n_past + 1`) is a `memset` call
                        // per row.
                        for (s, slot) in row.iter_mut().enumerate() {
                            *slot = match s.cmp(&n_past) {
                                Ordering::Less => ids[s * 8 + l],
                                Ordering::Equal => c as i32,
                                Ordering::Greater => -1,
                            };
                        }
                    }
                }
            }
        }
        let mut qp = vec![0.0f32; if in_place { 0 } else { CHUNK * g * d8 }];
        let mut offsets = Vec::with_capacity(CHUNK * g);
        let mut gates = vec![0.0f32; CHUNK * g * c];
        for a in (tiled..count).step_by(CHUNK) {
            let n = CHUNK.min(count - a);
            for kv in 0..shape.heads.n_kv_heads {
                offsets.clear();
                for i in 0..n {
                    for j in 0..g {
                        let at = ((i0 + a + i) * hq + kv * g + j) * d;
                        if in_place {
                            offsets.push(at);
                        } else {
                            let r = i * g + j;
                            qp[r * d8..][..d].copy_from_slice(&q[at..][..d]);
                            offsets.push(r * d8);
                        }
                    }
                }
                let m = &means[kv * n_means * d8..][..c * d8];
                let gh = &mut gates[..n * g * c];
                kernels::gates(isa, if in_place { q } else { &qp }, &offsets, m, d8, gh);
                for i in 0..n {
                    for j in 0..g {
                        let row = &mut dest[((a + i) * hq + kv * g + j) * w..][..w];
                        write_row(&gh[(i * g + j) * c..][..c], c, n_past, &mut scratch, row);
                    }
                }
            }
        }
    };
    // A partial first block, whole blocks (split across the pool), a partial
    // last block.
    let per = hq * w;
    let head = ((bs - first % bs) % bs).min(n_q);
    let (head_out, rest) = out.split_at_mut(head * per);
    if head > 0 {
        group(0, head, head_out);
    }
    let whole = (n_q - head) / bs;
    let (mid_out, tail_out) = rest.split_at_mut(whole * bs * per);
    let work = (bs * hq * d * n_means.max(1)).max(1);
    crate::pool::for_each_row_mut(mid_out, bs * per, crate::pool::min_rows(work), |j, dest| {
        group(head + j * bs, bs, dest)
    });
    let tail = n_q - head - whole * bs;
    if tail > 0 {
        group(head + whole * bs, tail, tail_out);
    }
}

/// The queries as float32: float32 queries read in place, others decoded.
fn borrowed_or_decoded<'a>(q: Encoded<'a>) -> std::borrow::Cow<'a, [f32]> {
    match q {
        Encoded::F32(s) => std::borrow::Cow::Borrowed(s),
        other => std::borrow::Cow::Owned(decoded(other)),
    }
}

/// The query decoded to float32.
fn decoded(q: Encoded<'_>) -> Vec<f32> {
    let mut v = vec![0.0f32; q.len()];
    q.decode(0, &mut v);
    v
}

/// The blocks each query reads: MoBA's selection over a packed batch (one
/// sequence: `cu_seqlens = [0, n_keys]`).
///
/// `q` is `[n_queries, n_q_heads, d]`, `k` `[n_keys, n_kv_heads, d]` (any key
/// format, `key_scale` one float32 scale per key), sequence `s` is keys
/// `cu_seqlens[s] .. cu_seqlens[s + 1]` and queries `cu_seqlens_q[s] ..
/// cu_seqlens_q[s + 1]` (`None`: `cu_seqlens`), its queries the last of its
/// positions. `out` is `[n_queries, n_q_heads, width]` ([`width`], `max_blocks`
/// the most blocks a query of the batch sees): each row's block ids (of its
/// own sequence, from 0) ascending, then `-1`.
///
/// # Errors
/// A zero in `shape` (named), `q` heads not a multiple of the KV heads
/// (`q`), `topk` 0 (`topk`), `q`, `k` or `key_scale` of another length (named),
/// `cu_seqlens` not rising from 0 to `n_keys` (`cu_seqlens`), `cu_seqlens_q`
/// not rising from 0 to `n_queries` or giving a sequence more queries than
/// keys (`cu_seqlens_q`), `out` of another size (`out`). Nothing is written
/// before every check has passed.
#[allow(clippy::too_many_arguments)]
pub fn select_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    key_scale: Option<&[f32]>,
    cu_seqlens: &[usize],
    cu_seqlens_q: Option<&[usize]>,
    shape: Shape,
    topk: usize,
    variant: Variant,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_settings(shape, Some(topk))?;
    let row = checked_size("k", &[shape.heads.n_kv_heads, shape.heads.d])?;
    let qrow = checked_size("q", &[shape.heads.n_q_heads, shape.heads.d])?;
    if !k.len().is_multiple_of(row) {
        let message = format!("k holds {} values, not whole [n_kv_heads, d] rows", k.len());
        return Err(invalid("k", message));
    }
    if !q.len().is_multiple_of(qrow) {
        let message = format!("q holds {} values, not whole [n_q_heads, d] rows", q.len());
        return Err(invalid("q", message));
    }
    let (n_k, n_q) = (k.len() / row, q.len() / qrow);
    if let Some(s) = key_scale {
        check_len("key_scale", s.len(), n_k, || format!("[n_keys={n_k}]"))?;
    }
    let cu_k = crate::packed::boundaries(cu_seqlens, n_k, ("keys", "k"))?;
    let cu_q = cu_seqlens_q.unwrap_or(&cu_k);
    let lens: Vec<usize> = cu_k.windows(2).map(|w| w[1] - w[0]).collect();
    crate::packed::query_bounds(cu_q, "cu_seqlens", &lens, "keys", n_q)?;
    let max_blocks = cu_k
        .windows(2)
        .map(|w| (w[1] - w[0]).div_ceil(shape.block_size))
        .max()
        .unwrap_or(0);
    let w = width(variant, topk, max_blocks);
    let want = checked_size("out", &[n_q, shape.heads.n_q_heads, w])?;
    if out.len() != want {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: want,
            actual: out.len(),
            shape: format!(
                "[n_queries={n_q}, n_q_heads={}, width={w}]",
                shape.heads.n_q_heads
            ),
        });
    }
    let isa = Isa::best();
    let qf = borrowed_or_decoded(q);
    for s in 0..cu_k.len() - 1 {
        let (k0, k1, q0, q1) = (cu_k[s], cu_k[s + 1], cu_q[s], cu_q[s + 1]);
        if q1 == q0 {
            continue;
        }
        // The last query's past blocks: every block a query here gates.
        let n_means = (k1 - k0 - 1) / shape.block_size;
        let gated = topk > 1 || variant == Variant::Naive;
        let means = if gated && n_means > 0 {
            let mut buf = Vec::new();
            block_means(shape, n_means, |t0, t1, acc| {
                let rows = key_rows(k, key_scale, row, k0 + t0, k0 + t1, &mut buf);
                kernels::sums(isa, acc, rows)
            })
        } else {
            Vec::new()
        };
        rows(
            isa,
            shape,
            &qf[q0 * qrow..q1 * qrow],
            k1 - k0,
            &means,
            n_means,
            topk,
            variant,
            w,
            &mut out[q0 * shape.heads.n_q_heads * w..q1 * shape.heads.n_q_heads * w],
        );
    }
    Ok(())
}

/// The float32 gates of one sequence's queries: `out` `[n_queries, n_q_heads,
/// n_blocks]`, `n_blocks = ⌈n_keys / block_size⌉`, the gate of every past
/// block of the query (`b < c`) and `NaN` for its current and future blocks
/// (which are not gated). The values [`select_into`] ranks.
///
/// # Errors
/// As [`select_into`] (one sequence, `n_queries ≤ n_keys`: `q`).
pub fn gates_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    key_scale: Option<&[f32]>,
    shape: Shape,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    check_settings(shape, None)?;
    let (row, qrow) = (
        shape.heads.n_kv_heads * shape.heads.d,
        shape.heads.n_q_heads * shape.heads.d,
    );
    if !k.len().is_multiple_of(row) || !q.len().is_multiple_of(qrow) {
        let message = format!(
            "q ({} values) and k ({} values) must be whole [n_q_heads, d] and [n_kv_heads, d] rows",
            q.len(),
            k.len()
        );
        return Err(invalid("q", message));
    }
    let (n_k, n_q) = (k.len() / row, q.len() / qrow);
    if n_q > n_k {
        let message =
            format!("{n_q} queries over {n_k} keys: queries are the last keys' positions");
        return Err(invalid("q", message));
    }
    if let Some(s) = key_scale {
        check_len("key_scale", s.len(), n_k, || format!("[n_keys={n_k}]"))?;
    }
    let nb = n_k.div_ceil(shape.block_size);
    let want = checked_size("out", &[n_q, shape.heads.n_q_heads, nb])?;
    if out.len() != want {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: want,
            actual: out.len(),
            shape: format!(
                "[n_queries={n_q}, n_q_heads={}, n_blocks={nb}]",
                shape.heads.n_q_heads
            ),
        });
    }
    out.fill(f32::NAN);
    if n_q == 0 {
        return Ok(());
    }
    let n_means = (n_k - 1) / shape.block_size;
    let (isa, qf, d8, g) = (Isa::best(), decoded(q), shape.d8(), shape.group());
    let mut buf = Vec::new();
    let means = block_means(shape, n_means, |t0, t1, acc| {
        kernels::sums(isa, acc, key_rows(k, key_scale, row, t0, t1, &mut buf))
    });
    let mut qp = vec![0.0f32; g * d8];
    let offsets: Vec<usize> = (0..g).map(|j| j * d8).collect();
    let mut gates = Vec::new();
    for i in 0..n_q {
        let c = (n_k - n_q + i) / shape.block_size;
        gates.resize(g * c, 0.0);
        for kv in 0..shape.heads.n_kv_heads {
            for j in 0..g {
                let h = kv * g + j;
                qp[j * d8..j * d8 + shape.heads.d].copy_from_slice(
                    &qf[(i * shape.heads.n_q_heads + h) * shape.heads.d..][..shape.heads.d],
                );
            }
            kernels::gates(
                isa,
                &qp,
                &offsets,
                &means[kv * n_means * d8..][..c * d8],
                d8,
                &mut gates,
            );
            for j in 0..g {
                let h = kv * g + j;
                out[(i * shape.heads.n_q_heads + h) * nb..][..c]
                    .copy_from_slice(&gates[j * c..(j + 1) * c]);
            }
        }
    }
    Ok(())
}

/// MoBA's selection at decode over an engine's paged cache: sequence `s`'s
/// one query (`q` `[n_seqs, n_q_heads, d]`) at position `seq_lens[s] − 1`
/// (`table.seq_lens`), its keys the first `seq_lens[s]` tokens of its
/// block-table row (the cache's
/// row is `n_kv_heads · d` elements, as [`crate::keys::paged`] reads it; a
/// `Fp8WithScales` page's scale is one per token). `out` `[n_seqs,
/// n_q_heads, width]`; equal, row for row, to [`select_into`] on the same
/// keys laid out densely.
///
/// # Errors
/// As [`select_into`], the cache, table or `seq_lens` refused as
/// [`crate::keys::paged`] refuses them (`kv_cache`, `block_table`,
/// `seq_lens`), a sequence with no token (`seq_lens`), a cache row that is
/// not `n_kv_heads · d` (`kv_cache`).
pub fn select_paged_into(
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    shape: Shape,
    topk: usize,
    variant: Variant,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_settings(shape, Some(topk))?;
    cache.check()?;
    let row = checked_size("k", &[shape.heads.n_kv_heads, shape.heads.d])?;
    if cache.d != row {
        let message = format!(
            "the cache's rows hold {} elements, not n_kv_heads * d = {row}",
            cache.d
        );
        return Err(invalid("kv_cache", message));
    }
    let seq_lens = table.seq_lens;
    let n = seq_lens.len();
    crate::keys::paged::check_decode_lens(seq_lens)?;
    table.check(cache.n_pages, cache.block_size)?;
    let qrow = checked_size("q", &[shape.heads.n_q_heads, shape.heads.d])?;
    check_len("q", q.len(), checked_size("q", &[n, qrow])?, || {
        format!(
            "[n_seqs={n}, n_q_heads={}, d={}]",
            shape.heads.n_q_heads, shape.heads.d
        )
    })?;
    let max_blocks = seq_lens
        .iter()
        .map(|&l| l.div_ceil(shape.block_size))
        .max()
        .unwrap_or(0);
    let w = width(variant, topk, max_blocks);
    let want = checked_size("out", &[n, shape.heads.n_q_heads, w])?;
    if out.len() != want {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: want,
            actual: out.len(),
            shape: format!(
                "[n_seqs={n}, n_q_heads={}, width={w}]",
                shape.heads.n_q_heads
            ),
        });
    }
    let (isa, qf) = (Isa::best(), decoded(q));
    let bs = cache.block_size;
    let scaled = cache.layout == crate::keys::PageLayout::Fp8WithScales;
    let (mut buf, mut scales) = (Vec::new(), [0.0f32; ROWS]);
    for (s, &len) in seq_lens.iter().enumerate() {
        let n_means = (len - 1) / shape.block_size;
        let gated = topk > 1 || variant == Variant::Naive;
        let means = if gated && n_means > 0 {
            block_means(shape, n_means, |t0, t1, acc| {
                // Rows t0 .. t1, a page's run at a time: float32 pages read
                // in place, others decoded (times their scale) into `buf`.
                let mut t = t0;
                while t < t1 {
                    let (page, r0) = (table.page(s, t / bs), t % bs);
                    let n = (t1 - t).min(bs - r0);
                    // (fp8 is decoded first, scaled or not: the sums take
                    // float32 / bfloat16 / float16 rows only.)
                    match cache.page_keys(page) {
                        Some(p) if !scaled && !matches!(p, Encoded::Fp8E4m3(_)) => {
                            kernels::sums(isa, acc, p.slice(r0 * row, (r0 + n) * row));
                        }
                        _ => {
                            buf.resize(n * row, 0.0);
                            cache.decode(page, r0, &mut buf, &mut scales[..n]);
                            if scaled {
                                for (r, c) in buf.chunks_exact_mut(row).zip(&scales[..n]) {
                                    r.iter_mut().for_each(|v| *v *= c);
                                }
                            }
                            kernels::sums(isa, acc, Encoded::F32(&buf));
                        }
                    }
                    t += n;
                }
            })
        } else {
            Vec::new()
        };
        rows(
            isa,
            shape,
            &qf[s * qrow..(s + 1) * qrow],
            len,
            &means,
            n_means,
            topk,
            variant,
            w,
            &mut out[s * shape.heads.n_q_heads * w..(s + 1) * shape.heads.n_q_heads * w],
        );
    }
    Ok(())
}
