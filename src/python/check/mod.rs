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

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<slots::PyGlobalSlots>()?;
    m.add_function(wrap_pyfunction!(checkers::check_topk, m)?)?;
    m.add_function(wrap_pyfunction!(checkers::check_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(checkers::check_witnesses, m)?)?;
    Ok(())
}
