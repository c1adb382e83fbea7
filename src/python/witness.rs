//! Segment witnesses: the spec's API, the null models and the metrics,
//! single and batched (every one raises `WitnessError`).

use numpy::PyArray1;
use pyo3::prelude::*;

use super::args::ndarray;
use super::args::{detach, positions, Args, Obj, Opt, F64, I32};
use super::errors::{Domain, Witness};
use crate::{metrics, witness};

const W: Args = Args(Domain::Witness);
const I32_MAX: u64 = i32::MAX as u64;
/// What a merge's segment count is bounded by (the 64-bit occupancy mask).
const MERGE_MAX: u64 = witness::MAX_TOPOLOGY_SEGMENTS as u64;

/// The segment of one token: the segment map itself.
///
/// The segment of ``token`` in a row of ``context_len`` tokens cut into ``num_segments``
/// segments, ``floor(token * S_eff / L)`` with ``L = max(context_len, 1)`` and
/// ``S_eff = min(num_segments, L)``, exact for every integer up to 2**64 - 1. Not clamped:
/// an out-of-range token maps past the partition (``segment_of(20, 4, 8) == 20``); only the
/// merge clamps to ``S - 1``.
///
/// Parameters
/// ----------
/// token : int
///     The token's position, 0 to 2**64 - 1 (a Python or NumPy integer).
/// context_len : int
///     The row's length ``L``, 0 to 2**64 - 1 (0 is read as 1).
/// num_segments : int
///     The segment count ``S``, 0 to 2**64 - 1.
///
/// Returns
/// -------
/// int
///     The segment index, ``floor(token * S_eff / L)``.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when an argument is negative or
///     above 2**64 - 1.
/// TypeError
///     when an argument is not an integer (a float, NaN, a string, None).
#[pyfunction]
fn segment_of(token: &Obj, context_len: &Obj, num_segments: &Obj) -> PyResult<usize> {
    let token = W.count(token, "token", u64::MAX)?;
    let len = W.count(context_len, "context_len", u64::MAX)?;
    let s = W.count(num_segments, "num_segments", u64::MAX)?;
    Ok(witness::segment_of(token, len, s))
}

/// The witnesses of every learned row, one slot per segment.
///
/// Slot ``s`` of row ``r`` holds the left edge ``e_s = ceil(s * L / S_eff)`` of segment
/// ``s`` when the row does not occupy it, ``-1`` when it does or ``s >= S_eff``
/// (``L = context_lens[r]``, ``S_eff = min(num_segments, L)``). A row of length <= 0 gets
/// none. Any positive segment count is accepted.
///
/// Parameters
/// ----------
/// learned : array_like of int, [rows, topk]
///     Row-relative offsets, negative = padding; any integer dtype whose values fit int32
///     (int64 ``torch.topk`` indices convert once), any layout (copied once when not
///     C-contiguous, aligned and native int32). Any CPU DLPack tensor too.
/// context_lens : array_like of int, [rows]
///     Each row's length ``L``, values within int32; one per learned row.
/// num_segments : int
///     The segment count ``S``, 1 to 2**32 - 1.
/// out : ndarray of int32, [rows, num_segments], optional
///     Reuses a buffer: written in place and returned. Exactly that shape, native int32,
///     C-contiguous, aligned, writeable, sharing no input's memory (an ndarray or a CPU
///     DLPack tensor; never converted). A refused call leaves it untouched.
///
/// Returns
/// -------
/// ndarray of int32, [rows, num_segments]
///     The witnesses (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``learned`` is not 2-D,
///     ``context_lens`` is not 1-D with one entry per row, a value does not fit int32,
///     ``num_segments`` is 0, negative or above 2**32 - 1, ``out`` has another shape, is not
///     C-contiguous, aligned and writeable, or overlaps an input, or a tensor is not on
///     the CPU.
/// TypeError
///     when an array holds no integers (floats, bools, strings), an argument is no array
///     (None, an object, a dict), ``num_segments`` is not an integer, or ``out`` is not an
///     int32 ndarray or tensor (another dtype, byte order or a list).
/// MemoryError
///     when the ``[rows, num_segments]`` result is too large to allocate.
#[pyfunction]
#[pyo3(signature = (learned, context_lens, num_segments, *, out=None))]
fn topology_witness_indices<'py>(
    py: Python<'py>,
    learned: &Obj<'py>,
    context_lens: &Obj<'py>,
    num_segments: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let learned = W.input::<i32, 2>(learned, "learned", "[rows, topk]")?;
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    let s = W.count(num_segments, "num_segments", u32::MAX as u64)?;
    let (shape, topk) = ([lens.shape[0], s], learned.shape[1]);
    let inputs = [learned.untyped(), lens.untyped()];
    // SAFETY: `topology_witness_indices_into` writes every slot of every row
    // (each row is filled with -1 first) or refuses before writing.
    let out = unsafe { W.output_filled_by_core(py, out, &shape, &inputs)? };
    let (l, c) = (learned.slice()?, lens.slice()?);
    out.run(l.len() + shape[0] * s, |o| {
        witness::topology_witness_indices_into(l, topk, c, s, o)
    })
}

/// The learned rows with witnesses merged in, as a new int32 array (or into ``out=``).
///
/// Slots ``[0, learned_keep)`` are kept bit for bit, the witnesses in ascending segment
/// order are written to slots ``learned_keep, ...`` up to
/// ``B = min(max_replacements, topk - learned_keep)``, the rest dropped.
///
/// Parameters
/// ----------
/// learned : array_like of int, [rows, topk]
///     Row-relative offsets, negative = padding; any integer dtype whose values fit int32,
///     any layout (copied once when needed). Any CPU DLPack tensor too.
/// context_lens : array_like of int, [rows]
///     Each row's length, values within int32; one per learned row.
/// learned_keep : int
///     The retained prefix, 0 to ``topk``.
/// num_segments : int
///     The segment count ``S``, 1 to 64 (``MAX_TOPOLOGY_SEGMENTS``).
/// max_replacements : int
///     The witness budget per row, 0 to 2**64 - 1 (capped by the row).
/// out : ndarray of int32, [rows, topk], optional
///     Written in place and returned. Exactly ``learned``'s shape, native int32,
///     C-contiguous, aligned, writeable, sharing no input's memory (an ndarray or a CPU
///     DLPack tensor; never converted). A refused call leaves it untouched.
///
/// Returns
/// -------
/// ndarray of int32, [rows, topk]
///     The merged rows (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``learned`` is not 2-D,
///     ``context_lens`` is not 1-D with one entry per row, a value does not fit int32,
///     ``num_segments`` is 0 or more than 64, ``learned_keep > topk``, a count is negative
///     or above 2**64 - 1, ``out`` has another shape, is not C-contiguous, aligned and
///     writeable, or overlaps an input, or a tensor is not on the CPU.
/// TypeError
///     when an array holds no integers, an argument is no array, a count is not an integer
///     (None, a float), or ``out`` is not an int32 ndarray or tensor.
#[pyfunction]
#[pyo3(signature = (learned, context_lens, learned_keep, num_segments, max_replacements, *, out=None))]
fn apply_topology_witnesses<'py>(
    py: Python<'py>,
    learned: &Obj<'py>,
    context_lens: &Obj<'py>,
    learned_keep: &Obj<'py>,
    num_segments: &Obj<'py>,
    max_replacements: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let learned = W.input::<i32, 2>(learned, "learned", "[rows, topk]")?;
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    let keep = W.count(learned_keep, "learned_keep", u64::MAX)?;
    let s = W.count_within(num_segments, "num_segments", u64::MAX, MERGE_MAX)?;
    let budget = W.count(max_replacements, "max_replacements", u64::MAX)?;
    let inputs = [learned.untyped(), lens.untyped()];
    // SAFETY: `apply_topology_witnesses_into` copies every learned row into
    // its output row, or refuses before writing.
    let out = unsafe { W.output_filled_by_core(py, out, &learned.shape, &inputs)? };
    let (l, c, topk) = (learned.slice()?, lens.slice()?, learned.shape[1]);
    out.run(l.len(), |o| {
        witness::apply_topology_witnesses_into(l, topk, c, keep, s, budget, o)
    })
}

/// The serving entry point: merges witnesses into ``topk_indices`` in place.
///
/// The merge of :func:`apply_topology_witnesses` with ``keep = topk - num_segments`` and
/// ``max_replacements = num_segments``, written into the caller's buffer. The buffer is
/// never converted (a ``torch.topk`` result is int64: call ``.int()`` first) and is checked
/// on every call; ``num_segments = 0`` is the off switch. A refused call leaves the buffer
/// byte-identical.
///
/// Parameters
/// ----------
/// topk_indices : ndarray of int32, [rows, topk]
///     The learned rows, rewritten in place: native int32, C-contiguous, aligned,
///     writeable, not overlapping ``context_lens`` (an ndarray or a CPU DLPack tensor,
///     e.g. an int32 torch tensor; never converted or copied).
/// context_lens : array_like of int, [rows]
///     Each row's length, values within int32; one per buffer row.
/// num_segments : int
///     The segment count ``S``, 0 (off: nothing written) to 64 (``MAX_TOPOLOGY_SEGMENTS``).
///
/// Returns
/// -------
/// None
///     The merged rows are ``topk_indices`` itself, rewritten in place.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``topk_indices`` is not 2-D,
///     not C-contiguous, misaligned, read-only or overlaps ``context_lens`` (checked even
///     with the off switch), ``context_lens`` is not 1-D with one entry per row or holds a
///     value outside int32, ``num_segments`` is negative or more than 64, or a tensor is
///     not on the CPU.
/// TypeError
///     when ``topk_indices`` is not a native int32 ndarray or tensor (int64, float32,
///     byte-swapped, a list, None; checked even with the off switch), ``context_lens``
///     holds no integers, or ``num_segments`` is not an integer.
#[pyfunction]
fn scatter_topology_witnesses<'py>(
    py: Python<'py>,
    topk_indices: &Obj<'py>,
    context_lens: &Obj<'py>,
    num_segments: &Obj<'py>,
) -> PyResult<()> {
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    let mut buf = W.inplace::<i32>(topk_indices, "topk_indices", 2, &[lens.untyped()])?;
    let s = W.count_within(num_segments, "num_segments", u64::MAX, MERGE_MAX)?;
    if s == 0 {
        return Ok(());
    }
    let topk = buf.shape()[1];
    let (c, b) = (lens.slice()?, buf.slice()?);
    detach(py, b.len(), || {
        witness::scatter_topology_witnesses(b, topk, c, s)
    })?;
    Ok(())
}

/// The random null: ``min(budget, context_len)`` tokens drawn uniformly.
///
/// Drawn without replacement from ``[0, context_len)``, ascending, deterministic in
/// ``seed`` (row ``L - 1`` of ``Selector.random(budget, seed)``).
///
/// Parameters
/// ----------
/// context_len : int
///     The row's length ``L``, 0 to 2**31 - 1.
/// budget : int
///     How many tokens to draw, 0 to 2**64 - 1 (capped at ``L``).
/// seed : int
///     The seed, 0 to 2**64 - 1.
///
/// Returns
/// -------
/// ndarray of int32, [min(budget, context_len)]
///     The drawn tokens, ascending.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
///     2**31 - 1, or an argument is negative or above 2**64 - 1.
/// TypeError
///     when an argument is not an integer (a float, ``np.float64``, a string).
#[pyfunction]
fn random_null<'py>(
    py: Python<'py>,
    context_len: &Obj<'py>,
    budget: &Obj<'py>,
    seed: &Obj<'py>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let len = W.count(context_len, "context_len", I32_MAX)?;
    let budget = W.count(budget, "budget", u64::MAX)?;
    let seed = W.count(seed, "seed", u64::MAX)? as u64;
    let v = detach(py, budget.min(len), || {
        witness::random_null(len, budget, seed)
    });
    Ok(PyArray1::from_vec(py, v))
}

/// The locality null: the ``min(budget, context_len)`` most recent tokens.
///
/// The tokens ``[L - k, L)``, ``k = min(budget, L)`` (row ``L - 1`` of
/// ``Selector.local(budget)``).
///
/// Parameters
/// ----------
/// context_len : int
///     The row's length ``L``, 0 to 2**31 - 1.
/// budget : int
///     How many tokens to keep, 0 to 2**64 - 1 (capped at ``L``).
///
/// Returns
/// -------
/// ndarray of int32, [min(budget, context_len)]
///     ``L - k, ..., L - 1``.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
///     2**31 - 1, or an argument is negative or above 2**64 - 1.
/// TypeError
///     when an argument is not an integer (a string, a float).
#[pyfunction]
fn locality_null<'py>(
    py: Python<'py>,
    context_len: &Obj<'py>,
    budget: &Obj<'py>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let len = W.count(context_len, "context_len", I32_MAX)?;
    let budget = W.count(budget, "budget", u64::MAX)?;
    Ok(PyArray1::from_vec(py, witness::locality_null(len, budget)))
}

/// The share of the ``S_eff`` segments of ``[0, context_len)`` that ``candidates`` meets.
///
/// Padding, duplicates and out-of-range entries count for nothing; 1.0 when there are no
/// segments (``S_eff = min(num_segments, L)``).
///
/// Parameters
/// ----------
/// candidates : array_like of int, [k]
///     The selected positions (1-D), any integer dtype whose values fit int32; negative =
///     padding. Any CPU DLPack tensor too.
/// context_len : int
///     The row's length ``L``, 0 to 2**64 - 1.
/// num_segments : int
///     The segment count ``S``, 0 to 2**64 - 1.
///
/// Returns
/// -------
/// float
///     Segments met / ``S_eff``, in [0, 1].
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``candidates`` is not 1-D or
///     holds a value outside int32, a count is negative or above 2**64 - 1, or a tensor is
///     not on the CPU.
/// TypeError
///     when ``candidates`` holds no integers (complex, bytes) or a count is not an integer.
#[pyfunction]
fn segment_coverage(
    py: Python<'_>,
    candidates: &Obj,
    context_len: &Obj,
    num_segments: &Obj,
) -> PyResult<f64> {
    let cand = W.input::<i32, 1>(candidates, "candidates", "[k]")?;
    let len = W.count(context_len, "context_len", u64::MAX)?;
    let s = W.count(num_segments, "num_segments", u64::MAX)?;
    let c = cand.slice()?;
    Ok(detach(py, c.len(), || witness::segment_coverage(c, len, s)))
}

/// The share of a dense attention row's mass that ``candidates`` keeps.
///
/// ``sum(a[x] for distinct x in C, 0 <= x < L) / sum(a)``, the plain quotient (NaN for
/// 0/0, ``±inf`` when a row summing to 0 keeps something; NaN in the row propagates).
///
/// Parameters
/// ----------
/// candidates : array_like of int, [k]
///     The selected positions (1-D), any integer dtype whose values fit int32; negative
///     and out-of-range entries keep nothing. Any CPU DLPack tensor too.
/// attention_row : array_like of float, [L]
///     The row's attention weights ``a`` (1-D), read as float64 (other floats convert once).
///
/// Returns
/// -------
/// float
///     The kept share of the mass.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when an argument is not 1-D,
///     ``candidates`` holds a value outside int32, or a tensor is not on the CPU.
/// TypeError
///     when ``candidates`` holds no integers or ``attention_row`` no floats (a list of
///     ints included).
#[pyfunction]
fn attention_mass_recall(py: Python<'_>, candidates: &Obj, attention_row: &Obj) -> PyResult<f64> {
    let cand = W.input::<i32, 1>(candidates, "candidates", "[k]")?;
    let row = W.input::<f64, 1>(attention_row, "attention_row", "[L]")?;
    let (c, r) = (cand.slice()?, row.slice()?);
    Ok(detach(py, c.len() + r.len(), || {
        witness::attention_mass_recall(c, r)
    }))
}

/// :func:`segment_coverage` of every row of ``candidates``, with its ``context_lens[r]``.
///
/// Row ``r`` of the result is ``segment_coverage(candidates[r], context_lens[r],
/// num_segments)``.
///
/// Parameters
/// ----------
/// candidates : array_like of int, [rows, width]
///     The selections, any integer dtype whose values fit int32; negative = padding. Any
///     CPU DLPack tensor too.
/// context_lens : array_like of int, [rows]
///     Each row's length, every entry >= 0; one per candidate row.
/// num_segments : int
///     The segment count ``S``, 0 to 2**64 - 1.
/// out : ndarray of float64, [rows], optional
///     Filled and returned: exactly ``[rows]``, native float64, C-contiguous, aligned,
///     writeable, sharing no input's memory (never converted). A refused call leaves it
///     untouched.
///
/// Returns
/// -------
/// ndarray of float64, [rows]
///     Each row's coverage (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``candidates`` is not 2-D or
///     holds a value outside int32, ``context_lens`` is not 1-D with one entry per row or
///     has a negative entry, ``num_segments`` is negative or above 2**64 - 1, ``out`` has
///     another shape, is not C-contiguous, aligned and writeable, or overlaps an input, or
///     a tensor is not on the CPU.
/// TypeError
///     when an array holds no integers, ``num_segments`` is not an integer, or ``out`` is
///     not a float64 ndarray or tensor.
#[pyfunction]
#[pyo3(signature = (candidates, context_lens, num_segments, *, out=None))]
fn segment_coverage_rows<'py>(
    py: Python<'py>,
    candidates: &Obj<'py>,
    context_lens: &Obj<'py>,
    num_segments: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F64<'py>> {
    let cand = W.input::<i32, 2>(candidates, "candidates", "[rows, width]")?;
    let [rows, width] = cand.shape;
    let lens = positions(W, context_lens, "context_lens")?;
    let s = W.count(num_segments, "num_segments", u64::MAX)?;
    let raw = ndarray(context_lens);
    let inputs: Vec<_> = [Some(cand.untyped()), raw.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let out = W.output::<f64>(py, out, &[rows], &inputs)?;
    let c = cand.slice()?;
    out.run(c.len(), |o| {
        metrics::segment_coverage_rows(c, width, &lens, s, o).map_err(Witness)
    })
}

/// How many distinct entries of each row of ``candidates`` lie in ``[0, context_lens[r])``.
///
/// The keys the selection really uses: padding, duplicates and out-of-range entries use
/// none.
///
/// Parameters
/// ----------
/// candidates : array_like of int, [rows, width]
///     The selections, any integer dtype whose values fit int32. Any CPU DLPack tensor too.
/// context_lens : array_like of int, [rows]
///     Each row's length, every entry >= 0; one per candidate row.
/// out : ndarray of int64, [rows], optional
///     Filled and returned: exactly ``[rows]``, native int64, C-contiguous, aligned,
///     writeable, sharing no input's memory (never converted). A refused call leaves it
///     untouched.
///
/// Returns
/// -------
/// ndarray of int64, [rows]
///     Each row's count of used keys (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``candidates`` is not 2-D or
///     holds a value outside int32, ``context_lens`` is not 1-D with one entry per row or
///     has a negative entry, ``out`` has another shape, is not C-contiguous, aligned and
///     writeable, or overlaps an input, or a tensor is not on the CPU.
/// TypeError
///     when an array holds no integers, or ``out`` is not an int64 ndarray or tensor.
#[pyfunction]
#[pyo3(signature = (candidates, context_lens, *, out=None))]
fn slots_used_rows<'py>(
    py: Python<'py>,
    candidates: &Obj<'py>,
    context_lens: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<i64>>> {
    let cand = W.input::<i32, 2>(candidates, "candidates", "[rows, width]")?;
    let [rows, width] = cand.shape;
    let lens = positions(W, context_lens, "context_lens")?;
    let raw = ndarray(context_lens);
    let inputs: Vec<_> = [Some(cand.untyped()), raw.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let out = W.output::<i64>(py, out, &[rows], &inputs)?;
    let c = cand.slice()?;
    out.run(c.len(), |o| {
        metrics::slots_used_rows(c, width, &lens, o).map_err(Witness)
    })
}

/// :func:`attention_mass_recall` of every attention row against its candidate row.
///
/// Row ``r`` of ``attention`` (float64 ``[n_rows, row_len]``) is judged against candidate
/// row ``r // group``, ``group = n_rows / rows`` (a KV head's selection serves its query
/// heads): float64 ``[n_rows]``. Or, as the attention functions give them, ``candidates``
/// ``[n_queries, n_kv_heads, width]`` (a selection) and ``attention``
/// ``[n_queries, n_q_heads, n_keys]`` (:func:`attention_probabilities`), checked axis by
/// axis (``n_q_heads`` a multiple of ``n_kv_heads``): float64 ``[n_queries, n_q_heads]``,
/// the same numbers.
///
/// Parameters
/// ----------
/// candidates : array_like of int, [rows, width] or [n_queries, n_kv_heads, width]
///     The selections, any integer dtype whose values fit int32. Any CPU DLPack tensor too.
/// attention : array_like of float, [n_rows, row_len] or [n_queries, n_q_heads, n_keys]
///     Dense attention rows, read as float64 (other floats convert once); 2-D with 2-D
///     candidates (``n_rows`` a positive multiple of ``rows``; none when there are no
///     candidate rows), 3-D with 3-D ones.
/// out : ndarray of float64, [n_rows] or [n_queries, n_q_heads], optional
///     Filled and returned: exactly the result's shape, native float64, C-contiguous,
///     aligned, writeable, sharing no input's memory (never converted). A refused call
///     leaves it untouched.
///
/// Returns
/// -------
/// ndarray of float64, [n_rows] or [n_queries, n_q_heads]
///     Each attention row's recall (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``candidates`` is neither 2-D
///     nor 3-D or holds a value outside int32; ``attention`` has the other form, another
///     ``n_queries``, an ``n_q_heads`` that is no positive multiple of ``n_kv_heads``, or a
///     row count that is no positive multiple of the candidate rows; ``out`` has another
///     shape, is not C-contiguous, aligned and writeable, or overlaps an input; or a tensor
///     is not on the CPU.
/// TypeError
///     when ``candidates`` holds no integers, ``attention`` no floats, or ``out`` is not a
///     float64 ndarray or tensor.
#[pyfunction]
#[pyo3(signature = (candidates, attention, *, out=None))]
fn attention_mass_recall_rows<'py>(
    py: Python<'py>,
    candidates: &Obj<'py>,
    attention: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F64<'py>> {
    let (cand, cshape) = W.input_dyn::<i32>(candidates, "candidates")?;
    let (att, ashape) = W.input_dyn::<f64>(attention, "attention")?;
    let (rows, width, n_rows, row_len, out_shape) = match (&cshape[..], &ashape[..]) {
        (&[rows, width], &[n_rows, row_len]) => (rows, width, n_rows, row_len, vec![n_rows]),
        (&[n, hkv, width], &[_, hq, row_len]) => {
            let want = [("n_queries", n), ("n_q_heads", hq), ("n_keys", row_len)];
            W.axes("attention", &ashape, &want)?;
            if hkv == 0 || hq % hkv != 0 {
                let msg = format!(
                    "attention has n_q_heads={hq}, not a positive multiple of candidates' n_kv_heads={hkv}"
                );
                return Err(super::errors::refuse(Domain::Witness, "attention", msg));
            }
            (n * hkv, width, n * hq, row_len, vec![n, hq])
        }
        (&[_, _, _], _) => {
            let msg = format!(
                "attention must be 3-D [n_queries, n_q_heads, n_keys] with 3-D candidates, got {ashape:?}"
            );
            return Err(super::errors::refuse(Domain::Witness, "attention", msg));
        }
        (&[_, _], _) => {
            let msg = format!(
                "attention must be 2-D [n_rows, row_len] with 2-D candidates, got {ashape:?}"
            );
            return Err(super::errors::refuse(Domain::Witness, "attention", msg));
        }
        _ => {
            let msg = format!(
                "candidates must be 2-D [rows, width] or 3-D [n_queries, n_kv_heads, width], got {cshape:?}"
            );
            return Err(super::errors::refuse(Domain::Witness, "candidates", msg));
        }
    };
    // With no candidate rows there must be no attention rows either.
    let group = match n_rows.checked_div(rows) {
        None if n_rows == 0 => 1,
        g => g.filter(|&g| g > 0 && g * rows == n_rows).ok_or_else(|| {
            super::errors::refuse(
                Domain::Witness,
                "attention",
                format!("attention has {n_rows} rows, not a positive multiple of the {rows} candidate rows"),
            )
        })?,
    };
    let out = W.output::<f64>(py, out, &out_shape, &[cand.untyped(), att.untyped()])?;
    let (c, a) = (cand.slice()?, att.slice()?);
    let recall =
        |o: &mut [f64]| metrics::attention_mass_recall_rows(c, width, a, row_len, group, o);
    out.run(a.len(), |o| recall(o).map_err(Witness))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_TOPOLOGY_SEGMENTS", witness::MAX_TOPOLOGY_SEGMENTS)?;
    m.add_function(wrap_pyfunction!(segment_of, m)?)?;
    m.add_function(wrap_pyfunction!(topology_witness_indices, m)?)?;
    m.add_function(wrap_pyfunction!(apply_topology_witnesses, m)?)?;
    m.add_function(wrap_pyfunction!(scatter_topology_witnesses, m)?)?;
    m.add_function(wrap_pyfunction!(random_null, m)?)?;
    m.add_function(wrap_pyfunction!(locality_null, m)?)?;
    m.add_function(wrap_pyfunction!(segment_coverage, m)?)?;
    m.add_function(wrap_pyfunction!(attention_mass_recall, m)?)?;
    m.add_function(wrap_pyfunction!(segment_coverage_rows, m)?)?;
    m.add_function(wrap_pyfunction!(attention_mass_recall_rows, m)?)?;
    m.add_function(wrap_pyfunction!(slots_used_rows, m)?)?;
    Ok(())
}
