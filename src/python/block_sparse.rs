//! Block-sparse selection (MiniMax-M3): the config, the single, batched,
//! packed and paged selections, and the positions a selection covers
//! (every one raises `SelectionError`).

use numpy::{PyArray1, PyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyType};

use super::args::{
    ndarrays, non_negative, positions, positions_along, query_positions_for, type_name, Args,
    EncodedIn, Obj, Opt, I32,
};
use super::cache::{Paged, PagedArgs};
use super::errors::{refuse, Domain};
use crate::block_sparse::{self, BlockIds, BlockSparseConfig, OutLayout, PagedBlocks};

const S: Args = Args(Domain::Selection);
/// Counts past i32 cannot be honoured by an int32 output anyway.
const I32_MAX: u64 = i32::MAX as u64;

/// How many blocks a query may see, and which are free.
///
/// ``BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)``.
/// Immutable, compares by value, hashable. Building one refuses a config that can select
/// nothing (block_size 0, or top_blocks 0 with no forced block), since an empty selection is
/// a NaN downstream. The released MiniMax-M3 checkpoint uses top_blocks=16, init_blocks=0,
/// local_blocks=1. Rows of a selection are ``width = max(top_blocks, init_blocks +
/// local_blocks)`` wide.
///
/// Parameters
/// ----------
/// block_size : int, default 128
///     Tokens per block (128 for a real checkpoint; also the KV page size), at least 1.
/// top_blocks : int, default 32
///     Total blocks visible per query, forced ones counted.
/// init_blocks : int, default 1
///     Blocks at the start of the sequence that are always visible.
/// local_blocks : int, default 2
///     Blocks nearest the query that are always visible. Every field is a non-negative
///     integer, at most 2**31 - 1 (None takes the default).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the field) when a field is negative or past
///     2**31 - 1, ``block_size`` is 0, or ``top_blocks`` is 0 with ``init_blocks`` and
///     ``local_blocks`` both 0 (``.argument`` is ``top_blocks``).
/// TypeError
///     when a field is not an integer (or None).
#[pyclass(name = "BlockSparseConfig", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PyBlockSparseConfig(BlockSparseConfig);

#[pymethods]
impl PyBlockSparseConfig {
    #[new]
    #[pyo3(
        signature = (block_size=None, top_blocks=None, init_blocks=None, local_blocks=None),
        text_signature = "(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)"
    )]
    fn new(
        block_size: Opt<'_, '_>,
        top_blocks: Opt<'_, '_>,
        init_blocks: Opt<'_, '_>,
        local_blocks: Opt<'_, '_>,
    ) -> PyResult<Self> {
        let d = BlockSparseConfig::default();
        let field = |obj: Opt, name, default| S.count_or(obj, name, I32_MAX, default);
        Ok(PyBlockSparseConfig(BlockSparseConfig::new(
            field(block_size, "block_size", d.block_size)?,
            field(top_blocks, "top_blocks", d.top_blocks)?,
            field(init_blocks, "init_blocks", d.init_blocks)?,
            field(local_blocks, "local_blocks", d.local_blocks)?,
        )?))
    }

    /// Tokens per block (128 for a real checkpoint; also the KV page size).
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }

    /// Total blocks visible per query, forced ones counted.
    #[getter]
    fn top_blocks(&self) -> usize {
        self.0.top_blocks
    }

    /// Blocks at the start of the sequence that are always visible.
    #[getter]
    fn init_blocks(&self) -> usize {
        self.0.init_blocks
    }

    /// Blocks nearest the query that are always visible.
    #[getter]
    fn local_blocks(&self) -> usize {
        self.0.local_blocks
    }

    /// The fixed width of an output row: max(top_blocks, init_blocks + local_blocks).
    #[getter]
    fn width(&self) -> usize {
        self.0.width()
    }

    fn __repr__(&self) -> String {
        let c = self.0;
        format!(
            "BlockSparseConfig(block_size={}, top_blocks={}, init_blocks={}, local_blocks={})",
            c.block_size, c.top_blocks, c.init_blocks, c.local_blocks
        )
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (Bound<'py, PyType>, (usize, usize, usize, usize)) {
        let c = slf.get().0;
        let fields = (c.block_size, c.top_blocks, c.init_blocks, c.local_blocks);
        (slf.get_type(), fields)
    }
}

/// The `config` argument: a `BlockSparseConfig`, or None for the defaults.
pub(super) fn config(obj: Opt<'_, '_>) -> PyResult<BlockSparseConfig> {
    let Some(c) = obj else {
        return Ok(BlockSparseConfig::default());
    };
    let wrong = |_| {
        let got = type_name(c);
        PyTypeError::new_err(format!(
            "config must be a kvselect.BlockSparseConfig or None, got {got}"
        ))
    };
    c.cast::<PyBlockSparseConfig>()
        .map(|c| c.get().0)
        .map_err(wrong)
}

/// The output layout `head_major` asks for.
fn layout(head_major: bool) -> OutLayout {
    match head_major {
        true => OutLayout::HeadMajor,
        false => OutLayout::QueryMajor,
    }
}

/// `[n_queries, n_kv_heads, width]`, or head-major `[n_kv_heads, n_queries, width]`.
fn rows_shape(n: usize, h: usize, w: usize, layout: OutLayout) -> Vec<usize> {
    match layout {
        OutLayout::QueryMajor => vec![n, h, w],
        OutLayout::HeadMajor => vec![h, n, w],
    }
}

/// `index_q` `[n_queries, n_kv_heads, d]` in its format, with `[n, h, d]`.
fn queries<'py>(
    index_q: &Obj<'py>,
    format: Option<&str>,
) -> PyResult<(EncodedIn<'py>, [usize; 3])> {
    let (q, _) = EncodedIn::new(S, index_q, "index_q", ("query_format", format))?;
    let dims = S.dims::<3>(q.untyped(), "index_q", "[n_queries, n_kv_heads, d]")?;
    Ok((q, dims))
}

/// `index_k` `[n_positions, d]` in its format, with `d`.
fn index_keys<'py>(index_k: &Obj<'py>, format: Option<&str>) -> PyResult<(EncodedIn<'py>, usize)> {
    let (k, _) = EncodedIn::new(S, index_k, "index_k", ("key_format", format))?;
    let [_, d] = S.dims::<2>(k.untyped(), "index_k", "[n_positions, d]")?;
    Ok((k, d))
}

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
/// them gets its forced blocks, then the lowest ids.
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
fn block_sparse_select<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    head_major: bool,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (cfg, layout) = (self::config(config)?, layout(head_major));
    let (q, q_shape) = EncodedIn::new(S, index_q, "index_q", ("query_format", query_format))?;
    let (k, d) = index_keys(index_k, key_format)?;
    if let Some(&dq) = q_shape.last().filter(|_| matches!(q_shape.len(), 2 | 3)) {
        S.same_d(dq, d, "index_k")?;
    }
    let (n, h, pos) = match q_shape[..] {
        [h, _] => (1, h, vec![single_position(query_pos)?]),
        [n, h, _] => (n, h, query_positions_for(S, query_pos, n)?),
        _ => {
            let msg = format!(
                "index_q must be [n_kv_heads, d] (one query) or [n_queries, n_kv_heads, d], got {}-D",
                q_shape.len()
            );
            return Err(refuse(Domain::Selection, "index_q", msg));
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

/// Every row's exact block scores: the values block selection ranks, bit for bit.
///
/// Entry ``b`` of a row is the max of ``q . k`` over block ``b``'s visible positions
/// (``-inf`` when all are NaN), NaN past the row's visible blocks; ``n_blocks =
/// ceil(n_positions / config.block_size)``. Their error scales are
/// :func:`block_magnitudes`.
///
/// Parameters
/// ----------
/// index_q : array_like, [n_queries, n_kv_heads, d]
///     The indexer queries (one query is ``index_q[None]``), in the formats of
///     :func:`block_sparse_select`. Any CPU DLPack tensor too.
/// index_k : array_like, [n_positions, d]
///     The index keys, formats as :func:`block_sparse_select`.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position, >= 0 (one integer for one query).
/// config : BlockSparseConfig, optional
///     The selection rule; None for ``BlockSparseConfig()``.
/// key_format, query_format : str, optional
///     The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
/// out : ndarray of float32, [n_queries, n_kv_heads, n_blocks], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_kv_heads, n_blocks]
///     The block scores, NaN past each row's visible blocks.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``index_q`` is not 3-D or its
///     ``d`` is not ``index_k``'s (``index_q``); ``index_k`` is not 2-D; ``d`` is 0;
///     ``query_pos`` is negative or not ``[n_queries]`` (one integer only for one query); a
///     format name is unknown; a tensor is on a GPU; ``out`` is refused (its shape, layout,
///     read-only, or overlapping an input).
/// TypeError
///     when an array's dtype is no key format, ``query_pos`` is not integers, ``config`` is
///     not a BlockSparseConfig or None, an argument is not an array, or ``out`` is not a
///     float32 ndarray.
#[pyfunction]
#[pyo3(signature = (index_q, index_k, query_pos, config=None, *, key_format=None,
                    query_format=None, out=None))]
fn block_scores<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let formats = (key_format, query_format);
    block_values(
        py,
        (index_q, index_k, query_pos),
        config,
        formats,
        out,
        false,
    )
}

/// The error scale of every :func:`block_scores` entry.
///
/// Entry ``b`` is the max over block ``b``'s visible positions of ``sum_i |q_i * k_i|``:
/// the ``magnitudes`` of :func:`check_blocks` (its ``rtol`` multiplies them). Arguments,
/// shape and NaN padding as :func:`block_scores`.
///
/// Parameters
/// ----------
/// index_q : array_like, [n_queries, n_kv_heads, d]
///     The indexer queries, formats as :func:`block_sparse_select`. Any CPU DLPack tensor
///     too.
/// index_k : array_like, [n_positions, d]
///     The index keys, formats as :func:`block_sparse_select`.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position, >= 0 (one integer for one query).
/// config : BlockSparseConfig, optional
///     The selection rule; None for ``BlockSparseConfig()``.
/// key_format, query_format : str, optional
///     The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
/// out : ndarray of float32, [n_queries, n_kv_heads, n_blocks], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_kv_heads, n_blocks]
///     The magnitudes, NaN past each row's visible blocks.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`block_scores`: ``index_q``
///     not 3-D or of another ``d`` (``index_q``), ``index_k`` not 2-D, ``d`` 0,
///     ``query_pos`` negative or not ``[n_queries]``, an unknown format name, a GPU tensor,
///     a refused ``out``.
/// TypeError
///     when an array's dtype is no key format, ``query_pos`` is not integers, ``config`` is
///     not a BlockSparseConfig or None, an argument is not an array, or ``out`` is not a
///     float32 ndarray.
#[pyfunction]
#[pyo3(signature = (index_q, index_k, query_pos, config=None, *, key_format=None,
                    query_format=None, out=None))]
fn block_magnitudes<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let formats = (key_format, query_format);
    block_values(
        py,
        (index_q, index_k, query_pos),
        config,
        formats,
        out,
        true,
    )
}

/// The body of :func:`block_scores` and :func:`block_magnitudes`.
fn block_values<'py>(
    py: Python<'py>,
    (index_q, index_k, query_pos): (&Obj<'py>, &Obj<'py>, &Obj<'py>),
    config: Opt<'_, 'py>,
    (key_format, query_format): (Option<&str>, Option<&str>),
    out: Opt<'_, 'py>,
    magnitudes: bool,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let cfg = self::config(config)?;
    let (q, [n, h, dq]) = queries(index_q, query_format)?;
    let (k, d) = index_keys(index_k, key_format)?;
    S.same_d(dq, d, "index_k")?;
    let pos = query_positions_for(S, query_pos, n)?;
    let n_keys = k.untyped().shape()[0];
    let shape = [n, h, n_keys.div_ceil(cfg.block_size.max(1))];
    let raw = ndarrays(&[query_pos]);
    let arrays = [
        &[q.untyped(), k.untyped()][..],
        &raw.iter().collect::<Vec<_>>(),
    ]
    .concat();
    let out = S.output::<f32>(py, out, &shape, &arrays)?;
    let (qs, ks) = (q.encoded()?, k.encoded()?);
    out.run(qs.len().saturating_add(ks.len()), |os| {
        block_sparse::block_scores_into(qs, n, h, ks, d, &pos, &cfg, magnitudes, os)
    })
}

/// With a 2-D `index_q` (one query), `query_pos` is one integer.
fn single_position(query_pos: &Obj) -> PyResult<usize> {
    let query_pos = &S.arg(query_pos, "query_pos")?;
    let array_like = query_pos
        .cast::<PyUntypedArray>()
        .is_ok_and(|a| a.ndim() > 0)
        || query_pos.cast::<PyList>().is_ok()
        || query_pos.cast::<PyTuple>().is_ok();
    if array_like {
        return Err(refuse(
            Domain::Selection,
            "query_pos",
            "with a 2-D index_q (one query), query_pos must be one integer; pass a 3-D \
             index_q [n_queries, n_kv_heads, d] for a batch",
        ));
    }
    S.count(query_pos, "query_pos", i64::MAX as u64)
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
fn block_sparse_select_packed<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    cu_seqlens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    head_major: bool,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (cfg, layout) = (self::config(config)?, layout(head_major));
    let (q, [n, h, dq]) = queries(index_q, query_format)?;
    let (k, d) = index_keys(index_k, key_format)?;
    S.same_d(dq, d, "index_k")?;
    let cu = positions(S, cu_seqlens, "cu_seqlens")?;
    let (sid, pos) = (
        positions_along(S, seq_ids, "seq_ids", ("n_queries", n))?,
        query_positions_for(S, query_pos, n)?,
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
fn block_sparse_select_paged<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
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
    let (q, [n, h, dq]) = queries(index_q, query_format)?;
    let args = PagedArgs {
        kv_cache,
        block_table,
        seq_lens,
        seq_ids,
        query_pos,
    };
    let paged = Paged::new(args, "dense", key_format, (n, dq))?;
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

/// The positions a block selection covers, int32, ascending and causally clipped.
///
/// Block ``b`` contributes ``b*bs .. min((b+1)*bs, n_positions, query_pos + 1)``; negative
/// entries (padding) are skipped. 1-D ``blocks`` with an int ``query_pos`` and
/// ``n_positions``: the positions, as long as they are. Batched, in one call: ``blocks
/// [rows, width]``, or a selection's ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads,
/// n_queries, width]`` with ``head_major=True``), gives fixed-width rows ``[..., width *
/// block_size]``, ascending then -1 (what :func:`sparse_attention` takes).
///
/// Parameters
/// ----------
/// blocks : array_like of int32, [width], [rows, width] or [n_queries, n_kv_heads, width]
///     Block ids, negative entries padding (a selection's rows as they come).
/// query_pos, n_positions : int or array_like of int, [rows] or [n_queries]
///     The query's position and the sequence length: an int (every row's), or, batched,
///     one entry per row (2-D) or per query (3-D). The 1-D form takes ints.
/// config : BlockSparseConfig, optional
///     Its ``block_size`` (``bs``); None for ``BlockSparseConfig()``.
/// head_major : bool, default False
///     3-D ``blocks`` are ``[n_kv_heads, n_queries, width]``.
/// out : ndarray of int32, [..., width * block_size], optional
///     Batched only (the 1-D form takes no ``out=``): exactly that shape, written in place
///     and returned. C-contiguous, writeable, aligned, native byte order, overlapping no
///     input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_covered] (1-D ``blocks``) or [..., width * block_size]
///     The covered positions, ascending (batched rows then -1).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``blocks`` is not 1-D, 2-D or
///     3-D, or a covered position would not fit int32; ``query_pos`` / ``n_positions`` is
///     negative, or neither an int nor one entry per row / per query (axis 1 when
///     head-major); ``out`` is given with 1-D ``blocks``, or is refused (its shape,
///     layout, read-only, or overlapping an input).
/// TypeError
///     when ``blocks`` or a position is not integers, ``config`` is not a BlockSparseConfig
///     or None, or ``out`` is not an int32 ndarray.
#[pyfunction]
#[pyo3(signature = (blocks, query_pos, n_positions, config=None, *, head_major=false, out=None))]
fn positions_of_blocks<'py>(
    py: Python<'py>,
    blocks: &Obj<'py>,
    query_pos: &Obj<'py>,
    n_positions: &Obj<'py>,
    config: Opt<'_, 'py>,
    head_major: bool,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let (cfg, layout) = (self::config(config)?, layout(head_major));
    let (b, shape) = S.input_dyn::<i32>(blocks, "blocks")?;
    let (n, h, w) = match (&shape[..], layout) {
        ([_], _) if out.is_some() => {
            let msg = "out= needs batched blocks (2-D or 3-D): the 1-D form's length depends \
                       on the blocks";
            return Err(refuse(Domain::Selection, "out", msg));
        }
        ([_], _) => {
            let query_pos = S.count(query_pos, "query_pos", u64::MAX)?;
            let n_positions = S.count(n_positions, "n_positions", u64::MAX)?;
            let v =
                block_sparse::positions_of_blocks_i32(b.slice()?, query_pos, n_positions, &cfg)?;
            return Ok(PyArray1::from_vec(py, v).into_any());
        }
        (&[rows, w], _) => (rows, 1, w),
        (&[n, h, w], OutLayout::QueryMajor) | (&[h, n, w], OutLayout::HeadMajor) => (n, h, w),
        _ => {
            let msg = format!(
                "blocks must be 1-D [width], 2-D [rows, width] or 3-D [n_queries, n_kv_heads, width], got {}-D",
                shape.len()
            );
            return Err(refuse(Domain::Selection, "blocks", msg));
        }
    };
    let axis = (
        if shape.len() == 2 {
            "rows"
        } else {
            "n_queries"
        },
        n,
    );
    let qp = per_query(query_pos, "query_pos", axis)?;
    let np = per_query(n_positions, "n_positions", axis)?;
    let mut out_shape = shape.clone();
    out_shape[shape.len() - 1] = w.saturating_mul(cfg.block_size);
    let raw = ndarrays(&[query_pos, n_positions]);
    let arrays = [&[b.untyped()][..], &raw.iter().collect::<Vec<_>>()].concat();
    // SAFETY: positions_of_blocks_batch_into writes every slot of `out`
    // when it succeeds, and a refused call's array is never handed back.
    let out = unsafe { S.output_filled_by_core(py, out, &out_shape, &arrays)? };
    let bs = b.slice()?;
    let res = out.run(bs.len(), |os| {
        block_sparse::positions_of_blocks_batch_into(bs, n, h, w, layout, &qp, &np, &cfg, os)
    })?;
    Ok(res.into_any())
}

/// An int (every row's), or a 1-D array of one entry per query (or row),
/// `axis`: exactly `[axis]` (a `[1]` array is every row's, as an int).
fn per_query(obj: &Obj<'_>, name: &str, axis: (&str, usize)) -> PyResult<Vec<usize>> {
    let obj = &S.arg(obj, name)?;
    match obj.cast::<PyUntypedArray>().map(|a| a.ndim()) {
        Ok(0) | Err(_) if obj.cast::<PyList>().is_err() && obj.cast::<PyTuple>().is_err() => {
            Ok(vec![S.count(obj, name, u64::MAX)?])
        }
        _ => {
            let (p, shape) = S.input_dyn::<i64>(obj, name)?;
            if shape != [1] {
                S.axes(name, &shape, &[axis])?;
            }
            non_negative(S, p.slice()?, name)
        }
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MINIMAX_BLOCK_SIZE", block_sparse::MINIMAX_BLOCK_SIZE)?;
    m.add_class::<PyBlockSparseConfig>()?;
    m.add_function(wrap_pyfunction!(block_sparse_select, m)?)?;
    m.add_function(wrap_pyfunction!(block_sparse_select_packed, m)?)?;
    m.add_function(wrap_pyfunction!(block_sparse_select_paged, m)?)?;
    m.add_function(wrap_pyfunction!(positions_of_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(block_scores, m)?)?;
    m.add_function(wrap_pyfunction!(block_magnitudes, m)?)?;
    Ok(())
}
