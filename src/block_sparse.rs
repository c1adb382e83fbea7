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
//!   with one `__m256` accumulator per dot product; the portable kernel
//!   emulates it lane by lane with `f32::mul_add`, so both give
//!   bit-identical block maxima (a unit test checks this). Block maxima are
//!   reduced with an order-independent `max` (NaN-ignoring, signed zeros
//!   canonicalised), and every block is scored by exactly one task, so the
//!   thread count changes nothing. The one thing that can differ from the
//!   spec's plain sequential `sum()` is rounding: the selection equals the
//!   exact-arithmetic selection whenever block scores differ by more than
//!   rounding, and exact ties (integer-valued data, repeated keys) go to the
//!   lower block id.
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
//! prefetch ahead of the kernel. Work is split across the crate's pool
//! (never rayon's global one) by ranges of whole blocks, so each block is
//! owned by one task and no merge is needed; inside a task, keys are walked
//! in L2-sized chunks against every row tile, and key ranges that no row of
//! a tile can see are skipped (a causal prefill chunk does no work above
//! its diagonal). The only scratch is one `f32` per (row, block) --
//! `1/block_size` of the score matrix -- processed in row groups of at most
//! 4 MiB when many rows are asked for at once, plus the padded copy of the
//! queries.
//!
//! Selection then takes each row's block maxima, canonicalises them, and
//! finds the top few with a partial selection rather than a full sort.

use std::fmt;

use crate::pool;
use crate::simd::{self, Level};

/// MiniMax-M3's KV block, in tokens. Also the KV page size -- see the
/// module docs.
pub const MINIMAX_BLOCK_SIZE: usize = 128;

/// How many blocks a query may see, and which are free.
///
/// The fields are public (as in the spec), so a config that can select
/// nothing can still be written down literally; every selection function
/// refuses one with [`SelectionError::InvalidConfig`], and
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
    ) -> Result<Self, SelectionError> {
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
    pub fn validate(&self) -> Result<(), SelectionError> {
        if self.block_size == 0 {
            return Err(SelectionError::InvalidConfig {
                field: "block_size",
                message: "block_size is 0: a block must hold at least one position".into(),
            });
        }
        if self.top_blocks == 0 && self.init_blocks == 0 && self.local_blocks == 0 {
            return Err(SelectionError::InvalidConfig {
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

/// A refused call. Every message names the argument it is about; nothing is
/// written to an output buffer before every check has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectionError {
    /// The config can select nothing (`block_size == 0`, or `top_blocks ==
    /// 0` with no forced blocks).
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// The full message.
        message: String,
    },
    /// An input's length does not match the shape the other arguments give
    /// it, or a dimension is unusable.
    ShapeMismatch {
        /// The offending argument.
        argument: &'static str,
        /// The full message, with the expected and actual sizes.
        message: String,
    },
    /// A position, sequence id or sequence boundary is out of range.
    OutOfRange {
        /// The offending argument.
        argument: &'static str,
        /// The entry's index within the argument.
        index: usize,
        /// The full message.
        message: String,
    },
    /// The output buffer has the wrong number of slots.
    OutputSize {
        /// The offending argument (`out`).
        argument: &'static str,
        /// Slots the call needs.
        expected: usize,
        /// Slots the buffer has.
        actual: usize,
        /// How `expected` was computed.
        shape: String,
    },
    /// The result would be too large to allocate.
    OutputTooLarge {
        /// What was being built.
        argument: &'static str,
        /// Entries it would hold.
        len: usize,
    },
}

impl SelectionError {
    /// The argument (or config field) the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            SelectionError::InvalidConfig { field, .. } => field,
            SelectionError::ShapeMismatch { argument, .. }
            | SelectionError::OutOfRange { argument, .. }
            | SelectionError::OutputSize { argument, .. }
            | SelectionError::OutputTooLarge { argument, .. } => argument,
        }
    }
}

impl fmt::Display for SelectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SelectionError::InvalidConfig { message, .. } => {
                write!(f, "invalid BlockSparseConfig: {message}")
            }
            SelectionError::ShapeMismatch { message, .. }
            | SelectionError::OutOfRange { message, .. } => f.write_str(message),
            SelectionError::OutputSize {
                argument,
                expected,
                actual,
                shape,
            } => write!(
                f,
                "{argument} has {actual} slots, expected {expected} ({shape})"
            ),
            SelectionError::OutputTooLarge { argument, len } => write!(
                f,
                "{argument} would hold {len} entries, more than can be allocated"
            ),
        }
    }
}

impl std::error::Error for SelectionError {}

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
/// [`SelectionError::OutOfRange`].
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

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

/// The blocks each KV head may read for one query position, ascending.
///
/// `index_q` is one index head per KV head, row-major `[n_kv_heads, d]`;
/// `index_k` is one index key per position, row-major `[n_positions, d]`,
/// shared across heads. Returns one selection per KV head, in the same
/// order. Never returns an empty selection when there is at least one key
/// -- see the module docs on why that matters.
///
/// ```
/// use kvselect::block_sparse::{block_sparse_select, BlockSparseConfig};
///
/// // Blocks of 4 positions, 3 blocks per query: the first and the newest
/// // are forced, one is chosen by score.
/// let cfg = BlockSparseConfig::new(4, 3, 1, 1).unwrap();
/// let d = 2;
/// let mut index_k = vec![0.0f32; 16 * d]; // 16 positions, 4 blocks
/// index_k[9 * d] = 1.0; // position 9 (block 2) matches head 0
/// index_k[5 * d + 1] = 1.0; // position 5 (block 1) matches head 1
/// let index_q = [1.0, 0.0, /* head 1: */ 0.0, 1.0];
/// let sel = block_sparse_select(&index_q, 2, &index_k, d, 15, &cfg).unwrap();
/// assert_eq!(sel, vec![vec![0, 2, 3], vec![0, 1, 3]]);
/// ```
pub fn block_sparse_select(
    index_q: &[f32],
    n_kv_heads: usize,
    index_k: &[f32],
    d: usize,
    query_pos: usize,
    cfg: &BlockSparseConfig,
) -> Result<Vec<Vec<usize>>, SelectionError> {
    cfg.validate()?;
    let n_positions = key_rows(index_k, d)?;
    check_q_len(index_q, 1, n_kv_heads, d)?;
    let vis = [visible_end(query_pos, n_positions)];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n_kv_heads];
    run_engine(
        simd::level(),
        index_q,
        n_kv_heads,
        &vis,
        index_k,
        d,
        cfg,
        &mut out,
        1,
        &|sel: &[usize], row: &mut [Vec<usize>]| {
            if let Some(slot) = row.first_mut() {
                slot.clear();
                slot.extend_from_slice(sel);
            }
        },
        SCRATCH_FLOATS,
    );
    Ok(out)
}

/// One query's selection as fixed-width rows: `out` is `[n_kv_heads,
/// cfg.width()]` int32, each row the ascending block ids then `-1` padding.
/// The layout the Python bindings hand back.
pub fn select_into(
    index_q: &[f32],
    n_kv_heads: usize,
    index_k: &[f32],
    d: usize,
    query_pos: usize,
    cfg: &BlockSparseConfig,
    out: &mut [i32],
) -> Result<(), SelectionError> {
    select_batch_into(index_q, 1, n_kv_heads, index_k, d, &[query_pos], cfg, out)
}

/// A chunk of queries over one sequence's keys (a prefill chunk, or any
/// batch of positions): `index_q` is `[n_queries, n_kv_heads, d]`,
/// `query_pos` one position per query, `out` is `[n_queries, n_kv_heads,
/// cfg.width()]` int32 (ascending block ids, then `-1`). Row for row equal
/// to calling [`select_into`] once per query.
#[allow(clippy::too_many_arguments)]
pub fn select_batch_into<P: IndexLike>(
    index_q: &[f32],
    n_queries: usize,
    n_kv_heads: usize,
    index_k: &[f32],
    d: usize,
    query_pos: &[P],
    cfg: &BlockSparseConfig,
    out: &mut [i32],
) -> Result<(), SelectionError> {
    cfg.validate()?;
    let n_positions = key_rows(index_k, d)?;
    check_q_len(index_q, n_queries, n_kv_heads, d)?;
    check_block_ids_fit_i32(n_positions, cfg)?;
    check_per_query_len("query_pos", query_pos.len(), n_queries)?;
    let width = cfg.width();
    check_out(out, n_queries, n_kv_heads, width)?;
    let mut vis = Vec::with_capacity(n_queries);
    for (i, &p) in query_pos.iter().enumerate() {
        let p = p.to_usize().ok_or_else(|| bad_position(i, p))?;
        vis.push(visible_end(p, n_positions));
    }
    run_engine(
        simd::level(),
        index_q,
        n_kv_heads,
        &vis,
        index_k,
        d,
        cfg,
        out,
        width,
        &write_i32_row,
        SCRATCH_FLOATS,
    );
    Ok(())
}

/// A packed batch of several sequences, serving-engine style: the keys of
/// all sequences are concatenated in `index_k` (`[n_positions, d]`), and
/// sequence `s` owns rows `cu_seqlens[s] .. cu_seqlens[s + 1]`
/// (`cu_seqlens` has `n_seqs + 1` non-decreasing entries, starting at 0 and
/// ending at `n_positions`). Query `i` (`index_q` is `[n_queries,
/// n_kv_heads, d]`) belongs to sequence `seq_ids[i]` and sits at position
/// `query_pos[i]` *within that sequence*; it sees only its own sequence's
/// keys (clipped to what exists, as ever), and its block ids count from the
/// start of its sequence. `out` is `[n_queries, n_kv_heads, cfg.width()]`.
/// Row for row equal to calling [`select_into`] on each sequence's keys.
#[allow(clippy::too_many_arguments)]
pub fn select_packed_into<C: IndexLike, I: IndexLike>(
    index_q: &[f32],
    n_queries: usize,
    n_kv_heads: usize,
    index_k: &[f32],
    d: usize,
    cu_seqlens: &[C],
    seq_ids: &[I],
    query_pos: &[I],
    cfg: &BlockSparseConfig,
    out: &mut [i32],
) -> Result<(), SelectionError> {
    cfg.validate()?;
    let n_positions = key_rows(index_k, d)?;
    check_q_len(index_q, n_queries, n_kv_heads, d)?;
    check_block_ids_fit_i32(n_positions, cfg)?;
    let bounds = check_cu_seqlens(cu_seqlens, n_positions)?;
    let n_seqs = bounds.len().saturating_sub(1);
    check_per_query_len("seq_ids", seq_ids.len(), n_queries)?;
    check_per_query_len("query_pos", query_pos.len(), n_queries)?;
    let width = cfg.width();
    check_out(out, n_queries, n_kv_heads, width)?;
    let mut seqs = Vec::with_capacity(n_queries);
    let mut pos = Vec::with_capacity(n_queries);
    for (i, (&s, &p)) in seq_ids.iter().zip(query_pos).enumerate() {
        let s = s
            .to_usize()
            .filter(|&s| s < n_seqs)
            .ok_or_else(|| SelectionError::OutOfRange {
                argument: "seq_ids",
                index: i,
                message: format!(
                    "seq_ids[{i}] = {s} is out of range: cu_seqlens describes {n_seqs} \
                     sequence(s), so a sequence id must be in 0..{n_seqs}"
                ),
            })?;
        let p = p.to_usize().ok_or_else(|| bad_position(i, p))?;
        seqs.push(s);
        pos.push(p);
    }

    // One engine call per run of consecutive queries in the same sequence
    // (a serving batch is normally one run per sequence).
    // Both fit: index_q and out were checked to hold n_queries such rows
    // (and with no queries, these are never used).
    let row_q = n_kv_heads.saturating_mul(d);
    let row_out = n_kv_heads.saturating_mul(width);
    let mut start = 0;
    while start < n_queries {
        let s = seqs[start];
        let mut end = start + 1;
        while end < n_queries && seqs[end] == s {
            end += 1;
        }
        let (k0, k1) = (bounds[s], bounds[s + 1]);
        let vis: Vec<usize> = pos[start..end]
            .iter()
            .map(|&p| visible_end(p, k1 - k0))
            .collect();
        run_engine(
            simd::level(),
            &index_q[start * row_q..end * row_q],
            n_kv_heads,
            &vis,
            &index_k[k0 * d..k1 * d],
            d,
            cfg,
            &mut out[start * row_out..end * row_out],
            width,
            &write_i32_row,
            SCRATCH_FLOATS,
        );
        start = end;
    }
    Ok(())
}

/// The positions a block selection covers, ascending, deduplicated and
/// causally clipped: block `b` contributes `b·bs .. min((b+1)·bs,
/// n_positions, query_pos + 1)`, so a block past the keys or after the
/// query contributes nothing. Never overflows, however large a block id.
pub fn positions_of_blocks(
    blocks: &[usize],
    query_pos: usize,
    n_positions: usize,
    cfg: &BlockSparseConfig,
) -> Vec<usize> {
    let limit = visible_end(query_pos, n_positions);
    let ranges = block_ranges(blocks.iter().copied(), limit, cfg.block_size);
    let mut out = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
    for r in ranges {
        out.extend(r);
    }
    out
}

/// [`positions_of_blocks`] for the bindings' int32 rows: negative entries
/// are padding and skipped. Refuses (rather than wraps) a covered position
/// that does not fit an `i32`, and a result too large to allocate.
pub fn positions_of_blocks_i32(
    blocks: &[i32],
    query_pos: usize,
    n_positions: usize,
    cfg: &BlockSparseConfig,
) -> Result<Vec<i32>, SelectionError> {
    cfg.validate()?;
    let limit = visible_end(query_pos, n_positions);
    let ranges = block_ranges(
        blocks.iter().filter_map(|&b| usize::try_from(b).ok()),
        limit,
        cfg.block_size,
    );
    if let Some(last) = ranges.last() {
        if last.end - 1 > i32::MAX as usize {
            let block = last.start / cfg.block_size;
            let index = blocks
                .iter()
                .position(|&b| usize::try_from(b).ok() == Some(block))
                .unwrap_or(0);
            return Err(SelectionError::OutOfRange {
                argument: "blocks",
                index,
                message: format!(
                    "blocks[{index}] = {block} covers position {}, which does not fit an int32",
                    last.end - 1
                ),
            });
        }
    }
    let len: usize = ranges.iter().map(|r| r.len()).sum();
    let mut out: Vec<i32> = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| SelectionError::OutputTooLarge {
            argument: "positions",
            len,
        })?;
    for r in ranges {
        // Every position is <= i32::MAX (checked above), so `as` is exact.
        out.extend(r.map(|p| p as i32));
    }
    Ok(out)
}

/// The position ranges covered by `blocks` under `limit` (exclusive),
/// sorted and disjoint. Blocks are deduplicated first, so the work is
/// bounded by the number of distinct visible blocks.
fn block_ranges(
    blocks: impl Iterator<Item = usize>,
    limit: usize,
    bs: usize,
) -> Vec<std::ops::Range<usize>> {
    if bs == 0 || limit == 0 {
        return Vec::new();
    }
    let n_blocks = limit.div_ceil(bs);
    let mut ids: Vec<usize> = blocks.filter(|&b| b < n_blocks).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .map(|b| {
            // b < ceil(limit / bs), so b·bs < limit: no overflow.
            let start = b * bs;
            start..start.saturating_add(bs).min(limit)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// Exclusive end of the keys a query at `query_pos` sees.
fn visible_end(query_pos: usize, n_positions: usize) -> usize {
    query_pos.saturating_add(1).min(n_positions)
}

fn key_rows(index_k: &[f32], d: usize) -> Result<usize, SelectionError> {
    if d == 0 {
        return Err(SelectionError::ShapeMismatch {
            argument: "d",
            message: "d is 0: index vectors need at least one dimension".into(),
        });
    }
    if index_k.len() % d != 0 {
        return Err(SelectionError::ShapeMismatch {
            argument: "index_k",
            message: format!(
                "index_k has {} values, which is not a whole number of rows of d={d}",
                index_k.len()
            ),
        });
    }
    Ok(index_k.len() / d)
}

fn check_q_len(
    index_q: &[f32],
    n_queries: usize,
    n_kv_heads: usize,
    d: usize,
) -> Result<(), SelectionError> {
    let expected = n_queries
        .checked_mul(n_kv_heads)
        .and_then(|r| r.checked_mul(d));
    if expected != Some(index_q.len()) {
        let want = match expected {
            Some(e) => e.to_string(),
            None => "more than usize::MAX".into(),
        };
        let message = if n_queries == 1 {
            format!(
                "index_q has {} values, expected {want} = n_kv_heads ({n_kv_heads}) × d ({d})",
                index_q.len()
            )
        } else {
            format!(
                "index_q has {} values, expected {want} = n_queries ({n_queries}) × \
                 n_kv_heads ({n_kv_heads}) × d ({d})",
                index_q.len()
            )
        };
        return Err(SelectionError::ShapeMismatch {
            argument: "index_q",
            message,
        });
    }
    Ok(())
}

fn check_per_query_len(
    argument: &'static str,
    len: usize,
    n_queries: usize,
) -> Result<(), SelectionError> {
    if len != n_queries {
        return Err(SelectionError::ShapeMismatch {
            argument,
            message: format!(
                "{argument} has {len} entries, expected one per query (n_queries = {n_queries})"
            ),
        });
    }
    Ok(())
}

fn check_out(
    out: &[i32],
    n_queries: usize,
    n_kv_heads: usize,
    width: usize,
) -> Result<(), SelectionError> {
    let expected = n_queries
        .checked_mul(n_kv_heads)
        .and_then(|r| r.checked_mul(width));
    if expected != Some(out.len()) {
        return Err(SelectionError::OutputSize {
            argument: "out",
            expected: expected.unwrap_or(usize::MAX),
            actual: out.len(),
            shape: format!(
                "n_queries ({n_queries}) × n_kv_heads ({n_kv_heads}) × width ({width}), \
                 width = max(top_blocks, init_blocks + local_blocks)"
            ),
        });
    }
    Ok(())
}

/// Block ids are written as int32: refuse keys with more blocks than that.
fn check_block_ids_fit_i32(
    n_positions: usize,
    cfg: &BlockSparseConfig,
) -> Result<(), SelectionError> {
    let n_blocks = n_positions.div_ceil(cfg.block_size.max(1));
    if n_blocks > i32::MAX as usize {
        return Err(SelectionError::ShapeMismatch {
            argument: "index_k",
            message: format!(
                "index_k has {n_positions} positions, {n_blocks} blocks of {}: block ids \
                 past {} do not fit the int32 output",
                cfg.block_size,
                i32::MAX
            ),
        });
    }
    Ok(())
}

fn bad_position<P: IndexLike>(i: usize, p: P) -> SelectionError {
    SelectionError::OutOfRange {
        argument: "query_pos",
        index: i,
        message: format!("query_pos[{i}] = {p} is out of range: a position must be >= 0"),
    }
}

fn check_cu_seqlens<C: IndexLike>(
    cu_seqlens: &[C],
    n_positions: usize,
) -> Result<Vec<usize>, SelectionError> {
    let Some(first) = cu_seqlens.first() else {
        return Err(SelectionError::ShapeMismatch {
            argument: "cu_seqlens",
            message: "cu_seqlens is empty: it needs n_seqs + 1 entries, starting at 0".into(),
        });
    };
    if first.to_usize() != Some(0) {
        return Err(SelectionError::OutOfRange {
            argument: "cu_seqlens",
            index: 0,
            message: format!("cu_seqlens[0] = {first}, but the first sequence starts at 0"),
        });
    }
    let mut bounds = Vec::with_capacity(cu_seqlens.len());
    let mut prev = 0usize;
    for (i, &c) in cu_seqlens.iter().enumerate() {
        let v = c
            .to_usize()
            .filter(|&v| v >= prev && v <= n_positions)
            .ok_or_else(|| SelectionError::OutOfRange {
                argument: "cu_seqlens",
                index: i,
                message: format!(
                    "cu_seqlens[{i}] = {c} is out of range: entries must be non-decreasing \
                     (the previous is {prev}) and at most n_positions = {n_positions}"
                ),
            })?;
        bounds.push(v);
        prev = v;
    }
    if prev != n_positions {
        return Err(SelectionError::ShapeMismatch {
            argument: "cu_seqlens",
            message: format!(
                "cu_seqlens ends at {prev}, but index_k has {n_positions} positions: the last \
                 entry must be the total key count"
            ),
        });
    }
    Ok(bounds)
}

fn write_i32_row(sel: &[usize], row: &mut [i32]) {
    let mut it = sel.iter();
    for slot in row.iter_mut() {
        // Ids were checked to fit i32 (`check_block_ids_fit_i32`).
        *slot = it.next().map_or(-1, |&b| b as i32);
    }
}

// ---------------------------------------------------------------------------
// Selection from block maxima
// ---------------------------------------------------------------------------

/// The spec's selection for one row with `n_blocks` visible blocks, given
/// each block's max score. Writes the ascending selection into `sel`.
fn select_blocks(
    n_blocks: usize,
    score: impl Fn(usize) -> f32,
    cfg: &BlockSparseConfig,
    cand: &mut Vec<(f32, usize)>,
    sel: &mut Vec<usize>,
) {
    sel.clear();
    if n_blocks == 0 {
        return;
    }
    let init_end = cfg.init_blocks.min(n_blocks);
    let local_start = (n_blocks - cfg.local_blocks.min(n_blocks)).max(init_end);
    let forced = init_end + (n_blocks - local_start);
    let budget = cfg.top_blocks.max(forced);
    let free = local_start - init_end;
    let want = (budget - forced).min(free);

    sel.extend(0..init_end);
    if want == free {
        sel.extend(init_end..local_start);
    } else if want > 0 {
        cand.clear();
        // `+ 0.0` canonicalises -0.0 to +0.0 (and leaves everything else,
        // -inf included, as it is); block maxima are never NaN.
        cand.extend((init_end..local_start).map(|b| (score(b) + 0.0, b)));
        let order = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        cand.select_nth_unstable_by(want - 1, order);
        let start = sel.len();
        sel.extend(cand.iter().take(want).map(|&(_, b)| b));
        sel[start..].sort_unstable();
    }
    sel.extend(local_start..n_blocks);
}

// ---------------------------------------------------------------------------
// The engine: fused scoring + max-pool, then selection
// ---------------------------------------------------------------------------

/// Rows (query heads) are padded to tiles of this many.
const MR: usize = 4;
/// Cap on the per-(row, block) scratch of one row group, in f32s (4 MiB).
const SCRATCH_FLOATS: usize = 1 << 20;
/// Target work per parallel task, in multiply-adds (rows × keys × d).
const TASK_WORK: usize = 1 << 22;
/// Bytes of keys walked against every row tile at a time (L2-resident,
/// while the 4-row query tile stays in L1).
const KEY_CHUNK_BYTES: usize = 64 * 1024;
/// With this few row tiles, keys are streamed from memory once (decode):
/// the kernel prefetches ahead of itself.
const STREAMING_TILES: usize = 2;
/// How many keys ahead the streaming kernel prefetches.
const PREFETCH_KEYS: usize = 12;

/// Query heads padded into 4-row tiles, `dp = d` rounded up to 8, zeros in
/// the padding (so a padded dimension contributes `fma(0, 0, acc)`).
struct PaddedRows {
    q: Vec<f32>,
    /// Exclusive end of the keys each (padded) row sees.
    vis: Vec<usize>,
    rows_pad: usize,
    dp: usize,
}

impl PaddedRows {
    fn new(q: &[f32], rows: usize, d: usize, row_vis: impl Fn(usize) -> usize) -> Self {
        let dp = d.div_ceil(8) * 8;
        let rows_pad = rows.div_ceil(MR) * MR;
        let mut qp = vec![0.0f32; rows_pad * dp];
        for (dst, src) in qp.chunks_exact_mut(dp).zip(q.chunks_exact(d)) {
            dst[..d].copy_from_slice(src);
        }
        // Padding rows copy the last real row's visibility, so a tile's
        // masked region is set by its real rows only; their scores are
        // never read.
        let vis = (0..rows_pad)
            .map(|r| row_vis(r.min(rows.saturating_sub(1))))
            .collect();
        PaddedRows {
            q: qp,
            vis,
            rows_pad,
            dp,
        }
    }
}

/// Scores `index_q` (`vis.len()` queries × `heads` rows of `d`) against
/// `keys` and writes each row's selection with `write` into `out` rows of
/// `out_width`. Inputs are already validated.
#[allow(clippy::too_many_arguments)]
fn run_engine<T: Send>(
    level: Level,
    index_q: &[f32],
    heads: usize,
    vis: &[usize],
    keys: &[f32],
    d: usize,
    cfg: &BlockSparseConfig,
    out: &mut [T],
    out_width: usize,
    write: &(dyn Fn(&[usize], &mut [T]) + Sync),
    scratch_floats: usize,
) {
    let rows = vis.len() * heads;
    if rows == 0 || out_width == 0 {
        return;
    }
    let bs = cfg.block_size;
    let n_keys = keys.len() / d;
    let row_vis = |r: usize| vis[r / heads];
    let max_blocks = vis.iter().map(|v| v.div_ceil(bs)).max().unwrap_or(0);
    // Rows per group (a multiple of the tile height), so the scratch stays
    // within `scratch_floats` -- or one tile, when a single tile exceeds it.
    let group = (scratch_floats / max_blocks.max(1) / MR).max(1) * MR;
    let mut g0 = 0;
    while g0 < rows {
        let g1 = g0.saturating_add(group).min(rows);
        let padded = PaddedRows::new(&index_q[g0 * d..g1 * d], g1 - g0, d, |r| row_vis(g0 + r));
        let n_blocks = (g0..g1).map(|r| row_vis(r).div_ceil(bs)).max().unwrap_or(0);
        let rp = padded.rows_pad;
        // Block-major: scratch[b * rows_pad + r] is row r's max over block b.
        let mut scratch = vec![f32::NEG_INFINITY; n_blocks * rp];
        let keys_per_task = (TASK_WORK / (rp * padded.dp)).max(1);
        let blocks_per_task = keys_per_task.div_ceil(bs).max(1);
        let key_chunk = (KEY_CHUNK_BYTES / (4 * d)).max(MR);
        pool::for_each_row_mut(&mut scratch, rp * blocks_per_task, 1, |task, maxima| {
            score_blocks(
                level,
                &padded,
                keys,
                d,
                n_keys,
                bs,
                task * blocks_per_task,
                maxima,
                key_chunk,
            );
        });

        let scratch = &scratch;
        let sel_rows = &mut out[g0 * out_width..g1 * out_width];
        pool::for_each_row_mut(sel_rows, out_width, 64, |r, row| {
            let nb = row_vis(g0 + r).div_ceil(bs);
            let mut cand = Vec::new();
            let mut sel = Vec::with_capacity(cfg.width().min(nb));
            select_blocks(nb, |b| scratch[b * rp + r], cfg, &mut cand, &mut sel);
            write(&sel, row);
        });
        g0 = g1;
    }
}

/// Fills `maxima` (block-major, `[n_blk][rows_pad]`, initialised to -inf)
/// with every padded row's max score over blocks `b0 .. b0 + n_blk`.
#[allow(clippy::too_many_arguments)]
fn score_blocks(
    level: Level,
    rows: &PaddedRows,
    keys: &[f32],
    d: usize,
    n_keys: usize,
    bs: usize,
    b0: usize,
    maxima: &mut [f32],
    key_chunk: usize,
) {
    let rp = rows.rows_pad;
    let n_blk = maxima.len() / rp;
    // Few row tiles: each key is used a few times and then never again, so
    // memory latency is what to hide (and with one tile, chunking buys
    // nothing).
    let tiles = rp / MR;
    let streaming = tiles <= STREAMING_TILES;
    let key_chunk = if tiles == 1 { usize::MAX } else { key_chunk };
    let k_start = b0.saturating_mul(bs).min(n_keys);
    let k_end = b0.saturating_add(n_blk).saturating_mul(bs).min(n_keys);
    let mut c0 = k_start;
    while c0 < k_end {
        let c1 = c0.saturating_add(key_chunk).min(k_end);
        for (t, tile_vis) in rows.vis.chunks_exact(MR).enumerate() {
            let lo = tile_vis.iter().copied().min().unwrap_or(0);
            let hi = tile_vis.iter().copied().max().unwrap_or(0);
            let end = c1.min(hi);
            if end <= c0 {
                continue; // no row of this tile sees any key of the chunk
            }
            let seg = Segment {
                q: &rows.q[t * MR * rows.dp..(t + 1) * MR * rows.dp],
                dp: rows.dp,
                keys,
                d,
                start: c0,
                end,
                mask_from: lo.max(c0),
                vis: [tile_vis[0], tile_vis[1], tile_vis[2], tile_vis[3]],
                bs,
                b0,
                prefetch: streaming,
            };
            let out = TileOut {
                maxima: &mut *maxima,
                stride: rp,
                col: t * MR,
            };
            run_segment(level, &seg, out);
        }
        c0 = c1;
    }
}

/// One row tile against keys `start..end`, all within one task's blocks.
struct Segment<'a> {
    /// 4 padded rows, `dp` apart.
    q: &'a [f32],
    dp: usize,
    keys: &'a [f32],
    d: usize,
    start: usize,
    end: usize,
    /// Keys at or past this index are checked against each row's `vis`.
    mask_from: usize,
    vis: [usize; MR],
    bs: usize,
    /// First block of the task (`maxima` row 0).
    b0: usize,
    /// Prefetch keys ahead (they come from memory, used once).
    prefetch: bool,
}

/// Where a tile's block maxima go: `maxima[(b - b0) * stride + col + i]`.
struct TileOut<'a> {
    maxima: &'a mut [f32],
    stride: usize,
    col: usize,
}

impl TileOut<'_> {
    /// Merges a running max into the stored one (NaN-free, order-free).
    #[inline]
    fn flush(&mut self, block_rel: usize, m: [f32; MR]) {
        let at = block_rel * self.stride + self.col;
        if let Some(dst) = self.maxima.get_mut(at..at + MR) {
            for (o, v) in dst.iter_mut().zip(m) {
                if v > *o {
                    *o = v;
                }
            }
        }
    }
}

fn run_segment(level: Level, seg: &Segment<'_>, out: TileOut<'_>) {
    #[cfg(target_arch = "x86_64")]
    {
        if level == Level::Avx2
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            unsafe { avx2::segment(seg, out) };
            return;
        }
    }
    let _ = level;
    portable::segment(seg, out);
}

/// The pieces of a segment's keys, in increasing order: each lies in one
/// block and is either wholly unmasked (`< mask_from`) or wholly masked.
struct Pieces {
    p: usize,
    end: usize,
    mask_from: usize,
    bs: usize,
}

/// One piece: keys `from..to` of block `block`.
struct Piece {
    block: usize,
    from: usize,
    to: usize,
    masked: bool,
}

impl Pieces {
    fn new(seg: &Segment<'_>) -> Self {
        Pieces {
            p: seg.start,
            end: seg.end,
            mask_from: seg.mask_from,
            bs: seg.bs,
        }
    }
}

impl Iterator for Pieces {
    type Item = Piece;

    #[inline]
    fn next(&mut self) -> Option<Piece> {
        if self.p >= self.end || self.bs == 0 {
            return None;
        }
        let block = self.p / self.bs;
        let block_end = (block + 1).saturating_mul(self.bs).min(self.end);
        let (to, masked) = if self.p < self.mask_from {
            (self.mask_from.min(block_end), false)
        } else {
            (block_end, true)
        };
        let from = self.p;
        self.p = to;
        Some(Piece {
            block,
            from,
            to,
            masked,
        })
    }
}

mod portable {
    //! The portable kernel: the AVX2 kernel's exact arithmetic, lane by lane.
    use super::{Pieces, Segment, TileOut, MR};

    /// One dot product in the canonical order (see the module docs). `q` is
    /// zero-padded to `k.len()` rounded up to 8; past `k.len()` a key
    /// dimension counts as 0.
    #[inline]
    pub(super) fn dot(q: &[f32], k: &[f32]) -> f32 {
        let mut acc = [0.0f32; 8];
        let full = k.len() / 8;
        for c in 0..full {
            let (Some(qv), Some(kv)) = (q.get(c * 8..c * 8 + 8), k.get(c * 8..c * 8 + 8)) else {
                break;
            };
            for j in 0..8 {
                acc[j] = qv[j].mul_add(kv[j], acc[j]);
            }
        }
        if k.len() % 8 != 0 {
            let c = full * 8;
            for (j, a) in acc.iter_mut().enumerate() {
                let x = q.get(c + j).copied().unwrap_or(0.0);
                let y = k.get(c + j).copied().unwrap_or(0.0);
                *a = x.mul_add(y, *a);
            }
        }
        ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
    }

    pub(super) fn segment(seg: &Segment<'_>, mut out: TileOut<'_>) {
        let (d, dp) = (seg.d, seg.dp);
        let mut cur_block = usize::MAX;
        let mut m = [f32::NEG_INFINITY; MR];
        for piece in Pieces::new(seg) {
            if piece.block != cur_block {
                if cur_block != usize::MAX {
                    out.flush(cur_block - seg.b0, m);
                }
                cur_block = piece.block;
                m = [f32::NEG_INFINITY; MR];
            }
            for p in piece.from..piece.to {
                let Some(k) = seg.keys.get(p * d..(p + 1) * d) else {
                    break;
                };
                for (r, mr) in m.iter_mut().enumerate() {
                    if piece.masked && p >= seg.vis[r] {
                        continue;
                    }
                    let q = seg.q.get(r * dp..(r + 1) * dp).unwrap_or(&[]);
                    let s = dot(q, k);
                    // NaN never wins; same semantics as `_mm_max_ps(s, m)`.
                    if s > *mr {
                        *mr = s;
                    }
                }
            }
        }
        if cur_block != usize::MAX {
            out.flush(cur_block - seg.b0, m);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2 + FMA kernel: 4 rows × up to 3 keys of dot products per
    //! step, one `__m256` accumulator each, reduced in the canonical order.
    use super::{Pieces, Segment, TileOut, MR, PREFETCH_KEYS};
    use std::arch::x86_64::*;

    /// Sums the 8 lanes of `a, b, c, d` in the canonical order
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`; lanes come out as
    /// `[a, c, b, d]` (rows 0, 2, 1, 3).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
        // [a_j + a_{j+4} | b_j + b_{j+4}], j = 0..4
        let x = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        );
        let y = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(c, d),
            _mm256_permute2f128_ps::<0x31>(c, d),
        );
        // [x0+x2, x1+x3, y0+y2, y1+y3 | x4+x6, x5+x7, y4+y6, y5+y7]
        let z = _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(x, y),
            _mm256_shuffle_ps::<0xEE>(x, y),
        );
        _mm_hadd_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps::<1>(z))
    }

    /// Dot products of the 4 rows at `q` (stride `dp`) with the `NR` keys
    /// at `k` (stride `d`), each as `[r0, r2, r1, r3]`.
    ///
    /// # Safety
    /// `q` must be readable for `4 * dp` floats with `dp >= d` rounded up
    /// to 8, and `k` for `NR * d` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots<const NR: usize>(
        q: *const f32,
        dp: usize,
        k: *const f32,
        d: usize,
        tail: __m256i,
    ) -> [__m128; NR] {
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let full = d / 8;
        for c in 0..full {
            let mut kv = [_mm256_setzero_ps(); NR];
            for (j, v) in kv.iter_mut().enumerate() {
                // SAFETY: key j's dims c*8 .. c*8+8 are within its d.
                *v = unsafe { _mm256_loadu_ps(k.add(j * d + c * 8)) };
            }
            for (r, accr) in acc.iter_mut().enumerate() {
                // SAFETY: row r's dims c*8 .. c*8+8 are within dp.
                let qv = unsafe { _mm256_loadu_ps(q.add(r * dp + c * 8)) };
                for j in 0..NR {
                    accr[j] = _mm256_fmadd_ps(qv, kv[j], accr[j]);
                }
            }
        }
        if d % 8 != 0 {
            let c = full;
            let mut kv = [_mm256_setzero_ps(); NR];
            for (j, v) in kv.iter_mut().enumerate() {
                // SAFETY: the mask reads only dims c*8 .. d of key j.
                *v = unsafe { _mm256_maskload_ps(k.add(j * d + c * 8), tail) };
            }
            for (r, accr) in acc.iter_mut().enumerate() {
                // SAFETY: dp is d rounded up to 8, zero-padded.
                let qv = unsafe { _mm256_loadu_ps(q.add(r * dp + c * 8)) };
                for j in 0..NR {
                    accr[j] = _mm256_fmadd_ps(qv, kv[j], accr[j]);
                }
            }
        }
        let mut outv = [_mm_setzero_ps(); NR];
        for (j, o) in outv.iter_mut().enumerate() {
            *o = reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
        }
        outv
    }

    /// Lanes `[r0, r2, r1, r3]` back in row order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn unpermute(m: __m128) -> [f32; MR] {
        let mut a = [0.0f32; 4];
        // SAFETY: `a` holds 4 floats.
        unsafe { _mm_storeu_ps(a.as_mut_ptr(), m) };
        [a[0], a[2], a[1], a[3]]
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn segment(seg: &Segment<'_>, mut out: TileOut<'_>) {
        let d = seg.d;
        let dp = seg.dp;
        // Every key this segment reads must exist, and q must hold 4 rows
        // (the engine guarantees both; this keeps the pointer reads sound
        // even if it did not).
        let sound = seg.end.saturating_mul(d) <= seg.keys.len()
            && seg.q.len() >= MR * dp
            && dp >= d.div_ceil(8) * 8;
        debug_assert!(sound, "block_sparse kernel called out of bounds");
        if !sound {
            return;
        }
        let rem = (d % 8) as i32;
        let tail = _mm256_setr_epi32(
            -((rem > 0) as i32),
            -((rem > 1) as i32),
            -((rem > 2) as i32),
            -((rem > 3) as i32),
            -((rem > 4) as i32),
            -((rem > 5) as i32),
            -((rem > 6) as i32),
            -((rem > 7) as i32),
        );
        let q = seg.q.as_ptr();
        let kbase = seg.keys.as_ptr();
        let neg_inf = _mm_set1_ps(f32::NEG_INFINITY);
        let mut cur_block = usize::MAX;
        let mut m = neg_inf;
        let pf_dist = if seg.prefetch { PREFETCH_KEYS } else { 0 };
        for piece in Pieces::new(seg) {
            if piece.block != cur_block {
                if cur_block != usize::MAX {
                    out.flush(cur_block - seg.b0, unpermute(m));
                }
                cur_block = piece.block;
                m = neg_inf;
            }
            let (from, to) = (piece.from, piece.to);
            if !piece.masked {
                let mut p = from;
                while p + 3 <= to {
                    if pf_dist > 0 {
                        // A hint only: never dereferenced, so an address past
                        // the keys is harmless (hence wrapping arithmetic).
                        let ahead = kbase.wrapping_add((p + pf_dist) * d) as *const i8;
                        let mut off = 0;
                        while off < 3 * d * 4 {
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off));
                            off += 64;
                        }
                    }
                    // SAFETY: keys p..p+3 exist (end * d <= keys.len()).
                    let s = unsafe { dots::<3>(q, dp, kbase.add(p * d), d, tail) };
                    m = _mm_max_ps(s[0], m);
                    m = _mm_max_ps(s[1], m);
                    m = _mm_max_ps(s[2], m);
                    p += 3;
                }
                if p + 2 <= to {
                    // SAFETY: as above.
                    let s = unsafe { dots::<2>(q, dp, kbase.add(p * d), d, tail) };
                    m = _mm_max_ps(s[0], m);
                    m = _mm_max_ps(s[1], m);
                    p += 2;
                }
                if p < to {
                    // SAFETY: as above.
                    let s = unsafe { dots::<1>(q, dp, kbase.add(p * d), d, tail) };
                    m = _mm_max_ps(s[0], m);
                }
            } else {
                // Lane i keeps key p iff p < vis of row [0, 2, 1, 3][i],
                // compared relative to `from` so it fits an i32.
                let rel = |v: usize| v.saturating_sub(from).min(i32::MAX as usize) as i32;
                let vis = _mm_setr_epi32(
                    rel(seg.vis[0]),
                    rel(seg.vis[2]),
                    rel(seg.vis[1]),
                    rel(seg.vis[3]),
                );
                let mut p = from;
                while p < to {
                    let n = (to - p).min(3);
                    // SAFETY: as above.
                    let s = unsafe {
                        match n {
                            3 => dots::<3>(q, dp, kbase.add(p * d), d, tail),
                            2 => {
                                let [a, b] = dots::<2>(q, dp, kbase.add(p * d), d, tail);
                                [a, b, neg_inf]
                            }
                            _ => {
                                let [a] = dots::<1>(q, dp, kbase.add(p * d), d, tail);
                                [a, neg_inf, neg_inf]
                            }
                        }
                    };
                    for (j, sj) in s.into_iter().enumerate().take(n) {
                        let rel_p = (p + j - from).min(i32::MAX as usize) as i32;
                        let keep = _mm_castsi128_ps(_mm_cmpgt_epi32(vis, _mm_set1_epi32(rel_p)));
                        // max(s, m) where kept; m (unchanged) elsewhere.
                        m = _mm_blendv_ps(m, _mm_max_ps(sj, m), keep);
                    }
                    p += n;
                }
            }
        }
        if cur_block != usize::MAX {
            out.flush(cur_block - seg.b0, unpermute(m));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn f32(&mut self) -> f32 {
            // In [-1, 1), with a full 24-bit mantissa: rounding differs
            // between summation orders, so a mismatch would show.
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Block maxima of every (query, head) row, computed with `level`.
    fn maxima(
        level: Level,
        q: &[f32],
        rows: usize,
        vis: &[usize],
        keys: &[f32],
        d: usize,
        bs: usize,
    ) -> Vec<u32> {
        let padded = PaddedRows::new(q, rows, d, |r| vis[r]);
        let n_keys = keys.len() / d;
        let nb = vis.iter().map(|v| v.div_ceil(bs)).max().unwrap_or(0);
        let rp = padded.rows_pad;
        let mut scratch = vec![f32::NEG_INFINITY; nb * rp];
        // Several tasks and a small key chunk, to cross every boundary.
        let bpt = 3;
        for (t, chunk) in scratch.chunks_mut(rp * bpt).enumerate() {
            score_blocks(level, &padded, keys, d, n_keys, bs, t * bpt, chunk, 5);
        }
        let mut bits = Vec::new();
        for r in 0..rows {
            for b in 0..vis[r].div_ceil(bs) {
                bits.push(scratch[b * rp + r].to_bits());
            }
        }
        bits
    }

    /// The AVX2 kernel and the portable kernel compute bit-identical block
    /// maxima (not merely close ones) on random full-precision data, for
    /// odd dimensions, block sizes, row counts and causal limits -- the
    /// summation order is the same on both.
    #[test]
    fn the_avx2_and_portable_kernels_give_bit_identical_block_maxima() {
        #[cfg(target_arch = "x86_64")]
        {
            if !(std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma"))
            {
                return;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        return;
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut finite = 0;
        for case in 0..300 {
            let d = 1 + rng.below(40);
            let n_keys = rng.below(90);
            let rows = 1 + rng.below(9);
            let bs = 1 + rng.below(13);
            let keys: Vec<f32> = (0..n_keys * d).map(|_| rng.f32()).collect();
            let mut q: Vec<f32> = (0..rows * d).map(|_| rng.f32()).collect();
            if case % 7 == 0 {
                // Exact zeros, so -0.0 vs +0.0 sums appear too.
                for v in q.iter_mut().step_by(2) {
                    *v = -0.0;
                }
            }
            let vis: Vec<usize> = (0..rows).map(|_| rng.below(n_keys + 1)).collect();
            let a = maxima(Level::Scalar, &q, rows, &vis, &keys, d, bs);
            let b = maxima(Level::Avx2, &q, rows, &vis, &keys, d, bs);
            finite += a.iter().filter(|&&x| f32::from_bits(x).is_finite()).count();
            assert_eq!(
                a, b,
                "case {case}: d={d} n_keys={n_keys} rows={rows} bs={bs}"
            );
        }
        assert!(finite > 5_000, "only {finite} finite block maxima compared");
    }

    /// Splitting the rows into groups (to bound the scratch) changes
    /// nothing: a scratch budget of one tile gives the same selections as
    /// one group holding every row.
    #[test]
    fn row_groups_do_not_change_the_selection() {
        let mut rng = XorShift(0xabcdef);
        for case in 0..40 {
            let (heads, d) = (1 + rng.below(6), 1 + rng.below(20));
            let n_keys = 1 + rng.below(200);
            let n_q = 1 + rng.below(9);
            let cfg = BlockSparseConfig::new(
                1 + rng.below(6),
                1 + rng.below(5),
                rng.below(2),
                rng.below(2),
            )
            .unwrap();
            let w = cfg.width();
            let keys: Vec<f32> = (0..n_keys * d).map(|_| rng.f32()).collect();
            let q: Vec<f32> = (0..n_q * heads * d).map(|_| rng.f32()).collect();
            let vis: Vec<usize> = (0..n_q).map(|_| rng.below(n_keys + 1)).collect();
            let run = |scratch: usize| {
                let mut out = vec![0i32; n_q * heads * w];
                run_engine(
                    simd::level(),
                    &q,
                    heads,
                    &vis,
                    &keys,
                    d,
                    &cfg,
                    &mut out,
                    w,
                    &write_i32_row,
                    scratch,
                );
                out
            };
            assert_eq!(run(1), run(SCRATCH_FLOATS), "case {case}");
        }
    }

    /// The canonical dot product is what the module docs say it is.
    #[test]
    fn the_portable_dot_product_sums_eight_lanes_in_the_documented_order() {
        let q: Vec<f32> = (0..11).map(|i| (i as f32 + 1.0) * 0.1).collect();
        let k: Vec<f32> = (0..11).map(|i| 1.0 / (i as f32 + 3.0)).collect();
        let mut qp = q.clone();
        qp.resize(16, 0.0);
        let mut l = [0.0f32; 8];
        for i in 0..16 {
            let kv = k.get(i).copied().unwrap_or(0.0);
            l[i % 8] = qp[i].mul_add(kv, l[i % 8]);
        }
        let want = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        assert_eq!(portable::dot(&qp, &k).to_bits(), want.to_bits());
    }
}
