//! Block scores: the exact values block selection ranks, and the error
//! scale of each (what `check_blocks`' `rtol` multiplies).

use numpy::{PyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::config::config;
use super::inputs::{index_keys, queries};
use crate::block_sparse;
use crate::python::args::{
    ndarrays, query_positions, refuse_extra_keywords, AsFormatArg, Broadcast, FormatArg, KeyFormat,
    Named, Obj, Opt, Queries, QueryFormat, S,
};

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
#[pyo3(
    signature = (index_q, index_k, query_pos, config=None, *, key_format=None,
                 query_format=None, out=None, **renamed),
    text_signature = "(index_q, index_k, query_pos, config=None, *, key_format=None, \
                      query_format=None, out=None)"
)]
pub(super) fn block_scores<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    out: Opt<'_, 'py>,
    renamed: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let was = [(
        "magnitudes",
        "magnitudes=True is now its own function, block_magnitudes",
    )];
    refuse_extra_keywords("block_scores", renamed, &was)?;
    let formats = (key_format.format_arg(), query_format.format_arg());
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
pub(super) fn block_magnitudes<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let formats = (key_format.format_arg(), query_format.format_arg());
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
    (key_format, query_format): (FormatArg<'_>, FormatArg<'_>),
    out: Opt<'_, 'py>,
    magnitudes: bool,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let cfg = self::config(config)?;
    let (q, [n, h, dq]) = queries(index_q, query_format)?;
    let (k, d) = index_keys(index_k, key_format)?;
    S.same_d(dq, d, "index_k")?;
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::Along("n_queries", n),
        Broadcast::Refuse,
    )?;
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
