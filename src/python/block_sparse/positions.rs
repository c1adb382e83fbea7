//! The positions a block selection covers: a selection's rows mapped back
//! to token positions, ascending and causally clipped.

use numpy::PyArray1;
use pyo3::prelude::*;

use super::config::config;
use super::inputs::layout;
use crate::block_sparse::{self, OutLayout};
use crate::python::args::{ndarrays, query_positions, Broadcast, Obj, Opt, Queries, S};
use crate::python::errors::refuse;

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
pub(super) fn positions_of_blocks<'py>(
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
            return Err(refuse(S, "out", msg));
        }
        ([_], _) => {
            // The 1-D form is one row, whose position and length are counts
            // (Python ints), not a `query_pos` argument of queries.
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
                "blocks must be 1-D [width], 2-D [rows, width] or 3-D [n_queries, n_kv_heads, width], got {}-D {:?}",
                shape.len(),
                shape
            );
            return Err(refuse(S, "blocks", msg));
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
    let qp = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::Along(axis.0, axis.1),
        Broadcast::Allow,
    )?;
    let np = query_positions(
        S,
        n_positions,
        "n_positions",
        Queries::Along(axis.0, axis.1),
        Broadcast::Allow,
    )?;
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
