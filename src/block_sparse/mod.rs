//! MiniMax-M3's block-sparse attention selection: which 128-token KV
//! blocks a query may look at.
//!
//! Ported from the selection rule in `spec/block_sparse.rs.txt` (itself a
//! port of FreeToken's `models/minimax_m3/args.py`). This is the *decision*
//! half -- which blocks are visible. The attention itself is then an
//! ordinary masked pass over the positions those blocks cover
//! ([`positions_of_blocks`] turns a selection into them).
//!
//! # The rules, and what would break each one
//!
//! - **A block's score is the MAX over its causally visible positions**,
//!   not the mean and not the sum. A block earns its place on its single
//!   best match: one strongly-related token in a block of 128 is exactly
//!   the case sparse attention exists to catch, and a mean would average it
//!   away against 127 unrelated neighbours. Block `b` covers positions
//!   `b·bs .. min((b+1)·bs, n_positions, query_pos + 1)`: a position after
//!   the query is never scored, so a future token cannot pull its block in.
//!
//! - **No softmax scale.** The raw dot product is used directly, because
//!   only the ORDER of the scores is consumed. Dividing by `sqrt(d)` would
//!   scale every score by the same positive constant and change nothing.
//!   (What *would* change something is comparing a scaled score against an
//!   absolute threshold -- nothing here does.)
//!
//! - **Selection is per KV head, with no cross-head reduction.** One index
//!   head scores for one KV head, and that KV head's whole GQA group reads
//!   the blocks it picked. Summing or maxing the scores across heads first
//!   would give every group the same block set, which is the opposite of
//!   what per-head selection is for.
//!
//! - **The first `init_blocks` and the newest `local_blocks` are
//!   force-included before any scoring.** This is what guarantees the
//!   selection is never empty: a query early in a sequence, or one whose
//!   scores are all equally poor, would otherwise select zero blocks, and
//!   attention over zero positions is a softmax over an empty set -- a NaN
//!   that propagates through the whole forward pass and surfaces as garbage
//!   output, not as an error.
//!
//! - **The budget includes the forced blocks**: a query selects
//!   `max(top_blocks, #forced)` blocks (or every block, when it has fewer).
//!   Adding the forced blocks on top of `top_blocks` would silently widen
//!   every query's working set beyond what the KV pool was sized for; a
//!   budget smaller than the forced set widens to hold exactly them, since
//!   dropping one could reintroduce the empty selection. So every selection
//!   fits in [`BlockSparseConfig::width`] slots.
//!
//! - **Ties go to the LOWER block id**, deterministically. A selection that
//!   varied from run to run would make a cached prefix disagree with the
//!   run that produced it. Scores are ranked by the total order
//!   "score descending, then block id ascending", and the top few are found
//!   by a partial selection (`select_nth_unstable_by` with that total
//!   order), which is exact: with a *total* order the chosen set does not
//!   depend on the algorithm.
//!
//! - **A query beyond the keys is clipped to what exists**: it sees
//!   `ceil(min(query_pos + 1, n_positions) / block_size)` blocks, never one
//!   the pager did not allocate. With no keys at all there is nothing to
//!   select and the selection is empty (the only empty selection there is).
//!
//! # Numbers: NaN, signed zeros, rounding
//!
//! - **A NaN dot product counts as absent**, as in the spec's `f32::max`
//!   fold. A block whose every visible score is NaN scores `-inf`: it never
//!   displaces a block with a finite score, but like any `-inf` block it can
//!   still fill a slot nothing better wants (lowest id first). NaN itself
//!   never ranks above anything. (A kernel that let a NaN win a `max` would
//!   make one poisoned key steal a slot.)
//! - **`-0.0` and `+0.0` are one score.** Ranking uses `f32::total_cmp`,
//!   which orders `-0.0` below `+0.0`, and whether a sum of products comes
//!   out as `-0.0` depends on summation order; so every block maximum is
//!   canonicalised by adding `+0.0` before ranking, and a zero tie still
//!   goes to the lower block.
//! - **Summation order is fixed, and the same on every SIMD level and any
//!   thread count.** A dot product over `d` dimensions is accumulated in 8
//!   lanes: lane `j` accumulates dimensions `j, j+8, j+16, …` in increasing
//!   order with a fused multiply-add (`acc = fma(q, k, acc)`, a dimension
//!   past `d` counting as `fma(0, 0, acc)`), and the lanes are then summed
//!   as `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`. The AVX2 kernel does this
//!   with one `__m256` accumulator per dot product (the AVX-512 step two
//!   per register; the bfloat16 pair step two steps of a lane per
//!   instruction, where its inputs allow: `kernels/pairs.rs`); the portable
//!   kernel emulates it lane by lane with `f32::mul_add`, so all give
//!   bit-identical block maxima (unit tests check this). Block maxima are
//!   reduced with an order-independent `max` (NaN-ignoring, signed zeros
//!   canonicalised), and every block is scored by exactly one task, so the
//!   thread count changes nothing.
//! - **The selection is exact; the scores are float32.** The spec ranks its
//!   float32 sums; kvselect ranks the real block scores (of the decoded
//!   operands): the float32 maxima screen, and the free blocks their
//!   rounding can have misplaced at the threshold are re-scored in float64
//!   (every product exact) and decided there, ties to the lower block id
//!   (`exact.rs`). So a row is what `kvselect check` accepts at `rtol = 0`,
//!   and differs from the float32 maxima's own choice only where rounding
//!   decided a near tie (a float32 overflow included: two `+inf` maxima are
//!   ordered by their finite real values). [`block_scores_into`] reports the
//!   float32 maxima.
//!
//! # The block size is an ABI, not a tuning knob
//!
//! [`MINIMAX_BLOCK_SIZE`] is 128 and also pins the KV page size: the
//! selection hands back block indices, and a pager whose page is a
//! different size cannot honour them without splitting or merging pages,
//! which is exactly the bookkeeping block-sparse attention exists to avoid.
//!
//! # Speed, and the memory it does not use
//!
//! Scoring is fused with the max-pool: no `[queries × positions]` score
//! matrix is ever built. Every (query, KV head) pair is a "row"; rows are
//! copied into zero-padded tiles of 4, keys are read in place, and a
//! register-tiled micro-kernel computes 4 rows × 3 keys of dot products at
//! a time (12 AVX2 accumulators), reducing each straight into a running
//! per-row block maximum. All heads of a query are scored while a key row
//! is in cache, so a decode step reads every key once, with software
//! prefetch ahead of the kernel (and, from a paged cache, a page or more
//! ahead into L2: the hardware prefetcher cannot follow a block table's
//! jumps). Work is split across the crate's pool (never rayon's global
//! one) by ranges of whole blocks, so each block is owned by one task and
//! no merge is needed; inside a task, keys are walked
//! in L2-sized chunks against every row tile, and key ranges that no row of
//! a tile can see are skipped (a causal prefill chunk does no work above
//! its diagonal). The only scratch is one `f32` per (row, block) --
//! `1/block_size` of the score matrix -- processed in row groups of at most
//! 4 MiB when many rows are asked for at once, plus the padded copy of the
//! queries.
//!
//! Selection then takes each row's block maxima, canonicalises them, and
//! finds the top few with a partial selection rather than a full sort.
//!
//! # Layout
//!
//! This file: the rule, the config and the accepted index types (the
//! refusals are the crate's [`ArgumentError`]). `api.rs` (the entry points), `validate.rs` (the checks),
//! `select.rs` (the rule applied to one row's block maxima), `engine.rs`
//! (fused scoring + max-pool across the pool, then selection), `kernels/`
//! (the segment interface and dispatch in `mod.rs`, `portable.rs`,
//! `avx2.rs`, `avx512.rs`, the bfloat16 pair step `pairs.rs`, and the
//! tests of one against the other), `check.rs` (the rule
//! applied to an engine's row, and its reasons; public as
//! `kvselect::check::check_block_row`) and `tests_check.rs`. A packed
//! batch's `cu_seqlens` and `seq_ids` are checked where the indexer's are
//! (`src/packed.rs`).

use std::fmt;

use crate::error::ArgumentError;

mod api;
pub(crate) mod check;
mod engine;
mod exact;
mod kernels;
mod select;
#[cfg(test)]
mod tests_check;
mod validate;

/// Runs block selection's kernel family at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    kernels::probe(isa);
    exact::probe(isa);
}

pub use api::{
    block_scores_into, block_sparse_select, positions_of_blocks, positions_of_blocks_batch_into,
    positions_of_blocks_i32, select_batch_encoded_into, select_batch_into, select_into,
    select_packed_encoded_into, select_packed_into, select_paged_into, PagedBlocks,
};

/// The order of a batched selection's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OutLayout {
    /// `[n_queries, n_kv_heads, width]`, kvselect's own.
    #[default]
    QueryMajor,
    /// `[n_kv_heads, n_queries, width]`, the serving engines' (vLLM's
    /// `minimax_m3_index_topk` returns `[H, total_q, topk]`).
    HeadMajor,
}

/// What a paged selection's entries name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BlockIds {
    /// The sequence's logical block ids (what vLLM's kernel returns).
    #[default]
    Logical,
    /// The cache pages those blocks live in (what a sparse attention
    /// kernel reads), through the block table.
    Physical,
}

/// MiniMax-M3's KV block, in tokens. Also the KV page size -- see the
/// module docs.
pub const MINIMAX_BLOCK_SIZE: usize = 128;

/// How many blocks a query may see, and which are free.
///
/// The fields are public (as in the spec), so a config that can select
/// nothing can still be written down literally; every selection function
/// refuses one with [`ArgumentError::InvalidConfig`], and
/// [`BlockSparseConfig::new`] refuses to build one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockSparseConfig {
    /// Tokens per block. [`MINIMAX_BLOCK_SIZE`] for a real checkpoint;
    /// configurable only so the rules can be tested at a readable size.
    pub block_size: usize,
    /// Total blocks visible per query, force-included ones counted.
    pub top_blocks: usize,
    /// Blocks at the start of the sequence that are always visible.
    pub init_blocks: usize,
    /// Blocks nearest the query that are always visible.
    pub local_blocks: usize,
}

impl Default for BlockSparseConfig {
    /// The spec's defaults: block 128, top 32, init 1, local 2. (The
    /// released MiniMax-M3 checkpoint uses top 16, init 0, local 1.)
    fn default() -> Self {
        BlockSparseConfig {
            block_size: MINIMAX_BLOCK_SIZE,
            top_blocks: 32,
            init_blocks: 1,
            local_blocks: 2,
        }
    }
}

impl BlockSparseConfig {
    /// A config, refused if it can select nothing: `block_size == 0`, or
    /// `top_blocks == 0` with no forced blocks (`init_blocks ==
    /// local_blocks == 0`). An empty selection is a NaN downstream.
    pub fn new(
        block_size: usize,
        top_blocks: usize,
        init_blocks: usize,
        local_blocks: usize,
    ) -> Result<Self, ArgumentError> {
        let cfg = BlockSparseConfig {
            block_size,
            top_blocks,
            init_blocks,
            local_blocks,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Refuses a config that can select nothing (see [`Self::new`]).
    pub fn validate(&self) -> Result<(), ArgumentError> {
        if self.block_size == 0 {
            return Err(ArgumentError::InvalidConfig {
                field: "block_size",
                message: "block_size is 0: a block must hold at least one position".into(),
            });
        }
        if self.top_blocks == 0 && self.init_blocks == 0 && self.local_blocks == 0 {
            return Err(ArgumentError::InvalidConfig {
                field: "top_blocks",
                message: "top_blocks is 0 and no block is forced (init_blocks = 0, \
                          local_blocks = 0), so nothing could ever be selected"
                    .into(),
            });
        }
        Ok(())
    }

    /// Blocks covering positions `0..=query_pos`, the last one possibly
    /// partial. (0 for `block_size == 0`; saturates instead of overflowing.)
    pub fn causal_blocks(&self, query_pos: usize) -> usize {
        if self.block_size == 0 {
            return 0;
        }
        (query_pos / self.block_size).saturating_add(1)
    }

    /// The fixed width of an output row: `max(top_blocks, init_blocks +
    /// local_blocks)`, the most blocks any selection can hold (saturating).
    pub fn width(&self) -> usize {
        self.top_blocks
            .max(self.init_blocks.saturating_add(self.local_blocks))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for usize {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// An integer type accepted for positions, sequence ids and sequence
/// boundaries: `usize`, `u32`, `u64`, `i32`, `i64` (NumPy's and torch's
/// int64 and int32 arrays are read without conversion). A negative value,
/// or one that does not fit `usize`, is refused with
/// [`ArgumentError::OutOfRange`].
pub trait IndexLike: Copy + Send + Sync + fmt::Display + sealed::Sealed {
    /// The value as a `usize`, or `None` if it is negative or too large.
    fn to_usize(self) -> Option<usize>;
}

impl IndexLike for usize {
    fn to_usize(self) -> Option<usize> {
        Some(self)
    }
}
impl IndexLike for u32 {
    fn to_usize(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}
impl IndexLike for u64 {
    fn to_usize(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}
impl IndexLike for i32 {
    fn to_usize(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}
impl IndexLike for i64 {
    fn to_usize(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}
