//! The public entry points: one query, a chunk of queries, a packed batch of
//! sequences, a paged cache, and the positions a selection covers.

use super::engine::{run_engine, Finish, Keys, SCRATCH_FLOATS};
use super::select::write_i32_row;
use super::validate::{
    bad_position, check_block_ids_fit_i32, check_out, check_per_query_len, check_q_len, key_rows,
    visible_end,
};
use super::{BlockIds, BlockSparseConfig, IndexLike, OutLayout};
use crate::error::ArgumentError;
use crate::keys::{BlockTable, Encoded, PageLayout, PagedCache};
use crate::{packed, simd};

/// `out` cut into one slice per (query, head) row, listed query-major
/// whatever the layout, so the engine writes every row where `layout`
/// puts it (no transpose afterwards).
fn out_rows(
    out: &mut [i32],
    n_queries: usize,
    heads: usize,
    width: usize,
    layout: OutLayout,
) -> Vec<&mut [i32]> {
    if n_queries == 0 || heads == 0 || width == 0 {
        return Vec::new();
    }
    match layout {
        OutLayout::QueryMajor => out.chunks_exact_mut(width).collect(),
        OutLayout::HeadMajor => {
            let mut per_head: Vec<_> = out
                .chunks_exact_mut(n_queries * width)
                .map(|h| h.chunks_exact_mut(width))
                .collect();
            let mut rows = Vec::with_capacity(n_queries * heads);
            for _ in 0..n_queries {
                rows.extend(per_head.iter_mut().filter_map(|h| h.next()));
            }
            rows
        }
    }
}

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
) -> Result<Vec<Vec<usize>>, ArgumentError> {
    cfg.validate()?;
    let n_positions = key_rows(index_k.len(), d)?;
    check_q_len(index_q.len(), 1, n_kv_heads, d)?;
    let vis = [visible_end(query_pos, n_positions)];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n_kv_heads];
    let mut rows: Vec<&mut [Vec<usize>]> = out.iter_mut().map(std::slice::from_mut).collect();
    run_engine(
        simd::Isa::best(),
        &Encoded::F32(index_q),
        n_kv_heads,
        &vis,
        &Keys::Dense(Encoded::F32(index_k)),
        d,
        cfg,
        &mut rows,
        Finish::Select(&|sel: &[usize], row: &mut [Vec<usize>]| {
            if let Some(slot) = row.first_mut() {
                slot.clear();
                slot.extend_from_slice(sel);
            }
        }),
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
) -> Result<(), ArgumentError> {
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
) -> Result<(), ArgumentError> {
    let (q, k) = (Encoded::F32(index_q), Encoded::F32(index_k));
    let layout = OutLayout::QueryMajor;
    select_batch_encoded_into(q, n_queries, n_kv_heads, k, d, query_pos, cfg, layout, out)
}

/// [`select_batch_into`] for keys and queries in any [`Encoded`] format
/// (decoded exactly: the selection equals the float32 call on the decoded
/// values, bit for bit), written in `layout`: `[n_queries, n_kv_heads,
/// width]` or the engines' `[n_kv_heads, n_queries, width]`.
#[allow(clippy::too_many_arguments)]
pub fn select_batch_encoded_into<P: IndexLike>(
    index_q: Encoded<'_>,
    n_queries: usize,
    n_kv_heads: usize,
    index_k: Encoded<'_>,
    d: usize,
    query_pos: &[P],
    cfg: &BlockSparseConfig,
    layout: OutLayout,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    let (n_positions, vis) =
        dense_rows(&index_q, n_queries, n_kv_heads, &index_k, d, query_pos, cfg)?;
    check_block_ids_fit_i32(n_positions, cfg)?;
    let width = cfg.width();
    check_out(out, n_queries, n_kv_heads, width)?;
    let mut rows = out_rows(out, n_queries, n_kv_heads, width, layout);
    run_engine(
        simd::Isa::best(),
        &index_q,
        n_kv_heads,
        &vis,
        &Keys::Dense(index_k),
        d,
        cfg,
        &mut rows,
        Finish::Select(&write_i32_row),
        SCRATCH_FLOATS,
    );
    Ok(())
}

/// The checks a dense call's inputs share (config, keys, queries, one
/// position per query), and each query's visible end.
fn dense_rows<P: IndexLike>(
    index_q: &Encoded<'_>,
    n_queries: usize,
    n_kv_heads: usize,
    index_k: &Encoded<'_>,
    d: usize,
    query_pos: &[P],
    cfg: &BlockSparseConfig,
) -> Result<(usize, Vec<usize>), ArgumentError> {
    cfg.validate()?;
    let n_positions = key_rows(index_k.len(), d)?;
    check_q_len(index_q.len(), n_queries, n_kv_heads, d)?;
    check_per_query_len("query_pos", query_pos.len(), n_queries)?;
    let vis = query_pos
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let p = p.to_usize().ok_or_else(|| bad_position(i, p))?;
            Ok(visible_end(p, n_positions))
        })
        .collect::<Result<_, ArgumentError>>()?;
    Ok((n_positions, vis))
}

/// Every row's block scores themselves, the exact values the selection
/// ranks (bit for bit, at every SIMD level): `out` is `[n_queries,
/// n_kv_heads, n_blocks]` float32 with `n_blocks = ⌈n_positions /
/// block_size⌉`, entry `b` of a row the max of `q · k_t` over block `b`'s
/// visible positions (`-0.0` read as `+0.0`; `-inf` when every visible
/// score is NaN), NaN past the row's visible blocks. With `magnitude`, the
/// same maxima of `Σ_i |q_i · k_ti|` instead: the scale a lower-precision
/// engine's rounding of a block score grows with ([`crate::check`]).
/// Only `cfg.block_size` matters here; the config is validated as ever.
#[allow(clippy::too_many_arguments)]
pub fn block_scores_into<P: IndexLike>(
    index_q: Encoded<'_>,
    n_queries: usize,
    n_kv_heads: usize,
    index_k: Encoded<'_>,
    d: usize,
    query_pos: &[P],
    cfg: &BlockSparseConfig,
    magnitude: bool,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let (n_positions, vis) =
        dense_rows(&index_q, n_queries, n_kv_heads, &index_k, d, query_pos, cfg)?;
    let n_blocks = n_positions.div_ceil(cfg.block_size);
    let expected = n_queries
        .checked_mul(n_kv_heads)
        .and_then(|r| r.checked_mul(n_blocks));
    if expected != Some(out.len()) {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: expected.unwrap_or(usize::MAX),
            actual: out.len(),
            shape: format!("[{n_queries}, {n_kv_heads}, {n_blocks}]"),
        });
    }
    if n_blocks == 0 {
        return Ok(());
    }
    // |q · k| summed term by term is the dot product of |q| and |k|: the
    // magnitudes are the same engine run on the inputs' absolute values.
    let (abs_q, abs_k) = if magnitude {
        (Some(index_q.abs()), Some(index_k.abs()))
    } else {
        (None, None)
    };
    let q = abs_q.as_ref().map_or(index_q, |a| a.encoded());
    let k = abs_k.as_ref().map_or(index_k, |a| a.encoded());
    let mut rows: Vec<&mut [f32]> = out.chunks_mut(n_blocks).collect();
    let write = |nb: usize, score: &dyn Fn(usize) -> f32, row: &mut [f32]| {
        for (b, slot) in row.iter_mut().enumerate() {
            *slot = if b < nb { score(b) } else { f32::NAN };
        }
    };
    run_engine(
        simd::Isa::best(),
        &q,
        n_kv_heads,
        &vis,
        &Keys::Dense(k),
        d,
        cfg,
        &mut rows,
        Finish::Scores(&write),
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
) -> Result<(), ArgumentError> {
    let (q, k) = (Encoded::F32(index_q), Encoded::F32(index_k));
    let (sids, pos, layout) = (seq_ids, query_pos, OutLayout::QueryMajor);
    select_packed_encoded_into(
        q, n_queries, n_kv_heads, k, d, cu_seqlens, sids, pos, cfg, layout, out,
    )
}

/// [`select_packed_into`] for keys and queries in any [`Encoded`] format,
/// written in `layout` (see [`select_batch_encoded_into`]).
#[allow(clippy::too_many_arguments)]
pub fn select_packed_encoded_into<C: IndexLike, I: IndexLike>(
    index_q: Encoded<'_>,
    n_queries: usize,
    n_kv_heads: usize,
    index_k: Encoded<'_>,
    d: usize,
    cu_seqlens: &[C],
    seq_ids: &[I],
    query_pos: &[I],
    cfg: &BlockSparseConfig,
    layout: OutLayout,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    cfg.validate()?;
    let n_positions = key_rows(index_k.len(), d)?;
    check_q_len(index_q.len(), n_queries, n_kv_heads, d)?;
    check_block_ids_fit_i32(n_positions, cfg)?;
    let bounds = packed::boundaries(cu_seqlens, n_positions, ("keys", "index_k"))?;
    let n_seqs = bounds.len() - 1;
    packed::check_seq_ids_len(seq_ids.len(), n_queries)?;
    check_per_query_len("query_pos", query_pos.len(), n_queries)?;
    let width = cfg.width();
    check_out(out, n_queries, n_kv_heads, width)?;
    let mut seqs = Vec::with_capacity(n_queries);
    let mut pos = Vec::with_capacity(n_queries);
    for (i, (&s, &p)) in seq_ids.iter().zip(query_pos).enumerate() {
        let s = packed::seq_id(i, s, n_seqs, "cu_seqlens")?;
        let p = p.to_usize().ok_or_else(|| bad_position(i, p))?;
        seqs.push(s);
        pos.push(p);
    }
    let mut rows = out_rows(out, n_queries, n_kv_heads, width, layout);
    let row_q = n_kv_heads.saturating_mul(d);
    for_each_run(&seqs, |s, start, end| {
        let (k0, k1) = (bounds[s], bounds[s + 1]);
        let vis: Vec<usize> = pos[start..end]
            .iter()
            .map(|&p| visible_end(p, k1 - k0))
            .collect();
        run_engine(
            simd::Isa::best(),
            &index_q.slice(start * row_q, end * row_q),
            n_kv_heads,
            &vis,
            &Keys::Dense(index_k.slice(k0 * d, k1 * d)),
            d,
            cfg,
            &mut rows[start * n_kv_heads..end * n_kv_heads],
            Finish::Select(&write_i32_row),
            SCRATCH_FLOATS,
        );
    });
    Ok(())
}

/// Calls `f(seq, start, end)` for every run `start..end` of consecutive
/// queries of one sequence (a serving batch is normally one run per
/// sequence): one engine call per run.
fn for_each_run(seqs: &[usize], mut f: impl FnMut(usize, usize, usize)) {
    let mut start = 0;
    while start < seqs.len() {
        let s = seqs[start];
        let end = start + seqs[start..].iter().take_while(|&&x| x == s).count();
        f(s, start, end);
        start = end;
    }
}

/// The inputs of a paged selection (see [`select_paged_into`]).
#[derive(Debug, Clone, Copy)]
pub struct PagedBlocks<'a> {
    /// `[n_queries, n_kv_heads, d]`.
    pub q: Encoded<'a>,
    pub n_queries: usize,
    pub n_kv_heads: usize,
    /// Pages of `cfg.block_size` tokens (the page is the block).
    pub cache: PagedCache<'a>,
    pub table: BlockTable<'a>,
    /// `[n_queries]`: each query's sequence.
    pub seq_ids: &'a [usize],
    /// `[n_queries]`: each query's position within its sequence.
    pub query_pos: &'a [usize],
}

/// Block selection over an engine's paged index-K cache, read in place
/// (vLLM's MiniMax-M3 layout: `[num_blocks, 128, d]`, one index head shared
/// by the KV heads, bfloat16 or fp8). Query `i` sees tokens `0 ..
/// min(query_pos[i] + 1, seq_lens[s])` of its sequence `s = seq_ids[i]`;
/// its row holds the sequence's **logical** block ids (what vLLM's
/// `minimax_m3_index_topk` returns), or with [`BlockIds::Physical`] the
/// page each maps to through the block table (same slots). Row for row
/// equal to [`select_into`] on the sequence's keys laid out contiguously.
///
/// Refuses, before writing anything: pages of another size than
/// `cfg.block_size` (the block size is the page size: an ABI), a
/// block-table entry that would be read and is negative or past the cache,
/// a row shorter than its sequence needs, an unknown sequence id, and every
/// shape mismatch.
pub fn select_paged_into(
    inputs: &PagedBlocks<'_>,
    cfg: &BlockSparseConfig,
    layout: OutLayout,
    ids: BlockIds,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    cfg.validate()?;
    let (c, table) = (inputs.cache, inputs.table);
    c.check()?;
    if c.layout == PageLayout::Fp8WithScales {
        return Err(ArgumentError::Invalid {
            argument: "kv_cache",
            message: "block selection reads unscaled pages (MiniMax-M3's index-K cache); \
                      the fp8-with-scales layout is the DSA indexer's"
                .into(),
        });
    }
    if c.block_size != cfg.block_size {
        return Err(ArgumentError::Invalid {
            argument: "kv_cache",
            message: format!(
                "kv_cache pages hold {} tokens but config.block_size is {}: the page is the \
                 block (an ABI, not a tuning knob), so they must be equal",
                c.block_size, cfg.block_size
            ),
        });
    }
    let (n, h, d) = (inputs.n_queries, inputs.n_kv_heads, c.d);
    check_q_len(inputs.q.len(), n, h, d)?;
    check_per_query_len("seq_ids", inputs.seq_ids.len(), n)?;
    check_per_query_len("query_pos", inputs.query_pos.len(), n)?;
    let width = cfg.width();
    check_out(out, n, h, width)?;
    table.check(c.n_pages, c.block_size)?;
    table.check_seq_ids(inputs.seq_ids)?;
    let mut rows = out_rows(out, n, h, width, layout);
    let row_q = h.saturating_mul(d);
    for_each_run(inputs.seq_ids, |seq, start, end| {
        let len = table.seq_lens[seq];
        let vis: Vec<usize> = inputs.query_pos[start..end]
            .iter()
            .map(|&p| visible_end(p, len))
            .collect();
        // Logical ids are < ⌈len / bs⌉, each checked to be a page.
        let physical = |sel: &[usize], row: &mut [i32]| {
            let mut it = sel.iter();
            for slot in row.iter_mut() {
                *slot = it.next().map_or(-1, |&b| table.page(seq, b) as i32);
            }
        };
        let write: &(dyn Fn(&[usize], &mut [i32]) + Sync) = match ids {
            BlockIds::Logical => &write_i32_row,
            BlockIds::Physical => &physical,
        };
        run_engine(
            simd::Isa::best(),
            &inputs.q.slice(start * row_q, end * row_q),
            h,
            &vis,
            &Keys::Paged {
                cache: c,
                table,
                seq,
            },
            d,
            cfg,
            &mut rows[start * h..end * h],
            Finish::Select(write),
            SCRATCH_FLOATS,
        );
    });
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
) -> Result<Vec<i32>, ArgumentError> {
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
            return Err(ArgumentError::OutOfRange {
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
        .map_err(|_| ArgumentError::OutputTooLarge {
            argument: "positions",
            len,
        })?;
    for r in ranges {
        // Every position is <= i32::MAX (checked above), so `as` is exact.
        out.extend(r.map(|p| p as i32));
    }
    Ok(out)
}

/// [`positions_of_blocks_i32`] for a whole batch of selection rows, each
/// written as a fixed-width row of `width × block_size` positions,
/// ascending, then `-1` — what [`crate::attention`]'s sparse pass takes.
///
/// `blocks` is `[n_queries, heads, width]` (or `[heads, n_queries, width]`
/// with [`OutLayout::HeadMajor`]; a plain list of rows is `heads = 1`);
/// `query_pos` and `n_positions` hold one entry per query, or one for all.
/// Every slot of `out` is written. Refuses (before writing) a covered
/// position that does not fit an `i32`, and every shape mismatch.
#[allow(clippy::too_many_arguments)]
pub fn positions_of_blocks_batch_into(
    blocks: &[i32],
    n_queries: usize,
    heads: usize,
    width: usize,
    layout: OutLayout,
    query_pos: &[usize],
    n_positions: &[usize],
    cfg: &BlockSparseConfig,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    cfg.validate()?;
    let bs = cfg.block_size;
    let n_rows = n_queries.saturating_mul(heads);
    let shape_err = |argument, message| Err(ArgumentError::Invalid { argument, message });
    if crate::error::product(&[n_rows, width]) != Some(blocks.len()) {
        let message = format!(
            "blocks has {} entries, expected n_queries ({n_queries}) × heads ({heads}) × width \
             ({width})",
            blocks.len()
        );
        return shape_err("blocks", message);
    }
    for (name, v) in [("query_pos", query_pos), ("n_positions", n_positions)] {
        if v.len() != 1 && v.len() != n_queries {
            let message = format!(
                "{name} has {} entries, expected one per query ({n_queries}) or one for all",
                v.len()
            );
            return shape_err(name, message);
        }
    }
    let Some(row_len) = width.checked_mul(bs) else {
        return Err(ArgumentError::OutputTooLarge {
            argument: "out",
            len: usize::MAX,
        });
    };
    let expected = n_rows.checked_mul(row_len);
    if expected != Some(out.len()) {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: expected.unwrap_or(usize::MAX),
            actual: out.len(),
            shape: format!("rows ({n_rows}) × width ({width}) × block_size ({bs})"),
        });
    }
    let query = |r: usize| match layout {
        OutLayout::QueryMajor => r / heads.max(1),
        OutLayout::HeadMajor => r % n_queries.max(1),
    };
    let pick = |v: &[usize], q: usize| if v.len() == 1 { v[0] } else { v[q] };
    let limit = |r: usize| {
        let q = query(r);
        visible_end(pick(query_pos, q), pick(n_positions, q))
    };
    // Refuse before writing: a covered position past i32.
    for (r, row) in blocks.chunks_exact(width.max(1)).enumerate() {
        let lim = limit(r);
        let n_blocks = lim.div_ceil(bs);
        let last = row
            .iter()
            .filter_map(|&b| usize::try_from(b).ok())
            .filter(|&b| b < n_blocks)
            .max();
        if let Some(b) = last {
            let end = (b + 1).saturating_mul(bs).min(lim);
            if end - 1 > i32::MAX as usize {
                let j = row.iter().position(|&x| x as usize == b).unwrap_or(0);
                let index = r * width + j;
                let message = format!(
                    "blocks row {r}, entry {j} = {b} covers position {}, which does not fit an \
                     int32",
                    end - 1
                );
                return Err(ArgumentError::OutOfRange {
                    argument: "blocks",
                    index,
                    message,
                });
            }
        }
    }
    let min_rows = crate::pool::min_rows(row_len);
    crate::pool::for_each_row_mut(out, row_len, min_rows, |r, dst| {
        let lim = limit(r);
        let src = &blocks[r * width..(r + 1) * width];
        let n_blocks = lim.div_ceil(bs);
        // The row's visible ids, on the stack for a selection's width (no
        // allocation per row), sorted and deduplicated unless already so.
        let (mut stack, mut heap) = ([0usize; 64], Vec::new());
        let valid = src
            .iter()
            .filter_map(|&b| usize::try_from(b).ok())
            .filter(|&b| b < n_blocks);
        let ids: &mut [usize] = if width <= stack.len() {
            let mut n = 0;
            for b in valid {
                stack[n] = b;
                n += 1;
            }
            &mut stack[..n]
        } else {
            heap.extend(valid);
            &mut heap
        };
        let ids = if ids.windows(2).all(|w| w[0] < w[1]) {
            &ids[..]
        } else {
            ids.sort_unstable();
            let mut n = 0;
            for i in 0..ids.len() {
                if n == 0 || ids[i] != ids[n - 1] {
                    ids[n] = ids[i];
                    n += 1;
                }
            }
            &ids[..n]
        };
        let mut at = 0;
        for &b in ids {
            // b < ⌈lim / bs⌉, so b·bs < lim; every position fits i32 (above).
            let start = b * bs;
            let n = (start + bs).min(lim) - start;
            // An i32 counter, so the loop vectorises as an iota.
            let mut v = start as i32;
            for slot in &mut dst[at..at + n] {
                *slot = v;
                v = v.wrapping_add(1);
            }
            at += n;
        }
        dst[at..].fill(-1);
    });
    Ok(())
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
