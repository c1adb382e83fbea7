//! The checkers: an engine's rows judged by the rule (raising
//! `SelectionError` on a refused call, `WitnessError` for the witness
//! check); every report is plain Python data, JSON-ready, in one shape:
//! `rows`, `correct`, `wrong`, `by_reason`, `details`. One file per family:
//! the DCP layouts (`GlobalSlots`) in [`slots`], the entry points in
//! [`checkers`], their shared body and report in [`run`]. This file only
//! registers them.

mod checkers;
mod run;
mod slots;

use pyo3::prelude::*;
use pyo3::types::PyString;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<slots::PyGlobalSlots>()?;
    // The three checkers are set without an `__all__` entry: `kvselect` wraps
    // each (its report as a `kvselect.checking.Report`), and the module's
    // `__all__` is what `kvselect` re-exports as it is (`kvselect/__init__.py`).
    for checker in [
        wrap_pyfunction!(checkers::check_topk, m)?,
        wrap_pyfunction!(checkers::check_blocks, m)?,
        wrap_pyfunction!(checkers::check_witnesses, m)?,
    ] {
        m.setattr(checker.getattr("__name__")?.cast_into::<PyString>()?, checker)?;
    }
    m.add_function(wrap_pyfunction!(checkers::_check_topk_structure, m)?)?;
    Ok(())
}
