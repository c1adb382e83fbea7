//! Baseline selectors, and a sparse attention pass to measure what a
//! selection costs in output.
//!
//! # Selectors: the rule
//!
//! A selector is asked for the candidates of query row `i` of a causal
//! sequence: keys `0..=i` exist, nothing after. Every selector returns
//! distinct, ascending, causal key offsets (`i32`, as the top-k buffers use),
//! never more than its budget. Each has a per-row entry point, so one row
//! costs work proportional to what it returns, never an `[L, L]` mask, and a
//! batched form writing fixed-width rows padded with `-1`
//! ([`Selector::rows_into`], [`Selector::selection_into`]).
//!
//! - [`Selector::Dense`]: every causal key; [`Selector::Local`]: the
//!   `window` most recent, the query's own key included;
//!   [`Selector::SinkWindow`]: StreamingLLM's first `sinks` keys plus a
//!   local window; [`Selector::Random`]: `budget` distinct keys drawn
//!   uniformly (ChaCha8, keyed by the seed on stream `i`, so a row's draw is
//!   a function of `(seed, i)` alone: asking for more rows, in another
//!   order, on more threads, changes nothing).
//! - [`OracleTopK`]: the keys with the largest *true* attention weights.
//!   It needs the dense attention row, which is exactly what a sparse method
//!   exists to avoid computing, so it is unusable in production; it is the
//!   diagnostic ceiling of attention-mass recall at a budget. Being
//!   score-based, it is its own type rather than a [`Selector`] variant
//!   (`Selector::row(i)` has no scores to rank). Ties go to the lower key, so
//!   the choice is a function of the row, not of a sort's whims.
//!
//! The witness spec's null models are the last row of two selectors:
//! [`crate::witness::random_null`] is row `L - 1` of [`Selector::Random`] and
//! [`crate::witness::locality_null`] is row `L - 1` of [`Selector::Local`]
//! (called, not reimplemented: a second implementation could drift).
//!
//! # Sparse attention: the rule
//!
//! Shapes are flat row-major slices ([`AttentionShape`]):
//!
//! - `q` is `[n_queries, n_q_heads, d_k]`, `k` is `[n_keys, n_kv_heads, d_k]`;
//! - value row `(key j, kv head h)` is the `d_v` floats starting at
//!   `v[(j · n_kv_heads + h) · v_stride]`. A contiguous `[n_keys, n_kv_heads,
//!   d_v]` array has `v_stride = d_v`; MLA's values, the first `d_v` columns
//!   of the single latent KV head, are `v = k, v_stride = d_k` -- read in
//!   place, never copied ([`causal_mla_attention_sparse`]);
//! - `query_pos[i]` is query `i`'s position; it sees keys
//!   `0..=min(query_pos[i], n_keys - 1)` (a position past the keys is clipped
//!   to what exists, as block selection does);
//! - a selection is `[n_queries, n_kv_heads, width]` `i32` key indices. GQA:
//!   query head `h` reads KV head `h / (n_q_heads / n_kv_heads)` (contiguous
//!   groups, as `repeat_interleave` builds them), and a KV head's selection
//!   serves its whole query-head group;
//! - outputs: `out` `[n_queries, n_q_heads, d_v]` and `lse`
//!   `[n_queries, n_q_heads]`, the natural log-sum-exp of the scaled scores.
//!
//! A row attends to the *set* of its valid entries: an entry counts iff
//! `0 <= x <= min(query_pos, n_keys - 1)`. Any negative entry is padding;
//! an entry after the query (or past the keys) is masked exactly like a
//! future key in dense attention -- it counts for nothing, the same rule as
//! the metrics' `C ∩ [0, L)`. Duplicates count once. So the output is a
//! function of the set: permuting a row, padding it, or repeating an entry
//! leaves it bit-identical. A row whose set is empty gets zeros and
//! `lse = -inf`, never NaN, and is counted in the returned number (a
//! softmax over nothing is 0/0; the zeros are a convention, the count is
//! how the caller learns it happened). [`dense_attention`] is the same pass
//! over every causal key.
//!
//! # Numbers: one summation order, everywhere
//!
//! The softmax is exact two-pass, not online: scores `s_j = (q·k_j)·scale`,
//! `m = max s_j`, `p_j = exp(s_j - m)`, `l = Σ p_j`, `o = (Σ p_j v_j) / l`,
//! `lse = m + ln l`. The max subtraction keeps every `p_j` in `[0, 1]`, so
//! nothing overflows; `exp` underflowing to 0 for `s_j - m < -87.3` only
//! drops keys weighing under `1e-38` of the largest. Every rounding step is
//! pinned, on every SIMD level:
//!
//! - `q·k_j` is one fused multiply-add chain in dimension order,
//!   `acc = fma(q_c, k_jc, acc)` from `acc = 0`;
//! - `exp` is a fixed sequence of IEEE operations (Cephes' range reduction
//!   and degree-5 polynomial, written with `fma`), not libm's `expf`;
//! - `l` is summed in 8 lanes (lane `t` takes keys `t, t + 8, …` of the
//!   row's key list in order), then `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`;
//! - each output element is one `fma` chain over the key list in ascending
//!   key order, then divided by `l`.
//!
//! The AVX2+FMA kernels run these chains eight keys or columns at a time;
//! the portable kernels run the same chains one at a time with
//! `f32::mul_add`. So the two levels are bit-identical (a test checks it
//! with `KVSELECT_SIMD=scalar` in a child process), and since a row's result
//! does not depend on which rows share its tile or its thread, the thread
//! count changes nothing, and a sparse pass over the full causal selection
//! equals [`dense_attention`] bit for bit. What would break it: an online
//! (flash) softmax with a tile size that differs between the two passes, a
//! horizontal-sum dot product on one level only, or libm's `expf`.
//! Non-finite inputs give non-finite outputs (a NaN score makes its row NaN),
//! as in any attention.
//!
//! # Cost
//!
//! A sparse row gathers only its selected keys -- transposed into a packed
//! tile with 8×8 register transposes, the next rows prefetched -- and reads
//! its value rows in place through `v_stride` (prefetched a chunk ahead):
//! `O(k · d)` per query head for `k` selected keys, plus `O(width)` to read
//! the row (and a sort only when a row is not already ascending), never
//! `O(L)`. With few query heads per KV head, that gather of scattered rows
//! from memory, not arithmetic, is what a sparse row costs. The dense pass
//! packs each KV head's keys once, then computes tiles of 4 rows × 16 keys
//! with 8 AVX2 accumulators, 16 rows sharing each key tile while it is in
//! L1, skipping key tiles above every row's causal limit; values are
//! accumulated 4 rows × 16 columns per key. Work is split across the
//! crate's pool (never rayon's global one) by (query block, KV head),
//! writing disjoint output rows, so a single query's KV heads still run in
//! parallel; one query with one KV head runs on one thread.

use std::fmt;

use rand::seq::index;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::pool;
use crate::simd::{self, Level};

// ---------------------------------------------------------------------------
// Errors and shapes
// ---------------------------------------------------------------------------

/// A refused selector, attention or metrics call. Every message names the
/// argument it is about, and nothing is written to an output buffer before
/// every check has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttentionError {
    /// A buffer's length does not match the shape the other arguments give
    /// it.
    Length {
        /// The offending argument.
        argument: &'static str,
        /// Entries the shape needs.
        expected: usize,
        /// Entries the buffer has.
        actual: usize,
        /// How `expected` was computed.
        shape: String,
    },
    /// A dimension, stride, width or parameter is unusable.
    Invalid {
        /// The offending argument.
        argument: &'static str,
        /// The full message.
        message: String,
    },
    /// An entry of an argument is out of range.
    OutOfRange {
        /// The offending argument.
        argument: &'static str,
        /// The entry's index within the argument.
        index: usize,
        /// The full message.
        message: String,
    },
    /// A shape whose element count does not fit in `usize`.
    TooLarge {
        /// The argument whose size overflowed.
        argument: &'static str,
    },
}

impl AttentionError {
    /// The argument the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            AttentionError::Length { argument, .. }
            | AttentionError::Invalid { argument, .. }
            | AttentionError::OutOfRange { argument, .. }
            | AttentionError::TooLarge { argument } => argument,
        }
    }
}

impl fmt::Display for AttentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionError::Length {
                argument,
                expected,
                actual,
                shape,
            } => write!(
                f,
                "{argument} has {actual} entries, expected {expected} ({shape})"
            ),
            AttentionError::Invalid { message, .. }
            | AttentionError::OutOfRange { message, .. } => f.write_str(message),
            AttentionError::TooLarge { argument } => {
                write!(f, "{argument} is too large: its size overflows usize")
            }
        }
    }
}

impl std::error::Error for AttentionError {}

/// `Π factors`, or `TooLarge` naming `argument`.
pub(crate) fn checked_size(
    argument: &'static str,
    factors: &[usize],
) -> Result<usize, AttentionError> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or(AttentionError::TooLarge { argument })
}

/// Refuses `actual != expected`.
pub(crate) fn check_len(
    argument: &'static str,
    actual: usize,
    expected: usize,
    shape: impl FnOnce() -> String,
) -> Result<(), AttentionError> {
    if actual != expected {
        return Err(AttentionError::Length {
            argument,
            expected,
            actual,
            shape: shape(),
        });
    }
    Ok(())
}

/// The usual softmax scale, `1 / sqrt(d_k)` (1 for `d_k = 0`).
pub fn softmax_scale(d_k: usize) -> f32 {
    if d_k == 0 {
        1.0
    } else {
        (1.0 / (d_k as f64).sqrt()) as f32
    }
}

/// The sizes of an attention call (see the module docs for the layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Queries (rows of `q`, entries of `query_pos`).
    pub n_queries: usize,
    /// Query heads per query; a multiple of `n_kv_heads`.
    pub n_q_heads: usize,
    /// KV heads per key (1 for MLA's latent head).
    pub n_kv_heads: usize,
    /// Query/key head dimension.
    pub d_k: usize,
    /// Value head dimension (for MLA, at most `d_k`).
    pub d_v: usize,
    /// Keys (positions) in the KV buffer.
    pub n_keys: usize,
}

impl AttentionShape {
    /// MLA: `n_heads` query heads sharing one latent KV head.
    pub fn mla(n_queries: usize, n_heads: usize, d_k: usize, d_v: usize, n_keys: usize) -> Self {
        AttentionShape {
            n_queries,
            n_q_heads: n_heads,
            n_kv_heads: 1,
            d_k,
            d_v,
            n_keys,
        }
    }

    /// Query heads per KV head (`n_q_heads / n_kv_heads`; 0 if
    /// `n_kv_heads == 0`, which [`Self::validate`] refuses).
    pub fn group(&self) -> usize {
        self.n_q_heads.checked_div(self.n_kv_heads).unwrap_or(0)
    }

    /// Refuses `n_kv_heads == 0` and an `n_q_heads` that is not a multiple
    /// of `n_kv_heads`.
    pub fn validate(&self) -> Result<(), AttentionError> {
        if self.n_kv_heads == 0 {
            return Err(AttentionError::Invalid {
                argument: "n_kv_heads",
                message: "n_kv_heads is 0: every query head needs a KV head to read".into(),
            });
        }
        if self.n_q_heads % self.n_kv_heads != 0 {
            return Err(AttentionError::Invalid {
                argument: "n_q_heads",
                message: format!(
                    "n_q_heads={} is not a multiple of n_kv_heads={} (GQA groups must be equal)",
                    self.n_q_heads, self.n_kv_heads
                ),
            });
        }
        Ok(())
    }

    /// Checks `q` and `k` against the shape.
    pub(crate) fn check_qk(&self, q: &[f32], k: &[f32]) -> Result<(), AttentionError> {
        self.validate()?;
        let nq = checked_size("q", &[self.n_queries, self.n_q_heads, self.d_k])?;
        check_len("q", q.len(), nq, || {
            format!(
                "[n_queries={}, n_q_heads={}, d_k={}]",
                self.n_queries, self.n_q_heads, self.d_k
            )
        })?;
        let nk = checked_size("k", &[self.n_keys, self.n_kv_heads, self.d_k])?;
        check_len("k", k.len(), nk, || {
            format!(
                "[n_keys={}, n_kv_heads={}, d_k={}]",
                self.n_keys, self.n_kv_heads, self.d_k
            )
        })
    }

    /// The keys query position `pos` sees: `min(pos + 1, n_keys)`.
    pub(crate) fn visible(&self, pos: usize) -> usize {
        pos.saturating_add(1).min(self.n_keys)
    }
}

fn check_query_pos(query_pos: &[usize], n_queries: usize) -> Result<(), AttentionError> {
    check_len("query_pos", query_pos.len(), n_queries, || {
        format!("one position per query, n_queries={n_queries}")
    })
}

fn check_scale(scale: f32) -> Result<(), AttentionError> {
    if !scale.is_finite() {
        return Err(AttentionError::Invalid {
            argument: "scale",
            message: format!("scale={scale} is not finite"),
        });
    }
    Ok(())
}

/// Checks a pass's arguments (all but the selection).
#[allow(clippy::too_many_arguments)]
fn check_pass(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    scale: f32,
    out: &[f32],
    lse: &[f32],
) -> Result<(), AttentionError> {
    shape.check_qk(q, k)?;
    if v_stride < shape.d_v {
        return Err(AttentionError::Invalid {
            argument: "v_stride",
            message: format!(
                "v_stride={v_stride} is less than d_v={}: value rows would overlap",
                shape.d_v
            ),
        });
    }
    let rows = checked_size("v", &[shape.n_keys, shape.n_kv_heads])?;
    let need = match rows.checked_sub(1) {
        None => 0,
        Some(last) => last
            .checked_mul(v_stride)
            .and_then(|x| x.checked_add(shape.d_v))
            .ok_or(AttentionError::TooLarge { argument: "v" })?,
    };
    if v.len() < need {
        return Err(AttentionError::Length {
            argument: "v",
            expected: need,
            actual: v.len(),
            shape: format!(
                "at least ((n_keys={} x n_kv_heads={}) - 1) x v_stride={} + d_v={}",
                shape.n_keys, shape.n_kv_heads, v_stride, shape.d_v
            ),
        });
    }
    check_query_pos(query_pos, shape.n_queries)?;
    check_scale(scale)?;
    let no = checked_size("out", &[shape.n_queries, shape.n_q_heads, shape.d_v])?;
    check_len("out", out.len(), no, || {
        format!(
            "[n_queries={}, n_q_heads={}, d_v={}]",
            shape.n_queries, shape.n_q_heads, shape.d_v
        )
    })?;
    let nl = checked_size("lse", &[shape.n_queries, shape.n_q_heads])?;
    check_len("lse", lse.len(), nl, || {
        format!(
            "[n_queries={}, n_q_heads={}]",
            shape.n_queries, shape.n_q_heads
        )
    })
}

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

/// A score-free selection rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selector {
    /// Every causal key.
    Dense,
    /// The `window` most recent keys, the query's own key included.
    Local {
        /// How many keys, counting back from the query.
        window: usize,
    },
    /// `budget` distinct keys drawn uniformly from the causal set.
    ///
    /// The draw for row `i` uses ChaCha8 (`rand_chacha`, a stable, documented
    /// stream cipher RNG) keyed by `seed` on stream `i`, and
    /// `rand::seq::index::sample` (both pinned exactly in `Cargo.toml`, so a
    /// seed draws the same keys from one release to the next). Rows are
    /// independent: row `i`'s draw does not depend on how many rows are asked.
    Random {
        /// Keys per row (fewer when the row has fewer causal keys).
        budget: usize,
        /// The draw's seed.
        seed: u64,
    },
    /// StreamingLLM: the first `sinks` keys plus the `window` most recent.
    SinkWindow {
        /// Attention-sink keys at the start of the sequence.
        sinks: usize,
        /// Most recent keys, the query's own included.
        window: usize,
    },
}

/// The largest row whose candidates fit in `i32` offsets.
const MAX_ROW: usize = i32::MAX as usize - 1;

impl Selector {
    /// The candidates of query row `row` (keys `0..=row` exist), ascending.
    pub fn row(&self, row: usize) -> Vec<i32> {
        let len = row.saturating_add(1);
        match *self {
            Selector::Dense => range_i32(0, len),
            Selector::Local { window } => range_i32(len.saturating_sub(window), len),
            Selector::Random { budget, seed } => random_draw(len, budget, seed, row as u64),
            Selector::SinkWindow { sinks, window } => {
                let tail_start = len.saturating_sub(window);
                let head_end = sinks.min(tail_start);
                let mut out = range_i32(0, head_end);
                out.extend(range_i32(tail_start, len));
                out
            }
        }
    }

    /// How many candidates row `row` has: the width a buffer needs for it.
    pub fn row_len(&self, row: usize) -> usize {
        let len = row.saturating_add(1);
        match *self {
            Selector::Dense => len,
            Selector::Local { window } => window.min(len),
            Selector::Random { budget, .. } => budget.min(len),
            Selector::SinkWindow { sinks, window } => {
                let tail = window.min(len);
                tail + sinks.min(len - tail)
            }
        }
    }

    /// Writes row `row`'s candidates into `out` (at least
    /// [`Self::row_len`] slots), then `-1` padding.
    fn fill_row(&self, row: usize, out: &mut [i32]) {
        /// Writes `start..end` at `out[n..]`; returns the new `n`.
        fn put(out: &mut [i32], n: usize, start: usize, end: usize) -> usize {
            for (o, x) in out[n..n + (end - start)].iter_mut().zip(start..end) {
                *o = x as i32;
            }
            n + (end - start)
        }
        let len = row + 1;
        let n = match *self {
            Selector::Dense => put(out, 0, 0, len),
            Selector::Local { window } => put(out, 0, len.saturating_sub(window), len),
            Selector::Random { budget, seed } => {
                let draw = random_draw(len, budget, seed, row as u64);
                out[..draw.len()].copy_from_slice(&draw);
                draw.len()
            }
            Selector::SinkWindow { sinks, window } => {
                let tail_start = len.saturating_sub(window);
                let n = put(out, 0, 0, sinks.min(tail_start));
                put(out, n, tail_start, len)
            }
        };
        out[n..].fill(-1);
    }

    /// Checks that every row is representable and fits `width` slots.
    fn check_rows(
        &self,
        rows: &[usize],
        argument: &'static str,
        width: usize,
    ) -> Result<(), AttentionError> {
        for (index, &row) in rows.iter().enumerate() {
            if row > MAX_ROW {
                return Err(AttentionError::OutOfRange {
                    argument,
                    index,
                    message: format!(
                        "{argument}[{index}]={row}: a row's keys must fit in i32 offsets \
                         (row <= {MAX_ROW})"
                    ),
                });
            }
            let need = self.row_len(row);
            if need > width {
                return Err(AttentionError::Invalid {
                    argument: "width",
                    message: format!(
                        "width={width} cannot hold row {row} ({argument}[{index}]) of {self:?}, \
                         which has {need} candidates"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The batched form: the candidates of each row in `rows` (query
    /// positions), written to `out` as `[rows.len(), width]`, ascending,
    /// `-1` padded. Refuses a row that needs more than `width` slots (see
    /// [`Self::row_len`]) or whose keys do not fit in `i32`. Rows are
    /// computed in parallel on the crate's pool; each row equals
    /// [`Self::row`].
    pub fn rows_into(
        &self,
        rows: &[usize],
        width: usize,
        out: &mut [i32],
    ) -> Result<(), AttentionError> {
        let n = checked_size("out", &[rows.len(), width])?;
        check_len("out", out.len(), n, || {
            format!("[rows={}, width={width}]", rows.len())
        })?;
        self.check_rows(rows, "rows", width)?;
        pool::for_each_row_mut(out, width, 64, |r, row| self.fill_row(rows[r], row));
        Ok(())
    }

    /// The attention-shaped batched form: `out` is `[n_queries, n_kv_heads,
    /// width]` (a [`sparse_attention`] selection), query `i`'s row being row
    /// `query_pos[i]`, the same for every KV head (score-free rules do not
    /// depend on the head). Same refusals as [`Self::rows_into`].
    pub fn selection_into(
        &self,
        query_pos: &[usize],
        n_kv_heads: usize,
        width: usize,
        out: &mut [i32],
    ) -> Result<(), AttentionError> {
        let n = checked_size("out", &[query_pos.len(), n_kv_heads, width])?;
        check_len("out", out.len(), n, || {
            format!(
                "[n_queries={}, n_kv_heads={n_kv_heads}, width={width}]",
                query_pos.len()
            )
        })?;
        self.check_rows(query_pos, "query_pos", width)?;
        pool::for_each_row_mut(out, n_kv_heads.saturating_mul(width), 16, |i, heads| {
            let (first, rest) = heads.split_at_mut(width);
            self.fill_row(query_pos[i], first);
            for h in rest.chunks_mut(width) {
                h.copy_from_slice(first);
            }
        });
        Ok(())
    }
}

fn range_i32(start: usize, end: usize) -> Vec<i32> {
    (start..end).map(|x| x as i32).collect()
}

/// `min(budget, len)` distinct offsets from `0..len`, ascending, drawn on
/// ChaCha8 stream `stream` of `seed`.
pub(crate) fn random_draw(len: usize, budget: usize, seed: u64, stream: u64) -> Vec<i32> {
    let amount = budget.min(len);
    if amount == len {
        return range_i32(0, len);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut out: Vec<i32> = index::sample(&mut rng, len, amount)
        .into_iter()
        .map(|x| x as i32)
        .collect();
    out.sort_unstable();
    out
}

/// The oracle: the `budget` keys with the largest true attention weights.
///
/// Needs the dense attention row (see [`crate::metrics::attention_probabilities`]),
/// so it is a diagnostic ceiling, never a production selector. Ranking is
/// the total order "weight descending, then key ascending" -- ties go to the
/// lower key -- with NaN read as `-inf` (it never outranks a real weight)
/// and `-0.0` as `+0.0`. Rows come back ascending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OracleTopK {
    /// Keys per row (fewer when the row has fewer causal keys).
    pub budget: usize,
}

/// The `budget` largest entries of `attention_row`, ties to the lower
/// index, ascending: the oracle over a row whose every entry is visible.
pub fn oracle_topk_row(attention_row: &[f64], budget: usize) -> Vec<i32> {
    let mut out = vec![-1; budget.min(attention_row.len())];
    let mut scratch = Vec::new();
    let n = top_k_into(attention_row, budget, &mut scratch, &mut out);
    out.truncate(n);
    out
}

/// Writes the top `min(budget, scores.len())` indices of `scores` into
/// `out`, ascending, then `-1` padding; returns how many.
fn top_k_into(scores: &[f64], budget: usize, idx: &mut Vec<usize>, out: &mut [i32]) -> usize {
    let n = scores.len();
    let amount = budget.min(n).min(out.len());
    if amount == n {
        for (j, o) in out[..n].iter_mut().enumerate() {
            *o = j as i32;
        }
    } else if amount > 0 {
        let key = |j: usize| {
            let s = scores[j];
            if s.is_nan() {
                f64::NEG_INFINITY
            } else {
                s + 0.0
            }
        };
        let order = |a: &usize, b: &usize| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
        idx.clear();
        idx.extend(0..n);
        idx.select_nth_unstable_by(amount - 1, order);
        let chosen = &mut idx[..amount];
        chosen.sort_unstable();
        for (o, &j) in out.iter_mut().zip(chosen.iter()) {
            *o = j as i32;
        }
    }
    out[amount..].fill(-1);
    amount
}

impl OracleTopK {
    /// Query row `row`'s candidates from its dense attention row: the top
    /// `budget` of `attention_row[0..=row]` (entries past `row` are future
    /// keys and ignored; a row shorter than `row + 1` is all visible).
    pub fn row(&self, row: usize, attention_row: &[f64]) -> Vec<i32> {
        let visible = row.saturating_add(1).min(attention_row.len());
        oracle_topk_row(&attention_row[..visible], self.budget)
    }

    /// How many candidates row `row` has when its attention row has
    /// `row_len` entries.
    pub fn row_len(&self, row: usize, row_len: usize) -> usize {
        self.budget.min(row.saturating_add(1)).min(row_len)
    }

    /// The batched form: `attention` is `[rows.len(), row_len]`, attention
    /// row `r` belonging to query row `rows[r]`; `out` is
    /// `[rows.len(), width]`, each row equal to [`Self::row`], `-1` padded.
    /// Refuses a `width` narrower than a row needs.
    pub fn rows_into(
        &self,
        attention: &[f64],
        row_len: usize,
        rows: &[usize],
        width: usize,
        out: &mut [i32],
    ) -> Result<(), AttentionError> {
        let na = checked_size("attention", &[rows.len(), row_len])?;
        check_len("attention", attention.len(), na, || {
            format!("[rows={}, row_len={row_len}]", rows.len())
        })?;
        let no = checked_size("out", &[rows.len(), width])?;
        check_len("out", out.len(), no, || {
            format!("[rows={}, width={width}]", rows.len())
        })?;
        self.check_width(rows, row_len, width, "rows")?;
        let budget = self.budget;
        pool::for_each_row_mut(out, width, 4, |r, o| {
            let visible = rows[r].saturating_add(1).min(row_len);
            let a = &attention[r * row_len..r * row_len + visible];
            top_k_into(a, budget, &mut Vec::new(), o);
        });
        Ok(())
    }

    fn check_width(
        &self,
        rows: &[usize],
        row_len: usize,
        width: usize,
        argument: &'static str,
    ) -> Result<(), AttentionError> {
        if row_len > MAX_ROW + 1 {
            return Err(AttentionError::Invalid {
                argument: "attention",
                message: format!("attention rows of {row_len} keys do not fit in i32 offsets"),
            });
        }
        for (index, &row) in rows.iter().enumerate() {
            let need = self.row_len(row, row_len);
            if need > width {
                return Err(AttentionError::Invalid {
                    argument: "width",
                    message: format!(
                        "width={width} cannot hold {argument}[{index}]={row}, which has {need} \
                         candidates (budget={})",
                        self.budget
                    ),
                });
            }
        }
        Ok(())
    }

    /// The attention-shaped batched form: `attention` is the dense
    /// probabilities `[n_queries, n_q_heads, n_keys]`
    /// ([`crate::metrics::attention_probabilities`]); `out` is a
    /// [`sparse_attention`] selection `[n_queries, n_kv_heads, width]`. A KV
    /// head's selection serves its whole query-head group, so each KV head
    /// ranks keys by the group's summed weight (summed in head order, in
    /// f64): the choice that maximises the group's total recall. Query `i`
    /// sees keys `0..=min(query_pos[i], n_keys - 1)`.
    pub fn selection_into(
        &self,
        attention: &[f64],
        shape: &AttentionShape,
        query_pos: &[usize],
        width: usize,
        out: &mut [i32],
    ) -> Result<(), AttentionError> {
        shape.validate()?;
        let na = checked_size(
            "attention",
            &[shape.n_queries, shape.n_q_heads, shape.n_keys],
        )?;
        check_len("attention", attention.len(), na, || {
            format!(
                "[n_queries={}, n_q_heads={}, n_keys={}]",
                shape.n_queries, shape.n_q_heads, shape.n_keys
            )
        })?;
        check_query_pos(query_pos, shape.n_queries)?;
        let no = checked_size("out", &[shape.n_queries, shape.n_kv_heads, width])?;
        check_len("out", out.len(), no, || {
            format!(
                "[n_queries={}, n_kv_heads={}, width={width}]",
                shape.n_queries, shape.n_kv_heads
            )
        })?;
        self.check_width(query_pos, shape.n_keys, width, "query_pos")?;
        let g = shape.group();
        let (n_kv, n_keys, budget) = (shape.n_kv_heads, shape.n_keys, self.budget);
        pool::for_each_row_mut(out, width, 4, |r, o| {
            let (i, h) = (r / n_kv, r % n_kv);
            let visible = shape.visible(query_pos[i]);
            let base = (i * shape.n_q_heads + h * g) * n_keys;
            let mut sum = vec![0.0f64; visible];
            for head in 0..g {
                let a = &attention[base + head * n_keys..base + head * n_keys + visible];
                for (s, &x) in sum.iter_mut().zip(a) {
                    *s += x;
                }
            }
            top_k_into(&sum, budget, &mut Vec::new(), o);
        });
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The attention pass
// ---------------------------------------------------------------------------

/// Rows scored together against each key tile while it is in L1.
const ROW_GROUP: usize = 16;
/// Keys per value-accumulation chunk (their value rows stay in cache while
/// every micro-tile of a row group uses them).
const KEY_CHUNK: usize = 64;
/// Queries per sparse task (per KV head).
const SPARSE_BLOCK: usize = 8;

/// What every row of a call shares.
struct Ctx<'a> {
    level: Level,
    q: &'a [f32],
    v: &'a [f32],
    d_k: usize,
    d_v: usize,
    scale: f32,
}

/// A row group's working buffers.
#[derive(Default)]
struct GroupBufs {
    /// Scores, then probabilities: `[rows, stride]`.
    s: Vec<f32>,
    /// Output accumulators: `[rows, d_v]`.
    o: Vec<f32>,
    /// Per row: `(m, l)`.
    ml: Vec<(f32, f32)>,
}

/// A worker's reusable buffers.
#[derive(Default)]
struct Scratch {
    /// A sparse row's keys, packed (see [`kernel::pack_keys`]).
    kt: Vec<f32>,
    /// A sparse row's key list.
    list: Vec<usize>,
    /// Offsets of its value rows in `v`.
    voff: Vec<usize>,
    /// The row group: offsets of its query rows in `q`, keys each sees.
    q_offs: Vec<usize>,
    n_vis: Vec<usize>,
    bufs: GroupBufs,
}

/// One unit of parallel work: queries `q0..q0 + outs.len()`, KV head `h`.
struct Task<'a> {
    q0: usize,
    h: usize,
    /// Per query: its `[group, d_v]` output rows for this KV head.
    outs: Vec<&'a mut [f32]>,
    /// Per query: its `[group]` log-sum-exps.
    lses: Vec<&'a mut [f32]>,
}

/// Splits `out` and `lse` into disjoint per-(query block, KV head) tasks.
fn make_tasks<'a>(
    out: &'a mut [f32],
    lse: &'a mut [f32],
    shape: &AttentionShape,
    block: usize,
) -> Vec<Task<'a>> {
    let (nq, n_kv, g) = (shape.n_queries, shape.n_kv_heads, shape.group());
    let mut cells = Vec::with_capacity(nq * n_kv);
    let (mut out_rest, mut lse_rest) = (out, lse);
    for _ in 0..nq * n_kv {
        let (o, r1) = std::mem::take(&mut out_rest).split_at_mut(g * shape.d_v);
        let (l, r2) = std::mem::take(&mut lse_rest).split_at_mut(g);
        out_rest = r1;
        lse_rest = r2;
        cells.push(Some((o, l)));
    }
    let mut tasks = Vec::with_capacity(nq.div_ceil(block) * n_kv);
    for q0 in (0..nq).step_by(block) {
        let q1 = (q0 + block).min(nq);
        for h in 0..n_kv {
            let (mut outs, mut lses) = (Vec::with_capacity(q1 - q0), Vec::with_capacity(q1 - q0));
            for i in q0..q1 {
                if let Some((o, l)) = cells[i * n_kv + h].take() {
                    outs.push(o);
                    lses.push(l);
                }
            }
            tasks.push(Task { q0, h, outs, lses });
        }
    }
    tasks
}

/// Runs every task on the crate's pool; sums what they return.
fn run_tasks<F>(tasks: &mut [Task<'_>], f: F) -> usize
where
    F: Fn(&mut Scratch, &mut Task<'_>) -> usize + Sync + Send,
{
    if tasks.len() < 2 {
        let mut sc = Scratch::default();
        return tasks.iter_mut().map(|t| f(&mut sc, t)).sum();
    }
    pool::install(|parallel| {
        if parallel {
            use rayon::prelude::*;
            tasks
                .par_iter_mut()
                .map_init(Scratch::default, |sc, t| f(sc, t))
                .sum()
        } else {
            let mut sc = Scratch::default();
            tasks.iter_mut().map(|t| f(&mut sc, t)).sum()
        }
    })
}

/// Attends the rows of one group (at most [`ROW_GROUP`]): row `r` has its
/// query at `q_offs[r]` and sees the first `n_vis[r]` keys of a key list
/// whose keys are packed in `kt` and whose value rows start at `voff`.
/// Leaves unnormalised outputs in `bufs.o` and `(m, l)` in `bufs.ml`.
fn attend_group(
    ctx: &Ctx<'_>,
    kt: &[f32],
    voff: &[usize],
    q_offs: &[usize],
    n_vis: &[usize],
    bufs: &mut GroupBufs,
) {
    let rows = q_offs.len();
    let (d_k, d_v) = (ctx.d_k, ctx.d_v);
    let n_max = n_vis.iter().copied().max().unwrap_or(0);
    let stride = n_max.next_multiple_of(kernel::KEY_TILE);
    debug_assert!(kt.len() >= stride * d_k && voff.len() >= n_max);
    if bufs.s.len() < rows * stride {
        bufs.s.resize(rows * stride, 0.0);
    }
    bufs.o.clear();
    bufs.o.resize(rows * d_v, 0.0);
    bufs.ml.clear();

    // Micro-tiles of up to 4 rows: (first row, rows, most keys, fewest keys).
    let mut tiles = [(0usize, 0usize, 0usize, 0usize); ROW_GROUP / kernel::ROW_TILE];
    let mut n_tiles = 0;
    for r0 in (0..rows).step_by(kernel::ROW_TILE) {
        let nr = kernel::ROW_TILE.min(rows - r0);
        let vis = &n_vis[r0..r0 + nr];
        let most = vis.iter().copied().max().unwrap_or(0);
        let fewest = vis.iter().copied().min().unwrap_or(0);
        tiles[n_tiles] = (r0, nr, most, fewest);
        n_tiles += 1;
    }
    let tiles = &tiles[..n_tiles];

    // Scores, key tile outer so that one packed tile serves every row.
    let s = &mut bufs.s[..rows * stride];
    for kb in 0..stride / kernel::KEY_TILE {
        let j0 = kb * kernel::KEY_TILE;
        let ktile = &kt[j0 * d_k..(j0 + kernel::KEY_TILE) * d_k];
        for &(r0, nr, most, _) in tiles {
            if j0 < most {
                kernel::scores(
                    ctx.level,
                    ctx.q,
                    &q_offs[r0..r0 + nr],
                    ktile,
                    d_k,
                    ctx.scale,
                    &mut s[r0 * stride + j0..],
                    stride,
                );
            }
        }
    }

    // The first chunk of value rows is fetched while the softmax runs.
    kernel::prefetch_rows(ctx.level, ctx.v, &voff[..n_max.min(KEY_CHUNK)], d_v);

    // Softmax per row, in place.
    for (r, &n) in n_vis.iter().enumerate() {
        if n == 0 {
            bufs.ml.push((f32::NEG_INFINITY, 0.0));
            continue;
        }
        let n8 = n.next_multiple_of(8);
        let row = &mut s[r * stride..r * stride + n8];
        row[n..].fill(f32::NEG_INFINITY);
        bufs.ml.push(kernel::softmax(ctx.level, row));
    }

    // Values: key chunk outer; within a micro-tile, the keys every row sees
    // are done together, the rest row by row (the same chain per element).
    let mut j0 = 0;
    while j0 < n_max {
        let j1 = (j0 + KEY_CHUNK).min(n_max);
        let j2 = (j1 + KEY_CHUNK).min(n_max);
        kernel::prefetch_rows(ctx.level, ctx.v, &voff[j1..j2], d_v);
        for &(r0, nr, _, fewest) in tiles {
            let joint = j1.min(fewest);
            if joint > j0 {
                kernel::accumulate(
                    ctx.level,
                    s,
                    stride,
                    r0,
                    nr,
                    ctx.v,
                    voff,
                    j0,
                    joint,
                    &mut bufs.o,
                    d_v,
                );
            }
            for (r, &n) in n_vis.iter().enumerate().skip(r0).take(nr) {
                let (a, b) = (j0.max(fewest), j1.min(n));
                if b > a {
                    kernel::accumulate(
                        ctx.level,
                        s,
                        stride,
                        r,
                        1,
                        ctx.v,
                        voff,
                        a,
                        b,
                        &mut bufs.o,
                        d_v,
                    );
                }
            }
        }
        j0 = j1;
    }
}

/// Writes row `r` of a finished group to `dst` / `lse`; returns 1 if the
/// row saw nothing (zeros, `-inf`), else 0.
fn finish_row(bufs: &GroupBufs, r: usize, d_v: usize, dst: &mut [f32], lse: &mut f32) -> usize {
    let (m, l) = bufs.ml[r];
    if l == 0.0 && m == f32::NEG_INFINITY {
        dst.fill(0.0);
        *lse = f32::NEG_INFINITY;
        return 1;
    }
    for (d, &o) in dst.iter_mut().zip(&bufs.o[r * d_v..(r + 1) * d_v]) {
        *d = o / l;
    }
    *lse = m + l.ln();
    0
}

/// The selected keys of a row, ascending and distinct: its entries `x` with
/// `0 <= x < visible`. Sorts only a row that is not already ascending.
fn selected_keys(row: &[i32], visible: usize, list: &mut Vec<usize>) {
    list.clear();
    let mut ascending = true;
    for &x in row {
        if x >= 0 && (x as usize) < visible {
            if list.last().is_some_and(|&last| last >= x as usize) {
                ascending = false;
            }
            list.push(x as usize);
        }
    }
    if !ascending {
        list.sort_unstable();
        list.dedup();
    }
}

/// Dense causal attention: every query attends to every key it sees,
/// `0..=min(query_pos[i], n_keys - 1)`. Layouts, rounding and refusals are
/// those of [`sparse_attention`] (see the module docs); the result equals
/// [`sparse_attention`] over the full causal selection, bit for bit.
///
/// Returns how many `(query, query head)` rows saw no key (only possible
/// with `n_keys = 0`); those get zeros and `lse = -inf`.
#[allow(clippy::too_many_arguments)]
pub fn dense_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, AttentionError> {
    check_pass(q, k, v, v_stride, shape, query_pos, scale, out, lse)?;
    let (n_q_heads, n_kv, d_k, g) = (shape.n_q_heads, shape.n_kv_heads, shape.d_k, shape.group());
    if shape.n_queries == 0 || n_q_heads == 0 {
        return Ok(0);
    }
    let ctx = Ctx {
        level: simd::level(),
        q,
        v,
        d_k,
        d_v: shape.d_v,
        scale,
    };
    // Each KV head's keys are packed once and shared by every task.
    let n_pack = query_pos
        .iter()
        .map(|&p| shape.visible(p))
        .max()
        .unwrap_or(0);
    let mut kts = Vec::with_capacity(n_kv);
    let mut voffs = Vec::with_capacity(n_kv);
    for h in 0..n_kv {
        let mut kt = Vec::new();
        kernel::pack_keys(ctx.level, &mut kt, k, d_k, n_pack, |j| (j * n_kv + h) * d_k);
        kts.push(kt);
        voffs.push(
            (0..n_pack)
                .map(|j| (j * n_kv + h) * v_stride)
                .collect::<Vec<_>>(),
        );
    }
    let block = ROW_GROUP.div_ceil(g).max(1);
    let mut tasks = make_tasks(out, lse, shape, block);
    let empty = run_tasks(&mut tasks, |sc, t| {
        let rows = t.outs.len() * g;
        let mut empty = 0;
        for start in (0..rows).step_by(ROW_GROUP) {
            let end = (start + ROW_GROUP).min(rows);
            sc.q_offs.clear();
            sc.n_vis.clear();
            for r in start..end {
                let i = t.q0 + r / g;
                sc.q_offs.push((i * n_q_heads + t.h * g + r % g) * d_k);
                sc.n_vis.push(shape.visible(query_pos[i]));
            }
            attend_group(
                &ctx,
                &kts[t.h],
                &voffs[t.h],
                &sc.q_offs,
                &sc.n_vis,
                &mut sc.bufs,
            );
            for r in start..end {
                let (a, gi) = (r / g, r % g);
                let dst = &mut t.outs[a][gi * ctx.d_v..(gi + 1) * ctx.d_v];
                empty += finish_row(&sc.bufs, r - start, ctx.d_v, dst, &mut t.lses[a][gi]);
            }
        }
        empty
    });
    Ok(empty)
}

/// Sparse causal attention over selected positions (see the module docs
/// for layouts, the GQA rule and the numbers).
///
/// `selection` is `[n_queries, n_kv_heads, width]` key indices; a row
/// attends to the set of its entries `x` with
/// `0 <= x <= min(query_pos[i], n_keys - 1)` (negative entries are padding,
/// later ones are masked as future keys, duplicates count once). Writes
/// `out` `[n_queries, n_q_heads, d_v]` and `lse` `[n_queries, n_q_heads]`
/// and returns how many `(query, query head)` rows selected nothing: those
/// get zeros and `lse = -inf`, never NaN.
///
/// Values are read in place through `v_stride` (MLA: `v = k`,
/// `v_stride = d_k`). Costs `O(k · d)` per query head for `k` selected keys
/// (plus `O(width)` to read its row), independent of `n_keys`. Refuses
/// (before writing anything) a buffer whose length does not match its
/// shape, `n_kv_heads = 0`, `n_q_heads` not a multiple of `n_kv_heads`,
/// `v_stride < d_v`, and a non-finite `scale`.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    selection: &[i32],
    width: usize,
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, AttentionError> {
    check_pass(q, k, v, v_stride, shape, query_pos, scale, out, lse)?;
    let (n_q_heads, n_kv, d_k, g) = (shape.n_q_heads, shape.n_kv_heads, shape.d_k, shape.group());
    let ns = checked_size("selection", &[shape.n_queries, n_kv, width])?;
    check_len("selection", selection.len(), ns, || {
        format!(
            "[n_queries={}, n_kv_heads={n_kv}, width={width}]",
            shape.n_queries
        )
    })?;
    if shape.n_queries == 0 || n_q_heads == 0 {
        return Ok(0);
    }
    let ctx = Ctx {
        level: simd::level(),
        q,
        v,
        d_k,
        d_v: shape.d_v,
        scale,
    };
    let mut tasks = make_tasks(out, lse, shape, SPARSE_BLOCK);
    let empty = run_tasks(&mut tasks, |sc, t| {
        let h = t.h;
        let mut empty = 0;
        for a in 0..t.outs.len() {
            let i = t.q0 + a;
            let row = &selection[(i * n_kv + h) * width..(i * n_kv + h + 1) * width];
            selected_keys(row, shape.visible(query_pos[i]), &mut sc.list);
            let n = sc.list.len();
            if n == 0 {
                t.outs[a].fill(0.0);
                t.lses[a].fill(f32::NEG_INFINITY);
                empty += g;
                continue;
            }
            let list = &sc.list;
            kernel::pack_keys(ctx.level, &mut sc.kt, k, d_k, n, |j| {
                (list[j] * n_kv + h) * d_k
            });
            sc.voff.clear();
            sc.voff
                .extend(list.iter().map(|&j| (j * n_kv + h) * v_stride));
            for start in (0..g).step_by(ROW_GROUP) {
                let end = (start + ROW_GROUP).min(g);
                sc.q_offs.clear();
                sc.n_vis.clear();
                for gi in start..end {
                    sc.q_offs.push((i * n_q_heads + h * g + gi) * d_k);
                    sc.n_vis.push(n);
                }
                attend_group(&ctx, &sc.kt, &sc.voff, &sc.q_offs, &sc.n_vis, &mut sc.bufs);
                for gi in start..end {
                    let dst = &mut t.outs[a][gi * ctx.d_v..(gi + 1) * ctx.d_v];
                    empty += finish_row(&sc.bufs, gi - start, ctx.d_v, dst, &mut t.lses[a][gi]);
                }
            }
        }
        empty
    });
    Ok(empty)
}

/// MLA sparse attention: `n_heads` query heads share one latent KV head
/// `kv` `[n_keys, d_k]` whose first `d_v` columns are the values, read in
/// place (`v = kv`, `v_stride = d_k`; no copy). `q` is
/// `[query_pos.len(), n_heads, d_k]`; the rest is [`sparse_attention`] with
/// `n_kv_heads = 1` (`selection` is `[n_queries, width]`). This is the
/// masked pass over the positions a block selection covers that the block
/// spec refers to. Refuses `d_k = 0`, `d_v > d_k` and a `kv` that is not a
/// whole number of `d_k`-wide rows.
#[allow(clippy::too_many_arguments)]
pub fn causal_mla_attention_sparse(
    q: &[f32],
    kv: &[f32],
    n_heads: usize,
    d_k: usize,
    d_v: usize,
    query_pos: &[usize],
    selection: &[i32],
    width: usize,
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, AttentionError> {
    if d_k == 0 {
        return Err(AttentionError::Invalid {
            argument: "d_k",
            message: "d_k is 0: the latent KV rows have no width".into(),
        });
    }
    if d_v > d_k {
        return Err(AttentionError::Invalid {
            argument: "d_v",
            message: format!("d_v={d_v} is wider than the latent rows (d_k={d_k})"),
        });
    }
    if kv.len() % d_k != 0 {
        return Err(AttentionError::Length {
            argument: "kv",
            expected: kv.len() / d_k * d_k,
            actual: kv.len(),
            shape: format!("a whole number of rows of d_k={d_k}"),
        });
    }
    let shape = AttentionShape::mla(query_pos.len(), n_heads, d_k, d_v, kv.len() / d_k);
    sparse_attention(
        q, kv, kv, d_k, &shape, query_pos, selection, width, scale, out, lse,
    )
}

/// The pass's kernels. Each exists twice -- AVX2+FMA and portable -- and
/// both run the same per-element chains of IEEE operations, so they agree
/// bit for bit (see the module docs).
mod kernel {
    use crate::simd::Level;

    /// Keys per score micro-tile: two 8-lane blocks.
    pub(super) const KEY_TILE: usize = 16;
    /// Rows per micro-tile.
    pub(super) const ROW_TILE: usize = 4;

    /// Packs keys `0..n` of a key list as `K^T` in blocks of 8: key `j`,
    /// dimension `c` at `dst[(j / 8) · 8d + c · 8 + j % 8]`, key `j`'s row
    /// starting at `k[offset(j)]`. `dst` gets at least
    /// `round_up(n, 16) · d` entries; the padding keys' contents are
    /// unspecified (their scores are masked).
    pub(super) fn pack_keys(
        level: Level,
        dst: &mut Vec<f32>,
        k: &[f32],
        d: usize,
        n: usize,
        offset: impl Fn(usize) -> usize,
    ) {
        let len = n.next_multiple_of(KEY_TILE) * d;
        if dst.len() < len {
            dst.resize(len, 0.0);
        }
        if d == 0 {
            return;
        }
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 {
            // Whole blocks of 8 keys: 8×8 register transposes, the next
            // block's rows prefetched (a packing is a copy: any method gives
            // the same bits).
            let rows_of = |b: usize| {
                let mut rows = [0usize; 8];
                for (t, r) in rows.iter_mut().enumerate() {
                    *r = offset(b * 8 + t);
                    assert!(*r + d <= k.len());
                }
                rows
            };
            let blocks = n / 8;
            let mut next = (blocks > 0).then(|| rows_of(0));
            for b in 0..blocks {
                let rows = next.unwrap_or_else(|| rows_of(b));
                next = (b + 1 < blocks).then(|| rows_of(b + 1));
                // SAFETY: AVX2+FMA detected; every row `r + d <= k.len()`
                // (asserted), and the block is `8 d` floats.
                unsafe {
                    avx2::pack_block(
                        k,
                        &rows,
                        next.as_ref(),
                        d,
                        &mut dst[b * 8 * d..(b + 1) * 8 * d],
                    )
                };
            }
            done = blocks * 8;
        }
        let _ = level;
        for j in done..n {
            let src = &k[offset(j)..offset(j) + d];
            let block = &mut dst[(j / 8) * 8 * d..(j / 8 + 1) * 8 * d];
            for (slot, &x) in block[j % 8..].iter_mut().step_by(8).zip(src) {
                *slot = x;
            }
        }
    }

    /// Asks for the value rows `voff` (each `d_v` floats) to be brought into
    /// cache ahead of use: a sparse row's values are scattered, and issuing
    /// every line up front overlaps their misses. No effect on results.
    pub(super) fn prefetch_rows(level: Level, v: &[f32], voff: &[usize], d_v: usize) {
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            for &o in voff {
                for c in (0..d_v).step_by(16) {
                    let p = v.as_ptr().wrapping_add(o + c) as *const i8;
                    // SAFETY: a prefetch never faults and does not
                    // dereference its pointer.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
                }
            }
        }
        let _ = (level, v, voff, d_v);
    }

    // Cephes' expf: exp(x) = 2^n · exp(r), n = round(x·log2 e),
    // r = x - n·ln 2 (ln 2 split in two for an exact first step).
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// Below this, exp underflows past the smallest normal float: 0.
    const EXP_LO: f32 = -87.336_55;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    #[allow(clippy::excessive_precision)]
    const P: [f32; 6] = [
        1.987_569_150_0e-4,
        1.398_199_950_7e-3,
        8.333_451_907_3e-3,
        4.166_579_589_4e-2,
        1.666_666_545_9e-1,
        5.000_000_120_1e-1,
    ];
    /// `1.5 · 2^23`: adding and subtracting it rounds `|t| < 2^22` to the
    /// nearest integer, ties to even, with two plain IEEE additions.
    const ROUND: f32 = 12_582_912.0;

    /// `exp(x)` for `x <= 0` (NaN stays NaN), the scalar twin of
    /// `exp_avx2`, operation for operation.
    #[inline(always)]
    pub(super) fn exp_scalar(x: f32) -> f32 {
        // `_mm256_max_ps(LO, x)`: x when it is NaN.
        let xc = if EXP_LO > x { EXP_LO } else { x };
        let n = (xc * LOG2E + ROUND) - ROUND;
        let r = n.mul_add(-LN2_HI, xc);
        let r = n.mul_add(-LN2_LO, r);
        let mut y = P[0];
        for &p in &P[1..] {
            y = y.mul_add(r, p);
        }
        let y = y.mul_add(r * r, r) + 1.0;
        let e = y * f32::from_bits(((n as i32 + 127) << 23) as u32);
        if x < EXP_LO {
            0.0
        } else {
            e
        }
    }

    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
    #[inline(always)]
    fn reduce8(l: [f32; 8]) -> f32 {
        ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
    }

    /// Scores of `q_offs.len()` rows against one packed key tile, times
    /// `scale`, into `out[r · stride + t]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scores(
        level: Level,
        q: &[f32],
        q_offs: &[usize],
        ktile: &[f32],
        d: usize,
        scale: f32,
        out: &mut [f32],
        stride: usize,
    ) {
        let rows = q_offs.len();
        assert!(
            (1..=ROW_TILE).contains(&rows)
                && ktile.len() >= KEY_TILE * d
                && out.len() >= (rows - 1) * stride + KEY_TILE
                && q_offs.iter().all(|&o| o + d <= q.len())
        );
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 {
            // SAFETY: `Level::Avx2` comes from run-time detection of AVX2
            // and FMA; the bounds the kernel relies on are asserted above.
            unsafe {
                match rows {
                    1 => avx2::scores::<1>(q, q_offs, ktile, d, scale, out, stride),
                    2 => avx2::scores::<2>(q, q_offs, ktile, d, scale, out, stride),
                    3 => avx2::scores::<3>(q, q_offs, ktile, d, scale, out, stride),
                    _ => avx2::scores::<4>(q, q_offs, ktile, d, scale, out, stride),
                }
            }
            return;
        }
        let _ = level;
        for (r, &qo) in q_offs.iter().enumerate() {
            let qr = &q[qo..qo + d];
            for t in 0..KEY_TILE {
                let kb = &ktile[(t / 8) * 8 * d..];
                let mut acc = 0.0f32;
                for (c, &x) in qr.iter().enumerate() {
                    acc = x.mul_add(kb[c * 8 + t % 8], acc);
                }
                out[r * stride + t] = acc * scale;
            }
        }
    }

    /// Softmax numerator in place over `s` (a multiple of 8 long, entries
    /// past the row's keys already `-inf`); returns `(m, l)`.
    pub(super) fn softmax(level: Level, s: &mut [f32]) -> (f32, f32) {
        assert!(s.len() % 8 == 0);
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 {
            // SAFETY: AVX2 and FMA were detected at run time.
            return unsafe { avx2::softmax(s) };
        }
        let _ = level;
        let mut m = f32::NEG_INFINITY;
        for &x in s.iter() {
            if x > m {
                m = x;
            }
        }
        // -0.0 and +0.0 are one maximum.
        let m = m + 0.0;
        let mut lanes = [0.0f32; 8];
        for chunk in s.chunks_exact_mut(8) {
            for (lane, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
                *x = exp_scalar(*x - m);
                *lane += *x;
            }
        }
        (m, reduce8(lanes))
    }

    /// `o[r][c] = fma(p[r][j], v[voff[j] + c], o[r][c])` for `j` in `j0..j1`
    /// ascending, rows `r0..r0 + rows` (`p` rows `stride` apart, `o` rows
    /// `d_v` apart).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn accumulate(
        level: Level,
        p: &[f32],
        stride: usize,
        r0: usize,
        rows: usize,
        v: &[f32],
        voff: &[usize],
        j0: usize,
        j1: usize,
        o: &mut [f32],
        d_v: usize,
    ) {
        assert!(
            (1..=ROW_TILE).contains(&rows)
                && j0 <= j1
                && j1 <= voff.len()
                && (r0 + rows - 1) * stride + j1 <= p.len()
                && (r0 + rows) * d_v <= o.len()
        );
        // Value rows were bounds-checked when `voff` was built (`check_pass`
        // and the key lists); checked again here in debug builds.
        debug_assert!(voff[j0..j1].iter().all(|&x| x + d_v <= v.len()));
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 {
            // SAFETY: AVX2 and FMA were detected at run time; row and key
            // bounds asserted above, value rows in bounds by construction.
            unsafe {
                match rows {
                    1 => avx2::accumulate::<1>(p, stride, r0, v, voff, j0, j1, o, d_v),
                    2 => avx2::accumulate::<2>(p, stride, r0, v, voff, j0, j1, o, d_v),
                    3 => avx2::accumulate::<3>(p, stride, r0, v, voff, j0, j1, o, d_v),
                    _ => avx2::accumulate::<4>(p, stride, r0, v, voff, j0, j1, o, d_v),
                }
            }
            return;
        }
        let _ = level;
        for r in r0..r0 + rows {
            let orow = &mut o[r * d_v..(r + 1) * d_v];
            let prow = &p[r * stride..];
            for j in j0..j1 {
                let pj = prow[j];
                let vrow = &v[voff[j]..voff[j] + d_v];
                for (oc, &vc) in orow.iter_mut().zip(vrow) {
                    *oc = pj.mul_add(vc, *oc);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    // Accumulator arrays are indexed by row on purpose: they must stay in
    // registers, which iterator adaptors over them can defeat.
    #[allow(clippy::needless_range_loop)]
    mod avx2 {
        use super::{EXP_LO, KEY_TILE, LN2_HI, LN2_LO, LOG2E, P, ROUND};
        use std::arch::x86_64::*;

        /// # Safety
        /// AVX2+FMA; `q_offs.len() == R`, `q_offs[r] + d <= q.len()`,
        /// `ktile.len() >= 16 d`, `out.len() >= (R - 1) · stride + 16`.
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn scores<const R: usize>(
            q: &[f32],
            q_offs: &[usize],
            ktile: &[f32],
            d: usize,
            scale: f32,
            out: &mut [f32],
            stride: usize,
        ) {
            let mut qp = [q.as_ptr(); R];
            for (p, &o) in qp.iter_mut().zip(q_offs) {
                // SAFETY: `o + d <= q.len()`.
                *p = unsafe { q.as_ptr().add(o) };
            }
            let k0 = ktile.as_ptr();
            let mut a0 = [_mm256_setzero_ps(); R];
            let mut a1 = [_mm256_setzero_ps(); R];
            for c in 0..d {
                // SAFETY: `c < d`, tile of `16 d` floats, rows of `d` floats.
                unsafe {
                    let b0 = _mm256_loadu_ps(k0.add(c * 8));
                    let b1 = _mm256_loadu_ps(k0.add(8 * d + c * 8));
                    for r in 0..R {
                        let x = _mm256_set1_ps(*qp[r].add(c));
                        a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                        a1[r] = _mm256_fmadd_ps(x, b1, a1[r]);
                    }
                }
            }
            let vs = _mm256_set1_ps(scale);
            for r in 0..R {
                // SAFETY: `(R - 1) · stride + 16 <= out.len()`.
                unsafe {
                    let o = out.as_mut_ptr().add(r * stride);
                    _mm256_storeu_ps(o, _mm256_mul_ps(a0[r], vs));
                    _mm256_storeu_ps(o.add(KEY_TILE / 2), _mm256_mul_ps(a1[r], vs));
                }
            }
        }

        /// Packs 8 keys (rows at `k[rows[t]..rows[t] + d]`) into `dst`
        /// (`8 d` floats, dimension `c` of key `t` at `c · 8 + t`), eight
        /// dimensions at a time through an 8×8 transpose; prefetches the
        /// rows in `next`.
        ///
        /// # Safety
        /// AVX2+FMA; `rows[t] + d <= k.len()`; `dst.len() == 8 d`.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn pack_block(
            k: &[f32],
            rows: &[usize; 8],
            next: Option<&[usize; 8]>,
            d: usize,
            dst: &mut [f32],
        ) {
            if let Some(next) = next {
                for &o in next {
                    for c in (0..d).step_by(16) {
                        // A prefetch never faults; the pointer is not dereferenced.
                        _mm_prefetch::<_MM_HINT_T0>(k.as_ptr().wrapping_add(o + c) as *const i8);
                    }
                }
            }
            let kp = k.as_ptr();
            let dp = dst.as_mut_ptr();
            let mut c = 0;
            while c + 8 <= d {
                // SAFETY: `c + 8 <= d`, rows in bounds, `dst` is `8 d`.
                unsafe {
                    let r = |t: usize| _mm256_loadu_ps(kp.add(rows[t] + c));
                    let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
                    let (r4, r5, r6, r7) = (r(4), r(5), r(6), r(7));
                    let t0 = _mm256_unpacklo_ps(r0, r1);
                    let t1 = _mm256_unpackhi_ps(r0, r1);
                    let t2 = _mm256_unpacklo_ps(r2, r3);
                    let t3 = _mm256_unpackhi_ps(r2, r3);
                    let t4 = _mm256_unpacklo_ps(r4, r5);
                    let t5 = _mm256_unpackhi_ps(r4, r5);
                    let t6 = _mm256_unpacklo_ps(r6, r7);
                    let t7 = _mm256_unpackhi_ps(r6, r7);
                    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                    let o = dp.add(c * 8);
                    _mm256_storeu_ps(o, _mm256_permute2f128_ps::<0x20>(u0, u4));
                    _mm256_storeu_ps(o.add(8), _mm256_permute2f128_ps::<0x20>(u1, u5));
                    _mm256_storeu_ps(o.add(16), _mm256_permute2f128_ps::<0x20>(u2, u6));
                    _mm256_storeu_ps(o.add(24), _mm256_permute2f128_ps::<0x20>(u3, u7));
                    _mm256_storeu_ps(o.add(32), _mm256_permute2f128_ps::<0x31>(u0, u4));
                    _mm256_storeu_ps(o.add(40), _mm256_permute2f128_ps::<0x31>(u1, u5));
                    _mm256_storeu_ps(o.add(48), _mm256_permute2f128_ps::<0x31>(u2, u6));
                    _mm256_storeu_ps(o.add(56), _mm256_permute2f128_ps::<0x31>(u3, u7));
                }
                c += 8;
            }
            for cc in c..d {
                for (t, &o) in rows.iter().enumerate() {
                    dst[cc * 8 + t] = k[o + cc];
                }
            }
        }

        /// The vector twin of `exp_scalar`.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        pub(super) fn exp(x: __m256) -> __m256 {
            let lo = _mm256_set1_ps(EXP_LO);
            let xc = _mm256_max_ps(lo, x);
            let round = _mm256_set1_ps(ROUND);
            let n = _mm256_sub_ps(
                _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), round),
                round,
            );
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
            let mut y = _mm256_set1_ps(P[0]);
            for &p in &P[1..] {
                y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(p));
            }
            let y = _mm256_add_ps(
                _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r),
                _mm256_set1_ps(1.0),
            );
            let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            let e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
            _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), e)
        }

        /// # Safety
        /// AVX2+FMA; `s.len()` a multiple of 8.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn softmax(s: &mut [f32]) -> (f32, f32) {
            let mut vm = _mm256_set1_ps(f32::NEG_INFINITY);
            for c in s.chunks_exact(8) {
                // SAFETY: 8 in-bounds floats.
                let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
                // `x > m ? x : m`, as the scalar loop.
                vm = _mm256_max_ps(x, vm);
            }
            let mut lanes = [0.0f32; 8];
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vm) };
            let mut m = f32::NEG_INFINITY;
            for x in lanes {
                if x > m {
                    m = x;
                }
            }
            let m = m + 0.0;
            let vmv = _mm256_set1_ps(m);
            let mut acc = _mm256_setzero_ps();
            for c in s.chunks_exact_mut(8) {
                // SAFETY: 8 in-bounds floats.
                unsafe {
                    let p = exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmv));
                    _mm256_storeu_ps(c.as_mut_ptr(), p);
                    acc = _mm256_add_ps(acc, p);
                }
            }
            // ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
            let a = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let b = _mm_add_ps(a, _mm_movehl_ps(a, a));
            let l = _mm_add_ss(b, _mm_movehdup_ps(b));
            (m, _mm_cvtss_f32(l))
        }

        /// # Safety
        /// AVX2+FMA; `(r0 + R - 1) · stride + j1 <= p.len()`,
        /// `(r0 + R) · d_v <= o.len()`, `j1 <= voff.len()`, and
        /// `voff[j] + d_v <= v.len()` for `j` in `j0..j1`.
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn accumulate<const R: usize>(
            p: &[f32],
            stride: usize,
            r0: usize,
            v: &[f32],
            voff: &[usize],
            j0: usize,
            j1: usize,
            o: &mut [f32],
            d_v: usize,
        ) {
            let pp = p.as_ptr();
            let vp = v.as_ptr();
            let op = o.as_mut_ptr();
            let mut c = 0;
            // SAFETY (all blocks below): the bounds of the function's
            // contract; `c + 16 <= d_v` / `c + 8 <= d_v` / `c < d_v` in each
            // loop.
            while c + 16 <= d_v {
                let mut a0 = [_mm256_setzero_ps(); R];
                let mut a1 = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    unsafe {
                        a0[r] = _mm256_loadu_ps(op.add((r0 + r) * d_v + c));
                        a1[r] = _mm256_loadu_ps(op.add((r0 + r) * d_v + c + 8));
                    }
                }
                for j in j0..j1 {
                    unsafe {
                        let vr = vp.add(*voff.get_unchecked(j) + c);
                        let b0 = _mm256_loadu_ps(vr);
                        let b1 = _mm256_loadu_ps(vr.add(8));
                        for r in 0..R {
                            let x = _mm256_set1_ps(*pp.add((r0 + r) * stride + j));
                            a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                            a1[r] = _mm256_fmadd_ps(x, b1, a1[r]);
                        }
                    }
                }
                for r in 0..R {
                    unsafe {
                        _mm256_storeu_ps(op.add((r0 + r) * d_v + c), a0[r]);
                        _mm256_storeu_ps(op.add((r0 + r) * d_v + c + 8), a1[r]);
                    }
                }
                c += 16;
            }
            if c + 8 <= d_v {
                let mut a0 = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    unsafe { a0[r] = _mm256_loadu_ps(op.add((r0 + r) * d_v + c)) };
                }
                for j in j0..j1 {
                    unsafe {
                        let b0 = _mm256_loadu_ps(vp.add(*voff.get_unchecked(j) + c));
                        for r in 0..R {
                            let x = _mm256_set1_ps(*pp.add((r0 + r) * stride + j));
                            a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                        }
                    }
                }
                for r in 0..R {
                    unsafe { _mm256_storeu_ps(op.add((r0 + r) * d_v + c), a0[r]) };
                }
                c += 8;
            }
            for cc in c..d_v {
                for r in 0..R {
                    unsafe {
                        let mut a = *op.add((r0 + r) * d_v + cc);
                        for j in j0..j1 {
                            let x = *pp.add((r0 + r) * stride + j);
                            a = x.mul_add(*vp.add(*voff.get_unchecked(j) + cc), a);
                        }
                        *op.add((r0 + r) * d_v + cc) = a;
                    }
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The exp kernel is within 2 ulp-ish of libm on `[-87, 0]`, exactly
        /// 1 at 0, 0 below the underflow limit, NaN on NaN -- and the AVX2
        /// twin agrees bit for bit.
        #[test]
        fn exp_is_accurate_and_the_same_on_every_level() {
            let mut xs: Vec<f32> = (0..200_000)
                .map(|i| -(i as f32) * 87.3 / 200_000.0)
                .collect();
            xs.extend([
                0.0,
                -0.0,
                -1e-30,
                -87.33,
                -87.34,
                -88.0,
                -1e30,
                f32::NEG_INFINITY,
            ]);
            let ln2 = std::f32::consts::LN_2;
            xs.extend([-ln2, -ln2 / 2.0, -1.5 * ln2]);
            while xs.len() % 8 != 0 {
                xs.push(-0.5);
            }
            for &x in &xs {
                let e = exp_scalar(x) as f64;
                let want = (x as f64).exp();
                if x >= EXP_LO {
                    assert!(((e - want) / want).abs() < 3e-7, "x={x}: {e} vs {want}");
                } else {
                    assert_eq!(e, 0.0, "x={x}");
                }
            }
            assert_eq!(exp_scalar(0.0), 1.0);
            assert!(exp_scalar(f32::NAN).is_nan());
            #[cfg(target_arch = "x86_64")]
            if crate::simd::level() == Level::Avx2 {
                use std::arch::x86_64::*;
                xs.extend([f32::NAN; 8]);
                for c in xs.chunks_exact(8) {
                    let mut got = [0.0f32; 8];
                    // SAFETY: AVX2+FMA detected; 8-float buffers.
                    unsafe {
                        let x = _mm256_loadu_ps(c.as_ptr());
                        _mm256_storeu_ps(got.as_mut_ptr(), avx2::exp(x));
                    }
                    for (g, &x) in got.iter().zip(c) {
                        let want = exp_scalar(x);
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "x={x}: avx2 {g} vs scalar {want}"
                        );
                    }
                }
            }
        }

        /// Scores, softmax and value accumulation: every level, bit for bit,
        /// on ragged shapes.
        #[test]
        fn every_kernel_is_bit_identical_on_every_level() {
            if crate::simd::level() != Level::Avx2 {
                return;
            }
            let mut state = 0x2545_F491_4F6C_DD1Du64;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            };
            for &(d, d_v, rows) in &[(1, 1, 1), (7, 5, 2), (32, 32, 3), (64, 24, 4), (65, 17, 4)] {
                let q: Vec<f32> = (0..rows * d + 3).map(|_| next()).collect();
                let k: Vec<f32> = (0..KEY_TILE * d).map(|_| next()).collect();
                let q_offs: Vec<usize> = (0..rows).map(|r| r * d + 1).collect();
                let stride = 24;
                let mut a = vec![0.0f32; rows * stride];
                let mut b = a.clone();
                scores(Level::Avx2, &q, &q_offs, &k, d, 0.3, &mut a, stride);
                scores(Level::Scalar, &q, &q_offs, &k, d, 0.3, &mut b, stride);
                assert_eq!(a, b, "scores d={d}");
                let mut sa: Vec<f32> = (0..24).map(|_| next() * 20.0).collect();
                sa[21..].fill(f32::NEG_INFINITY);
                let mut sb = sa.clone();
                let ma = softmax(Level::Avx2, &mut sa);
                let mb = softmax(Level::Scalar, &mut sb);
                assert_eq!(
                    (ma.0.to_bits(), ma.1.to_bits()),
                    (mb.0.to_bits(), mb.1.to_bits())
                );
                assert_eq!(sa, sb);
                let n = 37;
                let v: Vec<f32> = (0..n * 40).map(|_| next()).collect();
                let voff: Vec<usize> = (0..n).map(|j| ((j * 7) % n) * 40 + 2).collect();
                let p: Vec<f32> = (0..rows * n).map(|_| next().abs()).collect();
                let mut oa: Vec<f32> = (0..rows * d_v).map(|_| next()).collect();
                let mut ob = oa.clone();
                accumulate(Level::Avx2, &p, n, 0, rows, &v, &voff, 3, n, &mut oa, d_v);
                accumulate(Level::Scalar, &p, n, 0, rows, &v, &voff, 3, n, &mut ob, d_v);
                assert_eq!(oa, ob, "accumulate d_v={d_v}");
                // Packing: a copy either way.
                let keys: Vec<f32> = (0..50 * d).map(|_| next()).collect();
                let order: Vec<usize> = (0..29).map(|j| (j * 17) % 50).collect();
                let (mut pa, mut pb) = (Vec::new(), Vec::new());
                pack_keys(Level::Avx2, &mut pa, &keys, d, 29, |j| order[j] * d);
                pack_keys(Level::Scalar, &mut pb, &keys, d, 29, |j| order[j] * d);
                assert_eq!(pa[..29 / 8 * 8 * d], pb[..29 / 8 * 8 * d], "pack d={d}");
                for j in 0..29 {
                    for c in 0..d {
                        assert_eq!(pa[(j / 8) * 8 * d + c * 8 + j % 8], keys[order[j] * d + c]);
                    }
                }
            }
        }
    }
}
