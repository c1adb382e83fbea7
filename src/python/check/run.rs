//! The checkers' shared body: arguments → core → report, and the report as
//! plain Python data.
//!
//! Reads nothing from Python itself: it takes the rows, scores and contexts
//! the checkers read. The rule: a row count that disagrees with the scores'
//! or the contexts' is blamed on the argument at fault; every report has
//! one shape (`rows`, `correct`, `wrong`, `by_reason`, `details`), JSON-ready.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::slots::{global_slots, PyGlobalSlots};
use crate::check::{self, Batch, Filler, RowCheck, Rule, Tolerance};
use crate::python::args::{detach, Floats, Opt, S};
use crate::python::errors::refuse;

/// A report, as a dict.
pub(super) type PyReport<'py> = Bound<'py, PyDict>;

/// An engine's rows, read query-major: `[n_rows, width]`.
pub(super) struct Rows<'a> {
    pub rows: &'a [i64],
    pub width: usize,
}

/// The shared body of the two score checks: arguments → core → report.
/// `scored` is the scores (`n_rows · n_candidates` of them, their shape's
/// `axes` named, last the candidates) and the `magnitudes` argument, which
/// must have that shape axis by axis; `lens` gives each row's context;
/// `rule` comes with the engine's filler.
pub(super) fn run<'py>(
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
pub(super) fn blame_row_counts(
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
    Err(refuse(S, culprit, msg))
}

/// The report as plain Python data (dicts, lists, tuples, numbers).
pub(super) fn report<'py>(
    py: Python<'py>,
    checks: &[RowCheck],
    reasons: &[&'static str],
) -> PyResult<PyReport<'py>> {
    let report = pythonize::pythonize(py, &check::Report::new(checks, reasons))?;
    Ok(report.cast_into::<PyDict>()?)
}
