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
//! leaves it bit-identical. [`sparse_attention_counting`] with
//! [`Repeats::Each`] reads a row as a list instead, a repeated entry counted
//! each time it appears: what the engines' sparse MLA kernels compute
//! (FlashMLA's, vLLM's, SGLang's; issue 40), so the pass can stand in for
//! them as a reference; the output is then a function of the multiset. A row whose set is empty gets zeros and
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
//! The AVX2+FMA kernels run these chains eight keys or columns at a time,
//! the AVX-512 ones sixteen (the scores and the value accumulation; their
//! softmax takes sixteen exponentials at a time and adds them to the
//! 8-lane sum in the AVX2 kernel's order); the portable kernels run the
//! same chains one at a time with `f32::mul_add`. So the levels are
//! bit-identical (the kernel tests compare each level against the portable
//! one, and a test checks the best level against `KVSELECT_SIMD=scalar` in
//! a child process), and since a row's result
//! does not depend on which rows share its tile or its thread, the thread
//! count changes nothing, and a sparse pass over the full causal selection
//! equals [`dense_attention`] bit for bit. What would break it: an online
//! (flash) softmax with a tile size that differs between the two passes, a
//! horizontal-sum dot product on one level only, or libm's `expf`.
//! Non-finite inputs give non-finite outputs (a NaN score makes its row NaN),
//! as in any attention. Bit-identical means every number's bits; a NaN is
//! a NaN on every level, but its sign and payload are not pinned (where
//! NaNs of both signs meet, which one an operation returns depends on the
//! operand order the compiler picks for each level's FMAs).
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
//! packs each KV head's keys once (in blocks of 8 keys, 16 with AVX-512),
//! then computes tiles of 4 rows × 16 keys with 8 AVX2 accumulators (4 rows
//! × 32 keys with 8 AVX-512 ones), 16 rows sharing each key tile while it
//! is in L1, skipping key tiles above every row's causal limit; values are
//! accumulated 4 rows × 16 columns per key (32 with AVX-512). Only the
//! sparse pass prefetches value rows: the dense pass's are in cache. Work is split across the
//! crate's pool (never rayon's global one) by (query block, KV head),
//! writing disjoint output rows, so a single query's KV heads still run in
//! parallel; one query with one KV head runs on one thread.
//!
//! # Layout
//!
//! `shape.rs` (the sizes of a call and the checks run before anything is
//! written), `selectors.rs` (the baselines and the oracle), `pass.rs` (the
//! dense and sparse passes: tasks, row groups, key lists), `kernels/` (the
//! bounds checks and dispatch in `mod.rs`, `portable.rs`, `avx2.rs`,
//! `avx512.rs`).

pub(crate) mod kernels;
mod pass;
mod selectors;
mod shape;

/// Runs the attention pass's kernel families at `isa` (the reach test's
/// probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    kernels::probe(isa)
}

pub use pass::{
    causal_mla_attention_sparse, dense_attention, sparse_attention, sparse_attention_counting,
    Repeats,
};
pub use selectors::{oracle_topk_row, OracleTopK, Selector};
pub use shape::{softmax_scale, AttentionShape};
