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

/// The segment of ``token`` in a row of ``context_len`` tokens cut into
/// ``num_segments`` segments: the segment map itself,
/// ``floor(token * S_eff / L)`` with ``L = max(context_len, 1)`` and
/// ``S_eff = min(num_segments, L)``, exact for every integer up to 2**64 - 1.
/// Not clamped: an out-of-range token maps past the partition
/// (``segment_of(20, 4, 8) == 20``); only the merge clamps to ``S - 1``.
#[pyfunction]
fn segment_of(token: &Obj, context_len: &Obj, num_segments: &Obj) -> PyResult<usize> {
    let token = W.count(token, "token", u64::MAX)?;
    let len = W.count(context_len, "context_len", u64::MAX)?;
    let s = W.count(num_segments, "num_segments", u64::MAX)?;
    Ok(witness::segment_of(token, len, s))
}

/// The witnesses of every learned row: int32 ``[rows, num_segments]``, slot
/// ``s`` holding the left edge ``e_s = ceil(s * L / S_eff)`` of segment ``s``
/// when the row does not occupy it, ``-1`` when it does or ``s >= S_eff``.
/// ``learned`` is ``[rows, topk]`` row-relative offsets (negative =
/// padding), ``context_lens`` ``[rows]``; a row of length <= 0 gets none.
/// Any positive segment count is accepted. ``out=`` reuses a buffer.
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

/// The learned rows with witnesses merged in, as a new int32 array (or into
/// ``out=``): slots ``[0, learned_keep)`` kept bit for bit, the witnesses in
/// ascending segment order written to slots ``learned_keep, ...`` up to
/// ``B = min(max_replacements, topk - learned_keep)``, the rest dropped.
/// Refuses 0 or more than 64 segments and ``learned_keep > topk``.
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

/// The serving entry point: merges witnesses into ``topk_indices`` (int32
/// ``[rows, topk]``, C-contiguous, writeable) in place, with ``keep = topk -
/// num_segments`` and ``max_replacements = num_segments``. The buffer is
/// never converted (a ``torch.topk`` result is int64: call ``.int()``
/// first) and is checked on every call; ``num_segments = 0`` is the off
/// switch. A refused call leaves the buffer byte-identical.
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

/// The random null: ``min(budget, context_len)`` tokens drawn uniformly
/// without replacement from ``[0, context_len)``, ascending, deterministic
/// in ``seed`` (row ``L - 1`` of ``Selector.random(budget, seed)``).
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

/// The locality null: the ``min(budget, context_len)`` most recent tokens,
/// ``[L - k, L)`` (row ``L - 1`` of ``Selector.local(budget)``).
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

/// The share of the ``S_eff`` segments of ``[0, context_len)`` that
/// ``candidates`` (1-D) meets; padding, duplicates and out-of-range entries
/// count for nothing; 1.0 when there are no segments.
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

/// The share of a dense attention row's mass that ``candidates`` keeps:
/// ``sum(a[x] for distinct x in C, 0 <= x < L) / sum(a)``, the plain
/// quotient (NaN for 0/0, ``±inf`` when a row summing to 0 keeps something).
#[pyfunction]
fn attention_mass_recall(py: Python<'_>, candidates: &Obj, attention_row: &Obj) -> PyResult<f64> {
    let cand = W.input::<i32, 1>(candidates, "candidates", "[k]")?;
    let row = W.input::<f64, 1>(attention_row, "attention_row", "[L]")?;
    let (c, r) = (cand.slice()?, row.slice()?);
    Ok(detach(py, c.len() + r.len(), || {
        witness::attention_mass_recall(c, r)
    }))
}

/// :func:`segment_coverage` of every row of ``candidates`` (``[rows,
/// width]``) with its ``context_lens[r]`` (``[rows]``): float64 ``[rows]``.
/// ``out=`` (float64 ``[rows]`` exactly, C-contiguous, writeable, sharing
/// no input's memory) is filled and returned; a refused call leaves it
/// untouched.
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

/// How many distinct entries of each row of ``candidates`` (``[rows,
/// width]``) lie in ``[0, context_lens[r])``: the keys the selection really
/// uses (padding, duplicates and out-of-range entries use none), int64
/// ``[rows]``. ``out=`` (int64 ``[rows]`` exactly) is filled and returned;
/// a refused call leaves it untouched.
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

/// :func:`attention_mass_recall` of every row ``r`` of ``attention``
/// (float64 ``[n_rows, row_len]``) against candidate row ``r // group``,
/// ``group = n_rows / rows`` (a KV head's selection serves its query
/// heads): float64 ``[n_rows]``. Or, as the attention functions give them,
/// ``candidates`` ``[n_queries, n_kv_heads, width]`` (a selection) and
/// ``attention`` ``[n_queries, n_q_heads, n_keys]``
/// (:func:`attention_probabilities`), checked axis by axis (``n_q_heads`` a
/// multiple of ``n_kv_heads``): float64 ``[n_queries, n_q_heads]``, the
/// same numbers. ``out=`` (float64 of exactly the result's shape) is filled
/// and returned; a refused call leaves it untouched.
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
