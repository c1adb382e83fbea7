//! The public entry points: one query, a chunk of queries, a packed batch of
//! sequences, and the positions a selection covers.

use super::engine::{run_engine, SCRATCH_FLOATS};
use super::select::write_i32_row;
use super::validate::{
    bad_position, check_block_ids_fit_i32, check_cu_seqlens, check_out, check_per_query_len,
    check_q_len, key_rows, visible_end,
};
use super::{BlockSparseConfig, IndexLike, SelectionError};
use crate::simd;

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
        simd::avx2(),
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
        simd::avx2(),
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
            simd::avx2(),
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
