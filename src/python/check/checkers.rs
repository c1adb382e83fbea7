//! The checkers' entry points: `check_topk` (token top-k rows),
//! `check_blocks` (block rows) and `check_witnesses` (the serving layout's
//! witness slots).
//!
//! Reads an engine's rows, the scores (float32 or float64, never rounded),
//! the magnitudes, the contexts and `filler`. The rule: every array is
//! shaped axis by axis against the rows it describes, and a refused call
//! raises `SelectionError` (`WitnessError` for the witness check).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::run::{blame_row_counts, report, run, PyReport, Rows};
use super::slots::PyGlobalSlots;
use crate::check::{self, Filler, Rule, Tolerance, WITNESS_REASONS};
use crate::python::args::{detach, positions, refuse_extra_keywords, In, Named, Obj, Opt, S, W};
use crate::python::block_sparse::config;
use crate::python::errors::{refuse, Witness};

/// Whether each of an engine's top-k rows is a correct selection of its row's exact scores.
///
/// A correct row has its valid entries first, distinct, causal (``0 <= x < L``), exactly
/// ``min(topk, L)`` of them, and every selected position scoring at least every unselected
/// one — up to ``e_t = atol + rtol * magnitudes[t]`` on each side, so a tie within the
/// engine's rounding is never an error (rows may be in any order; ties at the threshold
/// broken any way). With ``atol = rtol = 0`` the check is exact. A position scored
/// exactly ``-inf`` is not selectable: it does not count toward ``min(topk, L)`` (DSA
/// candidate-block selectors write ``-1`` for it). Rows may be narrower than ``topk``
/// when every row's ``min(topk, L)`` fits them.
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
///     Each row's scores, read as given and judged **in their own arithmetic**: the
///     verdict is exact for these values, so float32 scores (e.g. :func:`indexer_scores`)
///     decide a near tie as float32 rounding left it, which real arithmetic may decide the
///     other way. For the real-arithmetic verdict on an indexer's rows (what
///     :func:`indexer_topk` selects) use :func:`kvselect.checking.check_indexer_topk`, or
///     pass float64-exact scores. Any other dtype is a ``TypeError``.
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
#[pyo3(
    signature = (scores, rows, context_lens=None, *, topk=None, atol=0.0, rtol=0.0,
                 magnitudes=None, slots=None, filler=Named::known(Filler::MinusOne), **renamed),
    text_signature = "(scores, rows, context_lens=None, *, topk=None, atol=0.0, rtol=0.0, \
                      magnitudes=None, slots=None, filler=\"-1\")"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn check_topk<'py>(
    py: Python<'py>,
    scores: &Obj<'py>,
    rows: &Obj<'py>,
    context_lens: Opt<'_, 'py>,
    topk: Opt<'_, 'py>,
    atol: f64,
    rtol: f64,
    magnitudes: Opt<'_, 'py>,
    slots: Option<Bound<'py, PyGlobalSlots>>,
    filler: Named<Filler>,
    renamed: Option<&Bound<'py, PyDict>>,
) -> PyResult<PyReport<'py>> {
    refuse_extra_keywords(
        "check_topk",
        renamed,
        &[("layout", "layout= is now slots=")],
    )?;
    let (filler, r, topk) = token_rows(filler, rows, topk, &slots)?;
    let (s, shape) = S.floats(scores, "scores", true)?;
    let [n, t] = shape[..] else {
        let msg = format!(
            "scores must be 2-D [n_rows, n_positions], got {}-D {:?}",
            shape.len(),
            shape
        );
        return Err(refuse(S, "scores", msg));
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

/// The token checkers' first reads, in their order (so a call wrong in two
/// ways is refused for the same one by both): `filler`, the 2-D `rows`, and
/// `topk`, by default a rank's width (DCP rows are the ranks' rows side by
/// side).
fn token_rows<'py>(
    filler: Named<Filler>,
    rows: &Obj<'py>,
    topk: Opt<'_, 'py>,
    slots: &Option<Bound<'py, PyGlobalSlots>>,
) -> PyResult<(Filler, In<'py, i64, 2>, usize)> {
    let filler = filler.get()?;
    let r = S.input::<i64, 2>(rows, "rows", "[n_rows, width]")?;
    let width = r.shape[1] / slots.as_ref().map_or(1, |g| g.get().dcp_size());
    let topk = S.count_or(topk, "topk", u64::MAX, width)?;
    Ok((filler, r, topk))
}

/// The structural half of :func:`check_topk` alone (private: the exact indexer check's).
///
/// Each row's valid entries first, distinct, causal, exactly ``min(topk, L)`` of them, under
/// ``filler`` and ``slots`` as :func:`check_topk` reads them; no score is read, so a row's
/// selection is taken as right. :func:`check_topk`'s report of the same rows against any equal
/// scores (no position scored ``-inf``), without its pass over every position: for rows whose
/// selection a float64 verdict has already passed.
#[pyfunction]
#[pyo3(
    signature = (rows, context_lens, *, topk=None, slots=None, filler=Named::known(Filler::MinusOne)),
    text_signature = "(rows, context_lens, *, topk=None, slots=None, filler=\"-1\")"
)]
pub(super) fn _check_topk_structure<'py>(
    py: Python<'py>,
    rows: &Obj<'py>,
    context_lens: &Obj<'py>,
    topk: Opt<'_, 'py>,
    slots: Option<Bound<'py, PyGlobalSlots>>,
    filler: Named<Filler>,
) -> PyResult<PyReport<'py>> {
    let (filler, r, topk) = token_rows(filler, rows, topk, &slots)?;
    let lens = positions(S, context_lens, "context_lens")?;
    let rule = Rule::TopkStructure(topk);
    if lens.len() != r.shape[0] {
        let msg = format!(
            "rows has {} rows, context_lens has {} entries: one each per row",
            r.shape[0],
            lens.len()
        );
        return Err(refuse(S, "context_lens", msg));
    }
    let rows = Rows {
        rows: r.slice()?,
        width: r.shape[1],
    };
    let axes = [("n_rows", lens.len()), ("n_positions", lens.iter().copied().max().unwrap_or(0))];
    let scored = (check::Values::F32(&[]), &axes[..], None);
    run(py, (rule, filler), Tolerance::default(), scored, rows, &lens, &slots)
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
///     Each row's block scores, judged as given in their own arithmetic: float32 (e.g.
///     :func:`block_scores`) or float64 (e.g. exact scores) read in place; another float
///     dtype converts once to float32. For the real-arithmetic verdict on a selection from
///     its inputs use :func:`kvselect.testing.assert_blocks` or a ``blocks`` dump.
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
#[pyo3(
    signature = (block_scores, rows, visible_blocks, config=None, *, atol=0.0, rtol=0.0,
                 magnitudes=None, slots=None, head_major=false, **renamed),
    text_signature = "(block_scores, rows, visible_blocks, config=None, *, atol=0.0, rtol=0.0, \
                      magnitudes=None, slots=None, head_major=False)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn check_blocks<'py>(
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
    renamed: Option<&Bound<'py, PyDict>>,
) -> PyResult<PyReport<'py>> {
    let was = [
        ("num_blocks", "num_blocks= is now visible_blocks="),
        ("layout", "layout= is now slots="),
    ];
    refuse_extra_keywords("check_blocks", renamed, &was)?;
    let cfg = self::config(config)?;
    let rule = Rule::Blocks(cfg);
    let tol = Tolerance { atol, rtol };
    let (r, rshape) = S.input_dyn::<i64>(rows, "rows")?;
    let (s, sshape) = S.floats(block_scores, "block_scores", false)?;
    let lens = positions(S, visible_blocks, "visible_blocks")?;
    // Either form ends in the one check (block rows pad with -1 only).
    let judge = |rows: Rows<'_>, lens: &[usize], axes: &[(&str, usize)]| {
        let scored = (s.values()?, axes, magnitudes);
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
                return Err(refuse(S, "head_major", msg));
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
            Err(refuse(S, name, msg))
        }
        _ => {
            let msg = format!(
                "rows must be 2-D [n_rows, width] or 3-D [n_queries, n_kv_heads, width], \
                 got {rshape:?}"
            );
            Err(refuse(S, "rows", msg))
        }
    }
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
pub(super) fn check_witnesses<'py>(
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
