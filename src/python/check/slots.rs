//! The DCP layouts a checker reads rows through: `GlobalSlots`, an
//! engine's block table mapping each rank's slots back to positions.
//!
//! Reads `block_table`, `block_size`, `block_stride_rows`, `dcp_size`,
//! `dcp_interleave` (and `rows` for `positions`). The rule: every count fits
//! int32, and the table is `[n_requests, max_blocks]` of int32.

use pyo3::prelude::*;

use crate::check::GlobalSlots;
use crate::python::args::{positions, Obj, Opt, I32_MAX, S};
use crate::python::errors::refuse;

/// How an engine wrote its rows as global cache slots (the ``slots=`` of the checkers).
///
/// ``GlobalSlots(block_table, req_ids, block_size, *, block_stride_rows=None,
/// prefill_req_ids=None, workspace_starts=None, dcp_size=None, dcp_interleave=None)``, as
/// vLLM's ``triton_convert_req_index_to_global_index`` does: position ``t`` of request ``r``
/// is slot ``block_table[r, t // block_size] * block_stride_rows + t % block_size``
/// (``block_stride_rows`` defaults to ``block_size``), and a prefill row
/// (``prefill_req_ids[row] >= 0``) holds ``workspace_starts[prefill_req_ids[row]] + t``
/// instead; ``-1`` stays padding. ``req_ids`` names each checked row's request.
/// MiniMax-M3's physical block ids are the case ``block_size=1``. The checkers read the
/// rows back through it; an entry naming no position of its request is reported as
/// ``not_in_table`` with the engine's value.
///
/// Decode context parallelism: with ``dcp_size > 1`` (tokens dealt to the ranks
/// ``dcp_interleave`` at a time), ``block_table`` is ``[dcp_size, n_requests,
/// max_blocks]``, one table per rank, and the rows checked are the ranks' rows side by side
/// (``np.concatenate(rank_rows, axis=1)``, ``[n_rows, dcp_size * topk]``): each rank keeps
/// only its own tokens, so only together are they the selection; each rank's part pads on
/// its own.
///
/// Parameters
/// ----------
/// block_table : array_like of int, [n_requests, max_blocks] or [dcp_size, n_requests, max_blocks]
///     Each request's pages, any integer dtype whose values fit int32 (copied once); 3-D
///     exactly when ``dcp_size > 1``. Any CPU DLPack tensor too.
/// req_ids : array_like of int, [n_rows]
///     The request of each checked row, every entry >= 0 and below ``n_requests``.
/// block_size : int
///     Tokens per page, 1 to 2**31 - 1.
/// block_stride_rows : int, optional
///     Slots from one page to the next, ``block_size`` (the default) to 2**31 - 1.
/// prefill_req_ids : array_like of int, [n_rows], optional
///     Per row, the index into ``workspace_starts`` of a prefill row, or negative for a
///     row read through ``block_table``. Given together with ``workspace_starts``.
/// workspace_starts : array_like of int, [n_prefill_requests], optional
///     Each prefill request's first workspace slot. Given together with
///     ``prefill_req_ids``.
/// dcp_size : int, optional
///     The decode-context-parallel ranks, 1 (the default) to 2**31 - 1.
/// dcp_interleave : int, optional
///     Tokens dealt to a rank at a time, 1 (the default) to 2**31 - 1.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``block_table`` is not 2-D
///     (``dcp_size = 1``) or 3-D with ``dcp_size`` tables, or holds a value outside int32;
///     ``block_size``, ``dcp_size`` (named as ``block_table``'s shape) or ``dcp_interleave``
///     is 0; ``block_stride_rows`` is below ``block_size`` (pages would overlap); a count
///     is negative or above 2**31 - 1; ``req_ids`` (or ``prefill_req_ids``,
///     ``workspace_starts``) is not 1-D or ``req_ids`` has a negative entry; only one of
///     ``prefill_req_ids`` and ``workspace_starts`` is given (``workspace_starts`` is
///     named); or a tensor is not on the CPU. ``req_ids`` and ``prefill_req_ids`` against
///     the rows and tables (one entry per row, naming a request that exists) are checked
///     by each call that reads rows.
/// TypeError
///     when an array holds no integers or a count is not an integer.
#[pyclass(name = "GlobalSlots", module = "kvselect", frozen)]
pub(super) struct PyGlobalSlots {
    block_table: Vec<i32>,
    req_ids: Vec<usize>,
    prefill_req_ids: Option<Vec<i64>>,
    workspace_starts: Vec<i64>,
    /// The map's scalars. Its slices are empty: never use it as a map, only
    /// through [`Self::map`], which fills them in.
    shape: GlobalSlots<'static>,
}

#[pymethods]
impl PyGlobalSlots {
    #[new]
    #[pyo3(signature = (block_table, req_ids, block_size, *, block_stride_rows=None,
                        prefill_req_ids=None, workspace_starts=None, dcp_size=None,
                        dcp_interleave=None))]
    fn new(
        block_table: &Obj<'_>,
        req_ids: &Obj<'_>,
        block_size: &Obj<'_>,
        block_stride_rows: Opt<'_, '_>,
        prefill_req_ids: Opt<'_, '_>,
        workspace_starts: Opt<'_, '_>,
        dcp_size: Opt<'_, '_>,
        dcp_interleave: Opt<'_, '_>,
    ) -> PyResult<Self> {
        let dcp_size = S.count_or(dcp_size, "dcp_size", I32_MAX, 1)?;
        let dcp_interleave = S.count_or(dcp_interleave, "dcp_interleave", I32_MAX, 1)?;
        let (t, shape) = S.input_dyn::<i32>(block_table, "block_table")?;
        let max_blocks = match (dcp_size, &shape[..]) {
            (1, [_, m]) => *m,
            (r, [ranks, _, m]) if r > 1 && *ranks == r => *m,
            _ => {
                let want = match dcp_size {
                    1 => "2-D [n_requests, max_blocks]".to_string(),
                    r => format!("3-D [dcp_size = {r}, n_requests, max_blocks]"),
                };
                let msg = format!("block_table must be {want}, got shape {shape:?}");
                return Err(refuse(S, "block_table", msg));
            }
        };
        let block_size = S.count(block_size, "block_size", I32_MAX)?;
        let stride = S.count_or(block_stride_rows, "block_stride_rows", I32_MAX, block_size)?;
        let shape = GlobalSlots {
            block_table: &[],
            max_blocks,
            block_size,
            stride,
            req_ids: &[],
            prefill_req_ids: None,
            workspace_starts: &[],
            dcp_size,
            dcp_interleave,
        };
        // A page of no tokens, overlapping pages, no rank (the table's own
        // shape is checked against the rows, call by call).
        GlobalSlots {
            max_blocks: 1,
            ..shape
        }
        .check(0)?;
        let vec_i64 = |o: Opt<'_, '_>, name| -> PyResult<Option<Vec<i64>>> {
            o.map(|o| Ok(S.input::<i64, 1>(o, name, "[n]")?.slice()?.to_vec()))
                .transpose()
        };
        let prefill = vec_i64(prefill_req_ids, "prefill_req_ids")?;
        let starts = vec_i64(workspace_starts, "workspace_starts")?;
        if prefill.is_some() != starts.is_some() {
            return Err(refuse(
                S,
                "workspace_starts",
                "prefill_req_ids and workspace_starts go together: pass both or neither",
            ));
        }
        Ok(PyGlobalSlots {
            block_table: t.slice()?.to_vec(),
            req_ids: positions(S, req_ids, "req_ids")?,
            prefill_req_ids: prefill,
            workspace_starts: starts.unwrap_or_default(),
            shape,
        })
    }

    /// The engine's ``rows`` read back through the map, as the checkers read them.
    ///
    /// Int64 row-relative positions of the rows' shape, ``-1`` for padding (any negative
    /// entry) and ``2**63 - 1`` (``i64::MAX``) for an entry that maps to no position of its
    /// row's request (a page outside its block table, an offset past the page, a prefill slot
    /// before its workspace start). Positions are not checked against any context.
    ///
    /// Parameters
    /// ----------
    /// rows : array_like of int, [n_rows, width]
    ///     Global slot ids, int32 or int64 (any integer dtype whose values fit int64), one row
    ///     per ``req_ids`` entry; with DCP the ranks' rows side by side (``width`` a multiple
    ///     of ``dcp_size``). Any CPU DLPack tensor too.
    /// out : ndarray of int64, [n_rows, width], optional
    ///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
    ///     aligned, native byte order, not overlapping ``rows`` (else refused, nothing
    ///     written).
    ///
    /// Returns
    /// -------
    /// ndarray of int64, [n_rows, width]
    ///     The row-relative positions.
    ///
    /// Raises
    /// ------
    /// SelectionError
    ///     (a ValueError; ``.argument`` names the argument) when ``rows`` is not 2-D or holds a
    ///     value outside int64, ``rows``' width is no multiple of ``dcp_size``, ``req_ids`` (or
    ///     ``prefill_req_ids``) does not have one entry per row, an entry of ``req_ids`` names
    ///     no request of ``block_table`` (or of ``prefill_req_ids`` no entry of
    ///     ``workspace_starts``), a tensor is not on the CPU, or ``out`` is refused (its
    ///     shape, layout, read-only, or overlapping ``rows``).
    /// TypeError
    ///     when ``rows`` holds no integers, or ``out`` is not an int64 ndarray.
    #[pyo3(signature = (rows, *, out=None))]
    fn positions<'py>(
        &self,
        py: Python<'py>,
        rows: &Obj<'py>,
        out: Opt<'_, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let r = S.input::<i64, 2>(rows, "rows", "[n_rows, width]")?;
        let [n, w] = r.shape;
        let map = self.map();
        map.check(n)?;
        if map.dcp_size > 1 && !w.is_multiple_of(map.dcp_size) {
            let msg = format!(
                "a DCP map reads the dcp_size = {} ranks' rows side by side: the rows' width \
                 ({w}) must be a multiple of it",
                map.dcp_size
            );
            return Err(refuse(S, "rows", msg));
        }
        let mut positions = S.output::<i64>(py, out, &[n, w], &[r.untyped()])?;
        let raw = r.slice()?;
        let inverse = map.inverse();
        let mut row = Vec::with_capacity(w);
        for (i, dst) in positions.slice()?.chunks_exact_mut(w.max(1)).enumerate().take(n) {
            inverse.to_relative(i, &raw[i * w..(i + 1) * w], &mut row);
            dst.iter_mut().zip(&row).for_each(|(d, &x)| *d = x.max(-1));
        }
        Ok(positions.finish().into_any())
    }

    fn __repr__(&self) -> String {
        let g = self.shape;
        format!(
            "GlobalSlots(<{} requests x {} blocks>, <{} rows>, block_size={}, \
             block_stride_rows={}, prefill={}, dcp_size={}, dcp_interleave={})",
            self.block_table.len() / (g.max_blocks * g.dcp_size).max(1),
            g.max_blocks,
            self.req_ids.len(),
            g.block_size,
            g.stride,
            self.prefill_req_ids.is_some(),
            g.dcp_size,
            g.dcp_interleave
        )
    }
}

impl PyGlobalSlots {
    /// The DCP width: how many ranks' rows sit side by side in a row.
    pub(super) fn dcp_size(&self) -> usize {
        self.shape.dcp_size
    }

    fn map(&self) -> GlobalSlots<'_> {
        GlobalSlots {
            block_table: &self.block_table,
            req_ids: &self.req_ids,
            prefill_req_ids: self.prefill_req_ids.as_deref(),
            workspace_starts: &self.workspace_starts,
            ..self.shape
        }
    }
}

/// The `slots` argument: `None` (row-relative) or a `GlobalSlots`.
pub(super) fn global_slots<'a>(
    obj: &'a Option<Bound<'_, PyGlobalSlots>>,
) -> Option<GlobalSlots<'a>> {
    obj.as_ref().map(|g| g.get().map())
}
