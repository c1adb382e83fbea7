//! Block selection: one query or a chunk of one sequence, a packed serving
//! batch, and an engine's paged cache read in place.

use pyo3::prelude::*;

use super::config::config;
use super::inputs::{index_keys, layout, queries, rows_shape};
use crate::block_sparse::{self, BlockIds, PagedBlocks};
use crate::python::args::{
    ndarrays, positions, positions_along, query_positions, AsFormatArg, Broadcast, EncodedIn,
    KeyFormat, Named, Obj, Opt, PageLayoutName, Queries, QueryFormat, I32, S,
};
use crate::python::cache::{Paged, PagedArgs};
use crate::python::errors::refuse;

/// The blocks each KV head may read: block ids ascending, then -1, int32.
///
/// One query: ``index_q [n_kv_heads, d]`` with an int ``query_pos`` gives ``[n_kv_heads,
/// width]``; a chunk of queries of one sequence: ``index_q [n_queries, n_kv_heads, d]`` with
/// ``query_pos [n_queries]`` gives ``[n_queries, n_kv_heads, width]``, or the engines'
/// ``[n_kv_heads, n_queries, width]`` with ``head_major=True``; ``width = config.width``.
/// float32, float16 and ml_dtypes bfloat16 / float8_e4m3fn keys and queries are read in
/// place (a raw uint16 / uint8 view names its format with ``key_format`` /
/// ``query_format``); an array in non-native byte order, misaligned or not C-contiguous is
/// copied once to a native, aligned one (the same values). NaN scores are absent: a row of
/// them gets its forced blocks, then the lowest ids. The free blocks chosen are those with
/// the largest block scores in real arithmetic (ties to the lower id): the float32 maxima
/// :func:`block_scores` reports screen, and near ties at the threshold are re-scored in
/// float64 (every product exact).
///
/// Parameters
/// ----------
/// index_q : array_like, [n_kv_heads, d] or [n_queries, n_kv_heads, d]
///     The indexer queries of one query (2-D) or of a chunk of one sequence (3-D): float32
///     (float64 converted once), float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw
///     uint16 / uint8 view with ``query_format``. Any CPU DLPack tensor too.
/// index_k : array_like, [n_positions, d]
///     The sequence's index keys, in the formats of ``index_q`` (raw views with
///     ``key_format``); ``d`` is ``index_q``'s, at least 1. Any CPU DLPack tensor too.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position, >= 0 (one past the last key is clipped to the keys that
///     exist). One integer with a 2-D ``index_q``; with a 3-D one ``[n_queries]``, or one
///     integer for a batch of one query.
/// config : BlockSparseConfig, optional
///     The selection rule; None for ``BlockSparseConfig()``.
/// key_format, query_format : str, optional
///     The format of a raw view: "float32", "float16", "bfloat16" or "float8_e4m3fn".
///     Required for a raw uint16 / uint8 array; with a typed array it must agree with its
///     dtype.
/// head_major : bool, default False
///     Batched rows as the engines' ``[n_kv_heads, n_queries, width]`` instead of
///     ``[n_queries, n_kv_heads, width]``.
/// out : ndarray of int32, optional
///     ``out=`` reuses a buffer: exactly the result's shape, written in place and returned.
///     C-contiguous, writeable, aligned, native byte order, not overlapping any input (else
///     refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_kv_heads, width] or [n_queries, n_kv_heads, width]
///     Each row's block ids, ascending, then -1: ``[n_kv_heads, width]`` for one query,
///     ``[n_kv_heads, n_queries, width]`` batched with ``head_major=True``.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``index_q`` is not 2-D or 3-D,
///     or its ``d`` is not ``index_k``'s (``index_q``); ``index_k`` is not 2-D (or its block
///     ids would not fit int32); ``d`` is 0 (``d``); ``query_pos`` is negative, past
///     2**63 - 1, not one integer with a 2-D ``index_q``, or not ``[n_queries]`` with a 3-D
///     one; a format name is unknown; a tensor is on a GPU (``.cpu()`` it); ``out`` is
///     refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when an array's dtype is no key format (int32 keys; a raw view without its format),
///     ``query_pos`` is not integers (a float, inf), ``config`` is not a BlockSparseConfig or
///     None, an argument is not an array (None, a DLPack capsule), or ``out`` is not an
///     int32 ndarray.
#[pyfunction]
#[pyo3(signature = (index_q, index_k, query_pos, config=None, *, key_format=None,
                    query_format=None, head_major=false, out=None))]
pub(super) fn block_sparse_select<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    head_major: bool,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (cfg, layout) = (self::config(config)?, layout(head_major));
    let (q, q_shape) = EncodedIn::new(S, index_q, "index_q", query_format.format_arg())?;
    let (k, d) = index_keys(index_k, key_format.format_arg())?;
    if let Some(&dq) = q_shape.last().filter(|_| matches!(q_shape.len(), 2 | 3)) {
        S.same_d(dq, d, "index_k")?;
    }
    let (n, h, pos) = match q_shape[..] {
        [h, _] => (
            1,
            h,
            query_positions(S, query_pos, "query_pos", Queries::One, Broadcast::Refuse)?,
        ),
        [n, h, _] => (
            n,
            h,
            query_positions(
                S,
                query_pos,
                "query_pos",
                Queries::Along("n_queries", n),
                Broadcast::Refuse,
            )?,
        ),
        _ => {
            let msg = format!(
                "index_q must be [n_kv_heads, d] (one query) or [n_queries, n_kv_heads, d], got {}-D {:?}",
                q_shape.len(),
                q_shape
            );
            return Err(refuse(S, "index_q", msg));
        }
    };
    let shape = match q_shape.len() {
        2 => vec![h, cfg.width()],
        _ => rows_shape(n, h, cfg.width(), layout),
    };
    let raw = ndarrays(&[query_pos]);
    let arrays = [
        &[q.untyped(), k.untyped()][..],
        &raw.iter().collect::<Vec<_>>(),
    ]
    .concat();
    let out = S.output::<i32>(py, out, &shape, &arrays)?;
    let (qs, ks) = (q.encoded()?, k.encoded()?);
    out.run(qs.len().saturating_add(ks.len()), |os| {
        block_sparse::select_batch_encoded_into(qs, n, h, ks, d, &pos, &cfg, layout, os)
    })
}

/// Block selection over a packed serving batch of sequences.
///
/// The keys of all sequences are concatenated in ``index_k [n_positions, d]``, sequence
/// ``s`` owning rows ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i`` (``index_q
/// [n_queries, n_kv_heads, d]``) belongs to sequence ``seq_ids[i]`` at position
/// ``query_pos[i]`` within it, and its block ids count from the start of its sequence.
/// Formats as :func:`block_sparse_select`.
///
/// Parameters
/// ----------
/// index_q : array_like, [n_queries, n_kv_heads, d]
///     The indexer queries, formats as :func:`block_sparse_select`. Any CPU DLPack tensor
///     too.
/// index_k : array_like, [n_positions, d]
///     Every sequence's index keys, concatenated; formats as :func:`block_sparse_select`.
/// cu_seqlens : array_like of int, [n_seqs + 1]
///     Sequence starts: 0 first, non-decreasing, the last ``n_positions``.
/// seq_ids : array_like of int, [n_queries]
///     Each query's sequence, in ``0..n_seqs``.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position within its sequence, >= 0 (one integer for one query).
/// config : BlockSparseConfig, optional
///     The selection rule; None for ``BlockSparseConfig()``.
/// key_format, query_format : str, optional
///     The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
/// head_major : bool, default False
///     Rows as ``[n_kv_heads, n_queries, width]`` instead of ``[n_queries, n_kv_heads,
///     width]``.
/// out : ndarray of int32, optional
///     ``out=`` reuses a buffer: exactly the result's shape, written in place and returned.
///     C-contiguous, writeable, aligned, native byte order, not overlapping any input (else
///     refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, n_kv_heads, width]
///     Each row's block ids within its sequence, ascending, then -1 (``[n_kv_heads,
///     n_queries, width]`` with ``head_major=True``).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``index_q`` is not 3-D or its
///     ``d`` is not ``index_k``'s (``index_q``); ``index_k`` is not 2-D; ``d`` is 0;
///     ``cu_seqlens`` is not 1-D, empty, does not start at 0, decreases or does not end at
///     ``n_positions``; ``seq_ids`` is not ``[n_queries]`` or names no sequence;
///     ``query_pos`` is negative or not ``[n_queries]``; a format name is unknown; a tensor
///     is on a GPU; ``out`` is refused (its shape, layout, read-only, or overlapping an
///     input).
/// TypeError
///     when an array's dtype is no key format, a position array is not integers, ``config``
///     is not a BlockSparseConfig or None, an argument is not an array, or ``out`` is not an
///     int32 ndarray.
#[pyfunction]
#[pyo3(signature = (index_q, index_k, cu_seqlens, seq_ids, query_pos, config=None, *,
                    key_format=None, query_format=None, head_major=false, out=None))]
pub(super) fn block_sparse_select_packed<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    cu_seqlens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    head_major: bool,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (cfg, layout) = (self::config(config)?, layout(head_major));
    let (q, [n, h, dq]) = queries(index_q, query_format.format_arg())?;
    let (k, d) = index_keys(index_k, key_format.format_arg())?;
    S.same_d(dq, d, "index_k")?;
    let cu = positions(S, cu_seqlens, "cu_seqlens")?;
    let (sid, pos) = (
        positions_along(S, seq_ids, "seq_ids", ("n_queries", n))?,
        query_positions(
            S,
            query_pos,
            "query_pos",
            Queries::Along("n_queries", n),
            Broadcast::Refuse,
        )?,
    );
    let shape = rows_shape(n, h, cfg.width(), layout);
    let raw = ndarrays(&[cu_seqlens, seq_ids, query_pos]);
    let arrays = [
        &[q.untyped(), k.untyped()][..],
        &raw.iter().collect::<Vec<_>>(),
    ]
    .concat();
    let out = S.output::<i32>(py, out, &shape, &arrays)?;
    let (qs, ks) = (q.encoded()?, k.encoded()?);
    out.run(qs.len().saturating_add(ks.len()), |os| {
        block_sparse::select_packed_encoded_into(qs, n, h, ks, d, &cu, &sid, &pos, &cfg, layout, os)
    })
}

/// Block selection over an engine's paged index-K cache, read in place.
///
/// vLLM's MiniMax-M3 layout: ``kv_cache [num_blocks, block_size, d]``, whose page is the
/// block. Query ``i`` (``index_q [n_queries, n_kv_heads, d]``) belongs to sequence
/// ``seq_ids[i]`` at ``query_pos[i]`` within it. Rows hold the sequence's logical block
/// ids, ascending, then -1 (what vLLM's ``minimax_m3_index_topk`` returns);
/// ``physical=True`` maps each through the block table to its page id, in the same slots.
/// The pages are never converted: a cache in non-native byte order is refused (naming
/// ``kv_cache``: pass ``kv_cache.astype(kv_cache.dtype.newbyteorder('='))``); misaligned
/// pages are read in place, byte by byte.
///
/// Parameters
/// ----------
/// index_q : array_like, [n_queries, n_kv_heads, d]
///     The indexer queries, formats as :func:`block_sparse_select`. Any CPU DLPack tensor
///     too.
/// kv_cache : ndarray, [num_blocks, block_size, d]
///     The pages: float32 / float16 / bfloat16 / float8_e4m3fn (a raw uint16 / uint8 view
///     with ``key_format``), native byte order; the block axis may be strided.
///     ``block_size`` must equal ``config.block_size``. Any CPU DLPack tensor too.
/// block_table : array_like of int32, [n_seqs, max_blocks]
///     Each sequence's pages (int64 converted once when every entry fits int32). Must be
///     ``[len(seq_lens), max_blocks]``, axis by axis; only the first ``ceil(seq_lens[s] /
///     block_size)`` entries of a row are read, and each must name a page.
/// seq_lens : array_like of int, [n_seqs]
///     Each sequence's length in tokens.
/// seq_ids : array_like of int, [n_queries]
///     Each query's sequence, in ``0..n_seqs``.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position within its sequence, >= 0 (one integer for one query).
/// config : BlockSparseConfig, optional
///     The selection rule; None for ``BlockSparseConfig()``.
/// key_format, query_format : str, optional
///     The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
/// head_major : bool, default False
///     Rows as ``[n_kv_heads, n_queries, width]`` instead of ``[n_queries, n_kv_heads,
///     width]``.
/// physical : bool, default False
///     Page ids (through the block table) instead of logical block ids.
/// out : ndarray of int32, optional
///     ``out=`` reuses a buffer: exactly the result's shape, written in place and returned.
///     C-contiguous, writeable, aligned, native byte order, not overlapping any input or
///     page (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, n_kv_heads, width]
///     Each row's block ids (page ids with ``physical=True``), ascending, then -1
///     (``[n_kv_heads, n_queries, width]`` with ``head_major=True``).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``kv_cache`` is not 3-D, in
///     non-native byte order, or its pages are not ``config.block_size`` tokens;
///     ``block_table`` is not ``[len(seq_lens), max_blocks]``, too short for a sequence, a
///     read entry names no page, or an entry does not fit int32; ``seq_ids`` is not
///     ``[n_queries]`` or names no sequence; ``query_pos`` is negative or not
///     ``[n_queries]``; ``index_q`` is not 3-D or of another ``d``; a format name is
///     unknown; a tensor is on a GPU; ``out`` is refused (its shape, layout, read-only, or
///     overlapping an input).
/// TypeError
///     when a dtype does not fit (float64 pages, a raw view without ``key_format`` or with
///     another one, a float ``block_table``), ``config`` is not a BlockSparseConfig or
///     None, an argument is not an array, or ``out`` is not an int32 ndarray.
#[pyfunction]
#[pyo3(signature = (index_q, kv_cache, block_table, seq_lens, seq_ids, query_pos, config=None, *,
                    key_format=None, query_format=None, head_major=false, physical=false,
                    out=None))]
pub(super) fn block_sparse_select_paged<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    head_major: bool,
    physical: bool,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (cfg, layout) = (self::config(config)?, layout(head_major));
    let ids = if physical {
        BlockIds::Physical
    } else {
        BlockIds::Logical
    };
    let (q, [n, h, dq]) = queries(index_q, query_format.format_arg())?;
    let args = PagedArgs {
        kv_cache,
        block_table,
        seq_lens,
        seq_ids,
        query_pos,
    };
    let paged = Paged::new(
        args,
        &Named::known(PageLayoutName::Dense),
        key_format.format_arg(),
        (n, dq),
    )?;
    let raw = ndarrays(&[seq_lens, seq_ids, query_pos]);
    let arrays = [
        &[q.untyped()][..],
        &paged.untyped(),
        &raw.iter().collect::<Vec<_>>(),
    ]
    .concat();
    let out = S.output::<i32>(py, out, &rows_shape(n, h, cfg.width(), layout), &arrays)?;
    let inputs = PagedBlocks {
        q: q.encoded()?,
        n_queries: n,
        n_kv_heads: h,
        cache: paged.cache(),
        table: paged.table()?,
        seq_ids: &paged.seq_ids,
        query_pos: &paged.query_pos,
    };
    out.run(paged.work(n, h), |os| {
        block_sparse::select_paged_into(&inputs, &cfg, layout, ids, os)
    })
}
