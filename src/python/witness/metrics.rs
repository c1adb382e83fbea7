//! The witness metrics, single and batched: segment coverage, slots used,
//! and the attention mass a selection recalls.
//!
//! Reads candidate rows, attention rows and segment counts. The rule: every
//! array is shaped axis by axis against the rows it describes; the batched
//! forms write float64 / int32 outputs (`out=` checked as everywhere).

use pyo3::prelude::*;

use crate::python::args::ndarray;
use crate::python::args::{detach, positions, Obj, Opt, F64, W};
use crate::python::errors::{refuse, Witness};
use crate::{metrics, witness};

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
pub(super) fn segment_coverage(
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
pub(super) fn attention_mass_recall(
    py: Python<'_>,
    candidates: &Obj,
    attention_row: &Obj,
) -> PyResult<f64> {
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
pub(super) fn segment_coverage_rows<'py>(
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
pub(super) fn slots_used_rows<'py>(
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
pub(super) fn attention_mass_recall_rows<'py>(
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
                return Err(refuse(W, "attention", msg));
            }
            (n * hkv, width, n * hq, row_len, vec![n, hq])
        }
        (&[_, _, _], _) => {
            let msg = format!(
                "attention must be 3-D [n_queries, n_q_heads, n_keys] with 3-D candidates, got {ashape:?}"
            );
            return Err(refuse(W, "attention", msg));
        }
        (&[_, _], _) => {
            let msg = format!(
                "attention must be 2-D [n_rows, row_len] with 2-D candidates, got {ashape:?}"
            );
            return Err(refuse(W, "attention", msg));
        }
        _ => {
            let msg = format!(
                "candidates must be 2-D [rows, width] or 3-D [n_queries, n_kv_heads, width], got {cshape:?}"
            );
            return Err(refuse(W, "candidates", msg));
        }
    };
    // With no candidate rows there must be no attention rows either.
    let group = match n_rows.checked_div(rows) {
        None if n_rows == 0 => 1,
        g => g.filter(|&g| g > 0 && g * rows == n_rows).ok_or_else(|| {
            refuse(
                W,
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
