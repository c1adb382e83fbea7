//! The checkers: an engine's rows judged by the rule (raising
//! `SelectionError` on a refused call, `WitnessError` for the witness check); every report is plain Python data,
//! JSON-ready, in one shape: `rows`, `correct`, `wrong`, `by_reason`,
//! `details`.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::{detach, positions, Args, Floats, Obj, Opt};
use super::block_sparse::config;
use super::errors::{refuse, Domain, Witness};
use crate::check::WITNESS_REASONS;
use crate::check::{self, Batch, Filler, GlobalSlots, RowCheck, Rule, Tolerance};

/// A report, as a dict.
type PyReport<'py> = Bound<'py, PyDict>;

const S: Args = Args(Domain::Selection);
const W: Args = Args(Domain::Witness);
const I32_MAX: u64 = i32::MAX as u64;

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
                return Err(refuse(Domain::Selection, "block_table", msg));
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
                Domain::Selection,
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
    ///     ``workspace_starts``), or a tensor is not on the CPU.
    /// TypeError
    ///     when ``rows`` holds no integers.
    fn positions<'py>(&self, py: Python<'py>, rows: &Obj<'py>) -> PyResult<Bound<'py, PyAny>> {
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
            return Err(refuse(Domain::Selection, "rows", msg));
        }
        let raw = r.slice()?;
        let inverse = map.inverse();
        let mut out = Vec::with_capacity(n * w);
        let mut row = Vec::with_capacity(w);
        for i in 0..n {
            inverse.to_relative(i, &raw[i * w..(i + 1) * w], &mut row);
            out.extend(row.iter().map(|&x| x.max(-1)));
        }
        let flat = numpy::PyArray1::from_vec(py, out);
        flat.call_method1("reshape", ((n, w),))
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
fn global_slots<'a>(obj: &'a Option<Bound<'_, PyGlobalSlots>>) -> Option<GlobalSlots<'a>> {
    obj.as_ref().map(|g| g.get().map())
}

/// Whether each of an engine's top-k rows is a correct selection of its row's exact scores.
///
/// A correct row has its valid entries first, distinct, causal (``0 <= x < L``), exactly
/// ``min(topk, L)`` of them, and every selected position scoring at least every unselected
/// one — up to ``e_t = atol + rtol * magnitudes[t]`` on each side, so a tie within the
/// engine's rounding is never an error (rows may be in any order; ties at the threshold
/// broken any way). With ``atol = rtol = 0`` the check is exact.
///
/// ``filler`` states how the engine fills a row that sees fewer than ``topk`` positions
/// (and pads in general); the entries it names are ignored, and a correct row still holds
/// exactly ``min(topk, L)`` distinct valid entries: ``"-1"`` (the default) — negative
/// entries are padding and come after the valid ones; ``"past_context"`` (transformers'
/// DeepSeek-V3.2-family DSA modules, whose ``torch.topk`` over masked scores fills with
/// masked future positions) — an entry at or past the row's context ``L``, or negative, is
/// filler wherever it sits (with ``slots``, an entry naming no position of its request is
/// still ``not_in_table``); ``"repeat"`` — an entry equal to an earlier valid entry of the
/// row is filler wherever it sits, negative ones padding as with ``"-1"`` (a row that
/// repeats instead of selecting is short: ``wrong_count``). DCP rows (``slots`` with
/// ``dcp_size > 1``) pad anywhere under every rule.
///
/// Parameters
/// ----------
/// scores : array_like of float32 or float64, [n_rows, n_positions]
///     Each row's exact scores, read as given: e.g. :func:`indexer_scores`, or
///     float64-exact scores; any other dtype is a ``TypeError``.
/// rows : array_like of int32 or int64, [n_rows, width]
///     The engine's rows (e.g. :func:`indexer_topk`; top-k rows are always 2-D, one per
///     query), negative entries padding, row-relative or (``slots=GlobalSlots(...)``)
///     global slot ids. Any integer dtype whose values fit int64 converts once.
/// context_lens : array_like of int, [n_rows], optional
///     Each row's context ``L``, 0 to ``n_positions`` (default: every position; for the
///     indexer, ``min(query_pos + 1, n_keys)``).
/// topk : int, optional
///     The selection size, at most ``width``; defaults to ``width`` (a rank's width with
///     DCP slots).
/// atol, rtol : float, optional
///     The tolerance ``e_t = atol + rtol * magnitudes[t]``, finite and >= 0 (default 0);
///     ``rtol > 0`` needs ``magnitudes``.
/// magnitudes : array_like of float, [n_rows, n_positions], optional
///     Each score's magnitude (float32 or float64; another float dtype converts to
///     float32), the shape of ``scores`` axis by axis; every entry within a row's context a
///     number >= 0 (NaN past it is never read).
/// slots : GlobalSlots, optional
///     How to read global slot ids back to positions; None (the default) for row-relative
///     rows.
/// filler : str, optional
///     ``"-1"`` (the default), ``"past_context"`` or ``"repeat"`` (above).
///
/// Returns
/// -------
/// dict
///     ``rows``, ``correct``, ``wrong``, ``by_reason`` (rows per reason: ``padding_hole``,
///     ``duplicate``, ``not_causal``, ``not_in_table``, ``wrong_count``,
///     ``wrong_selection``) and ``details``, one entry per wrong row: its ``row`` and
///     ``problems`` (each a dict with its ``reason``; a wrong selection lists the
///     ``dropped`` and ``intruders`` as ``(position, score)``, their counts, the row's exact
///     ``threshold`` (scores and threshold are the input's own values, as Python floats)
///     and the ``margin`` by which it is wrong; with ``slots``, a ``not_causal`` entry also
///     carries the engine's ``value``, the slot id it wrote). A row's entries past its
///     context are one ``not_causal`` problem (the first ``slot`` and ``position``,
///     ``n_slots`` such entries, the row's ``context``), its repeats one ``duplicate`` (the
///     first, and ``n_slots``). Plain Python data, JSON-ready. A wrong entry (a huge or
///     future position, a slot of no page) is reported, never refused.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``filler`` is not one of the
///     three rules; ``scores`` or ``rows`` is not 2-D; ``scores``, ``rows`` and
///     ``context_lens`` do not count the same rows (the one that disagrees is named);
///     ``context_lens`` has an entry that is negative or above ``n_positions``; ``topk`` is
///     negative or above ``width``; ``atol`` or ``rtol`` is negative or not finite;
///     ``rtol > 0`` without ``magnitudes``; ``magnitudes`` has another shape or a NaN or
///     negative entry within a row's context; ``slots`` does not describe the rows
///     (``req_ids``, ``prefill_req_ids``, the DCP width); or a tensor is not on the CPU.
/// TypeError
///     when ``scores`` is not float32 or float64 (float16 included), ``rows`` or
///     ``context_lens`` holds no integers, ``magnitudes`` no floats, ``topk`` is not an
///     integer, ``atol`` or ``rtol`` not a number, ``slots`` not a ``GlobalSlots`` or
///     ``filler`` not a string.
#[pyfunction]
#[pyo3(signature = (scores, rows, context_lens=None, *, topk=None, atol=0.0, rtol=0.0,
                    magnitudes=None, slots=None, filler="-1"))]
#[allow(clippy::too_many_arguments)]
fn check_topk<'py>(
    py: Python<'py>,
    scores: &Obj<'py>,
    rows: &Obj<'py>,
    context_lens: Opt<'_, 'py>,
    topk: Opt<'_, 'py>,
    atol: f64,
    rtol: f64,
    magnitudes: Opt<'_, 'py>,
    slots: Option<Bound<'py, PyGlobalSlots>>,
    filler: &str,
) -> PyResult<PyReport<'py>> {
    let filler = Filler::from_name(filler).ok_or_else(|| {
        let msg = format!(
            "filler must be one of {}, got {filler:?}",
            Filler::NAMES.map(|n| format!("{n:?}")).join(", ")
        );
        refuse(Domain::Selection, "filler", msg)
    })?;
    let r = S.input::<i64, 2>(rows, "rows", "[n_rows, width]")?;
    // DCP rows are the ranks' rows side by side: by default, each rank's width.
    let width = r.shape[1] / slots.as_ref().map_or(1, |g| g.get().shape.dcp_size);
    let topk = S.count_or(topk, "topk", u64::MAX, width)?;
    let (s, shape) = S.floats(scores, "scores", true)?;
    let [n, t] = shape[..] else {
        let msg = format!(
            "scores must be 2-D [n_rows, n_positions], got {}-D",
            shape.len()
        );
        return Err(refuse(Domain::Selection, "scores", msg));
    };
    let lens = match context_lens {
        None => vec![t; n],
        Some(c) => positions(S, c, "context_lens")?,
    };
    blame_row_counts("scores", n, r.shape[0], lens.len(), Rule::Topk(topk))?;
    let rows = Rows {
        rows: r.slice()?,
        width: r.shape[1],
    };
    let axes = [("n_rows", n), ("n_positions", t)];
    let tol = Tolerance { atol, rtol };
    let scored = (s.values()?, &axes[..], magnitudes);
    let rule = (Rule::Topk(topk), filler);
    run(py, rule, tol, scored, rows, &lens, &slots)
}

/// Whether each of an engine's block-selection rows (MiniMax-M3) is correct under ``config``.
///
/// A correct row has every forced block (the first ``init_blocks``, the newest
/// ``local_blocks``) present, exactly ``min(max(top_blocks, #forced), n)`` distinct blocks
/// ``0 <= b < n`` (``n`` the blocks the query sees), valid entries first, and every chosen
/// free block scoring at least every rejected free one up to the tolerance of
/// :func:`check_topk`. Rows are in any order, logical ids or (``slots``) physical ones;
/// int32 or int64.
///
/// Two forms, one meaning (a row per (query, KV head)):
///
/// - 3-D, what :func:`block_scores` and :func:`block_sparse_select` give: ``block_scores``
///   float32 ``[n_queries, n_kv_heads, n_blocks]``, ``rows`` ``[n_queries, n_kv_heads,
///   width]`` (or, with ``head_major=True``, the engines' ``[n_kv_heads, n_queries,
///   width]``), ``visible_blocks`` ``[n_queries]`` (every KV head of a query sees the same
///   blocks); the report's row ``i * n_kv_heads + h`` is query ``i``, head ``h`` in either
///   layout.
/// - 2-D: ``block_scores`` ``[n_rows, n_blocks]``, ``rows`` ``[n_rows, width]``,
///   ``visible_blocks`` ``[n_rows]`` (the 3-D form reshaped, or the 2-D ``index_q`` form's
///   ``[n_kv_heads, ...]``).
///
/// Parameters
/// ----------
/// block_scores : array_like of float, [n_queries, n_kv_heads, n_blocks] or [n_rows, n_blocks]
///     Each row's block scores, read as float32 (other floats convert once).
/// rows : array_like of int32 or int64, [n_queries, n_kv_heads, width] or [n_rows, width]
///     The engine's block rows, of ``block_scores``' form; negative entries padding. Any
///     integer dtype whose values fit int64 converts once.
/// visible_blocks : array_like of int, [n_queries] or [n_rows]
///     The blocks each query sees, 0 to ``n_blocks``.
/// config : BlockSparseConfig, optional
///     The selection rule (None: the defaults); rows must hold ``config.width`` blocks.
/// atol, rtol : float, optional
///     The tolerance, as for :func:`check_topk`: finite and >= 0 (default 0); ``rtol > 0``
///     needs ``magnitudes``.
/// magnitudes : array_like of float, optional
///     The shape of ``block_scores``, axis by axis, as for :func:`check_topk`.
/// slots : GlobalSlots, optional
///     How to read physical block ids back to logical ones; None for logical rows.
/// head_major : bool, optional
///     3-D rows are ``[n_kv_heads, n_queries, width]`` (default False).
///
/// Returns
/// -------
/// dict
///     :func:`check_topk`'s report, with the reason ``missing_forced`` beside its others.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``rows`` is neither 2-D nor
///     3-D, or of another form than ``block_scores`` (3-D rows with 2-D scores name
///     ``rows``, else ``block_scores``); 3-D ``rows`` or ``visible_blocks`` do not match
///     the scores axis by axis (``visible_blocks`` is one count per query); 2-D row counts
///     disagree; ``head_major=True`` with 2-D rows; ``config`` is invalid or no row could
///     hold ``config.width`` blocks; ``visible_blocks`` has an entry that is negative or
///     above ``n_blocks``; ``atol``, ``rtol``, ``magnitudes`` or ``slots`` are refused as
///     by :func:`check_topk`; or a tensor is not on the CPU.
/// TypeError
///     when ``block_scores`` or ``magnitudes`` holds no floats, ``rows`` or
///     ``visible_blocks`` no integers, ``config`` is not a ``BlockSparseConfig`` or None
///     (a dict), ``slots`` not a ``GlobalSlots``, or ``head_major`` not a bool.
#[pyfunction]
#[pyo3(signature = (block_scores, rows, visible_blocks, config=None, *, atol=0.0, rtol=0.0,
                    magnitudes=None, slots=None, head_major=false))]
#[allow(clippy::too_many_arguments)]
fn check_blocks<'py>(
    py: Python<'py>,
    block_scores: &Obj<'py>,
    rows: &Obj<'py>,
    visible_blocks: &Obj<'py>,
    config: Opt<'_, 'py>,
    atol: f64,
    rtol: f64,
    magnitudes: Opt<'_, 'py>,
    slots: Option<Bound<'py, PyGlobalSlots>>,
    head_major: bool,
) -> PyResult<PyReport<'py>> {
    let cfg = self::config(config)?;
    let rule = Rule::Blocks(cfg);
    let tol = Tolerance { atol, rtol };
    let (r, rshape) = S.input_dyn::<i64>(rows, "rows")?;
    let (s, sshape) = S.input_dyn::<f32>(block_scores, "block_scores")?;
    let lens = positions(S, visible_blocks, "visible_blocks")?;
    // Either form ends in the one check (block rows pad with -1 only).
    let judge = |rows: Rows<'_>, lens: &[usize], axes: &[(&str, usize)]| {
        let scored = (check::Values::F32(s.slice()?), axes, magnitudes);
        run(
            py,
            (rule, Filler::MinusOne),
            tol,
            scored,
            rows,
            lens,
            &slots,
        )
    };
    match (&rshape[..], &sshape[..]) {
        (&[n_rows, width], &[n, t]) => {
            if head_major {
                let msg = "head_major=True describes 3-D rows [n_kv_heads, n_queries, width]; \
                           these rows are 2-D";
                return Err(refuse(Domain::Selection, "head_major", msg));
            }
            blame_row_counts("block_scores", n, n_rows, lens.len(), rule)?;
            let rows = Rows {
                rows: r.slice()?,
                width,
            };
            let axes = [("n_rows", n), ("n_blocks", t)];
            judge(rows, &lens, &axes)
        }
        (&[a, b, width], &[n, h, t]) => {
            let (nq, hkv) = if head_major { (b, a) } else { (a, b) };
            let want = [("n_queries", n), ("n_kv_heads", h), ("width", width)];
            let want_rows = if head_major {
                [want[1], want[0], want[2]]
            } else {
                want
            };
            S.axes("rows", &rshape, &want_rows)?;
            S.axes("visible_blocks", &[lens.len()], &[("n_queries", nq)])?;
            let lens: Vec<usize> = lens
                .iter()
                .flat_map(|&l| std::iter::repeat_n(l, hkv))
                .collect();
            let rs = r.slice()?;
            // Head-major rows, read query-major: one transposing copy.
            let transposed: Vec<i64>;
            let rows = if head_major {
                transposed = (0..nq * hkv)
                    .flat_map(|qh| {
                        let (i, hh) = (qh / hkv, qh % hkv);
                        let at = (hh * nq + i) * width;
                        rs[at..at + width].iter().copied()
                    })
                    .collect();
                &transposed[..]
            } else {
                rs
            };
            let rows = Rows { rows, width };
            let axes = [("n_queries", n), ("n_kv_heads", h), ("n_blocks", t)];
            judge(rows, &lens, &axes)
        }
        (&[_, _] | &[_, _, _], _) => {
            // The two forms do not mix: the 3-D one of the pair is out of place.
            let (name, msg) = if rshape.len() == 3 && sshape.len() == 2 {
                let msg = format!(
                    "rows are 3-D {rshape:?} but block_scores are 2-D {sshape:?}: \
                     pass both 3-D (as block_scores and block_sparse_select give them) or both 2-D"
                );
                ("rows", msg)
            } else {
                let msg = format!(
                    "block_scores must be {}-D like rows ({rshape:?}), got {sshape:?}",
                    rshape.len()
                );
                ("block_scores", msg)
            };
            Err(refuse(Domain::Selection, name, msg))
        }
        _ => {
            let msg = format!(
                "rows must be 2-D [n_rows, width] or 3-D [n_queries, n_kv_heads, width], \
                 got {rshape:?}"
            );
            Err(refuse(Domain::Selection, "rows", msg))
        }
    }
}

/// An engine's rows, read query-major: `[n_rows, width]`.
struct Rows<'a> {
    rows: &'a [i64],
    width: usize,
}

/// The shared body of the two score checks: arguments → core → report.
/// `scored` is the scores (`n_rows · n_candidates` of them, their shape's
/// `axes` named, last the candidates) and the `magnitudes` argument, which
/// must have that shape axis by axis; `lens` gives each row's context;
/// `rule` comes with the engine's filler.
fn run<'py>(
    py: Python<'py>,
    (rule, filler): (Rule, Filler),
    tol: Tolerance,
    (scores, axes, magnitudes): (check::Values<'_>, &[(&str, usize)], Opt<'_, 'py>),
    rows: Rows<'_>,
    lens: &[usize],
    slots: &Option<Bound<'py, PyGlobalSlots>>,
) -> PyResult<PyReport<'py>> {
    // Float64 magnitudes are read as they are; any other float converts to
    // float32.
    let m: Option<(Floats<'py>, Vec<usize>)> = magnitudes
        .map(|m| S.floats(m, "magnitudes", false))
        .transpose()?;
    if let Some((_, shape)) = &m {
        S.axes("magnitudes", shape, axes)?;
    }
    let t = axes.last().map_or(0, |a| a.1);
    let batch = Batch {
        scores,
        magnitudes: m.as_ref().map(|(m, _)| m.values()).transpose()?,
        n_positions: t,
        rows: rows.rows,
        width: rows.width,
        lens,
        global: global_slots(slots),
    };
    let checks = detach(py, batch.scores.len(), || {
        check::check_rows_with(&batch, rule, tol, filler)
    })?;
    report(py, &checks, rule.reasons())
}

/// Scores, rows and lengths must count the same rows; when one disagrees
/// with the other two, it is the one named (the lengths default to the
/// scores' count, so then the rows are).
fn blame_row_counts(
    scores: &str,
    n_scores: usize,
    n_rows: usize,
    n_lens: usize,
    rule: Rule,
) -> PyResult<()> {
    let (_, lens) = rule.names();
    let culprit = match (n_scores == n_rows, n_scores == n_lens, n_rows == n_lens) {
        (true, true, _) => return Ok(()),
        (true, false, _) => lens,
        (false, true, _) => "rows",
        (false, false, true) => scores,
        _ => "rows",
    };
    let msg = format!(
        "{scores} has {n_scores} rows, rows has {n_rows}, {lens} has {n_lens} entries: one each per row"
    );
    Err(refuse(Domain::Selection, culprit, msg))
}

/// Whether an engine's in-place witness call wrote exactly what the rule writes.
///
/// The call is vLLM's ``scatter_topology_witnesses_``. The witness rule is integer-exact,
/// so a row is correct iff it equals :func:`scatter_topology_witnesses` of ``before``; a
/// row that is not says which contract it breaks: ``prefix_changed`` (a slot before
/// ``topk - S`` is not the learned entry), ``wrong_witness`` (the slot, the witness the
/// rule writes there, what the engine wrote and why that is wrong), ``tail_changed`` (a
/// slot past the witnesses is not the learned entry).
///
/// This is the serving layout (``keep = max(topk - S, 0)``, ``S`` witnesses at most;
/// ``S = 0`` writes nothing), which for ``S >= 1`` is also
/// ``apply_topology_witnesses(before, context_lens, max(topk - S, 0), S, S)``. An
/// ``apply_topology_witnesses`` call with another ``learned_keep`` or ``max_replacements``
/// returns a new array from its inputs, so it is checked by equality:
/// ``np.array_equal(engine_out, apply_topology_witnesses(learned, context_lens,
/// learned_keep, S, max_replacements))``.
///
/// Parameters
/// ----------
/// before : array_like of int, [rows, topk]
///     The buffer before the call, int32 or int64 (any integer dtype whose values fit
///     int32). Any CPU DLPack tensor too.
/// after : array_like of int, [rows, topk]
///     The buffer after the call, of ``before``'s shape axis by axis (the same size in
///     another shape is another buffer).
/// context_lens : array_like of int, [rows]
///     Each row's length, values within int32; every row needs one, the off switch
///     included.
/// num_segments : int
///     The segment count ``S`` the engine was called with, 0 (off) to 64.
///
/// Returns
/// -------
/// dict
///     The report: ``rows``, ``correct``, ``wrong``, ``by_reason`` (rows per reason:
///     ``prefix_changed``, ``wrong_witness``, ``tail_changed``) and ``details`` (per wrong
///     row, its ``row`` and ``problems``), plain Python data.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument; refusals are ``WitnessError``, not
///     ``SelectionError``) when ``before`` or ``after`` is not 2-D or holds a value outside
///     int32, ``after`` has another shape than ``before``, ``context_lens`` is not
///     ``[rows]``, ``num_segments`` is negative or more than 64, or a tensor is not on the
///     CPU.
/// TypeError
///     when an array holds no integers or ``num_segments`` is not an integer.
#[pyfunction]
#[pyo3(signature = (before, after, context_lens, num_segments))]
fn check_witnesses<'py>(
    py: Python<'py>,
    before: &Obj<'py>,
    after: &Obj<'py>,
    context_lens: &Obj<'py>,
    num_segments: &Obj<'py>,
) -> PyResult<PyReport<'py>> {
    let b = W.input::<i32, 2>(before, "before", "[rows, topk]")?;
    let a = W.input::<i32, 2>(after, "after", "[rows, topk]")?;
    let [rows, topk] = b.shape;
    W.axes("after", &a.shape, &[("rows", rows), ("topk", topk)])?;
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    W.axes("context_lens", &lens.shape, &[("rows", rows)])?;
    let s = W.count(num_segments, "num_segments", u64::MAX)?;
    let (bs, as_, ls) = (b.slice()?, a.slice()?, lens.slice()?);
    let checks = detach(py, bs.len(), || {
        check::check_witness_rows(bs, as_, topk, ls, s)
    })
    .map_err(Witness)?;
    report(py, &checks, WITNESS_REASONS)
}

/// The report as plain Python data (dicts, lists, tuples, numbers).
fn report<'py>(
    py: Python<'py>,
    checks: &[RowCheck],
    reasons: &[&'static str],
) -> PyResult<PyReport<'py>> {
    let report = pythonize::pythonize(py, &check::Report::new(checks, reasons))?;
    Ok(report.cast_into::<PyDict>()?)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGlobalSlots>()?;
    m.add_function(wrap_pyfunction!(check_topk, m)?)?;
    m.add_function(wrap_pyfunction!(check_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(check_witnesses, m)?)?;
    Ok(())
}
