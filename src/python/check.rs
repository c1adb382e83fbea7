//! `check_topk`: an engine's top-k rows judged by the rule (raises
//! `SelectionError`); the report is plain Python data, JSON-ready.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::args::{detach, positions, Args, Obj, Opt};
use super::errors::Domain;
use crate::check::{self, Problem, RowCheck, Tolerance, TopkBatch};

const S: Args = Args(Domain::Selection);

/// Whether each of an engine's top-k rows is a correct selection of its
/// row's exact ``scores`` (float32 ``[n_rows, n_positions]``): its valid
/// entries first, distinct, causal (``0 <= x < L``), exactly ``min(topk,
/// L)`` of them, and every selected position scoring at least every
/// unselected one — up to ``e_t = atol + rtol * magnitudes[t]`` on each
/// side, so a tie within the engine's rounding is never an error (rows may
/// be in any order; ties at the threshold broken any way). ``rows`` is
/// int32 or int64 ``[n_rows, width]``, negative entries padding;
/// ``context_lens`` ``[n_rows]`` (default: every position); ``topk``
/// defaults to ``width``. With ``atol = rtol = 0`` the check is exact.
///
/// Returns a dict: ``rows``, ``correct``, ``wrong``, ``by_reason`` (rows
/// per reason: ``padding_hole``, ``duplicate``, ``not_causal``,
/// ``wrong_count``, ``wrong_selection``) and ``details``, one entry per
/// wrong row: its ``row`` and ``problems`` (each a dict with its
/// ``reason``; a wrong selection lists the ``dropped`` and ``intruders``
/// as ``[position, score]``, their counts, the row's exact ``threshold``
/// and the ``margin`` by which it is wrong).
#[pyfunction]
#[pyo3(signature = (scores, rows, context_lens=None, *, topk=None, atol=0.0, rtol=0.0,
                    magnitudes=None))]
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
) -> PyResult<Bound<'py, PyDict>> {
    let s = S.input::<f32, 2>(scores, "scores", "[n_rows, n_positions]")?;
    let r = S.input::<i64, 2>(rows, "rows", "[n_rows, width]")?;
    let [n, t] = s.shape;
    let lens = match context_lens {
        Some(c) if !c.is_none() => positions(S, c, "context_lens")?,
        _ => vec![t; n],
    };
    let topk = match topk {
        Some(k) if !k.is_none() => S.count(k, "topk", u64::MAX)?,
        _ => r.shape[1],
    };
    let m = match magnitudes {
        Some(m) if !m.is_none() => {
            Some(S.input::<f32, 2>(m, "magnitudes", "[n_rows, n_positions]")?)
        }
        _ => None,
    };
    let batch = TopkBatch {
        scores: s.slice()?,
        magnitudes: m.as_ref().map(|m| m.slice()).transpose()?,
        n_positions: t,
        rows: r.slice()?,
        width: r.shape[1],
        lens: &lens,
        topk,
    };
    let tol = Tolerance { atol, rtol };
    let checks = detach(py, n.saturating_mul(t), || {
        check::check_topk_rows(&batch, tol)
    })?;
    report(py, &checks)
}

/// The report dict of [`check_topk`].
fn report<'py>(py: Python<'py>, checks: &[RowCheck]) -> PyResult<Bound<'py, PyDict>> {
    let reasons = [
        "padding_hole",
        "duplicate",
        "not_causal",
        "wrong_count",
        "wrong_selection",
    ];
    let mut by_reason = [0usize; 5];
    let details = PyList::empty(py);
    for (i, c) in checks.iter().enumerate().filter(|(_, c)| !c.is_correct()) {
        let problems = PyList::empty(py);
        let mut seen = [false; 5];
        for p in &c.problems {
            let d = PyDict::new(py);
            let k = match p {
                Problem::PaddingHole { slot, position } => {
                    d.set_item("slot", slot)?;
                    d.set_item("position", position)?;
                    0
                }
                Problem::Duplicate {
                    position,
                    first,
                    slot,
                } => {
                    d.set_item("position", position)?;
                    d.set_item("first", first)?;
                    d.set_item("slot", slot)?;
                    1
                }
                Problem::NotCausal { slot, position } => {
                    d.set_item("slot", slot)?;
                    d.set_item("position", position)?;
                    2
                }
                Problem::WrongCount { valid, expected } => {
                    d.set_item("valid", valid)?;
                    d.set_item("expected", expected)?;
                    3
                }
                Problem::WrongSelection {
                    dropped,
                    intruders,
                    n_dropped,
                    n_intruders,
                    threshold,
                    margin,
                } => {
                    d.set_item("dropped", dropped)?;
                    d.set_item("intruders", intruders)?;
                    d.set_item("n_dropped", n_dropped)?;
                    d.set_item("n_intruders", n_intruders)?;
                    d.set_item("threshold", threshold)?;
                    d.set_item("margin", margin)?;
                    4
                }
            };
            // `reason` first, then the fields (as the reference orders them).
            let entry = PyDict::new(py);
            entry.set_item("reason", reasons[k])?;
            entry.update(d.as_mapping())?;
            seen[k] = true;
            problems.append(entry)?;
        }
        for (count, hit) in by_reason.iter_mut().zip(seen) {
            *count += hit as usize;
        }
        let row = PyDict::new(py);
        row.set_item("row", i)?;
        row.set_item("problems", problems)?;
        details.append(row)?;
    }
    let out = PyDict::new(py);
    let wrong = details.len();
    out.set_item("rows", checks.len())?;
    out.set_item("correct", checks.len() - wrong)?;
    out.set_item("wrong", wrong)?;
    let br = PyDict::new(py);
    for (name, count) in reasons.iter().zip(by_reason) {
        br.set_item(name, count)?;
    }
    out.set_item("by_reason", br)?;
    out.set_item("details", details)?;
    Ok(out)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_topk, m)?)?;
    Ok(())
}
