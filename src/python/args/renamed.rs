//! Keywords renamed in the API: a caller still passing the old name is told
//! the new one.
//!
//! Reads the extra keywords of the few entry points whose keywords were
//! renamed (they collect them with `**renamed`, kept out of their
//! `text_signature`, so the Python signature is unchanged). The rule: any
//! extra keyword is the `TypeError` the argument parser raises for it,
//! `"f() got an unexpected keyword argument 'x'"`, and one the entry point
//! took under that name before says what replaced it.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Refuses the first keyword in `extra` (the entry point `func`'s unknown
/// keywords) as the parser would, naming its replacement when `renamed`
/// lists it as `(old, what replaced it)`, e.g. `("layout", "layout= is now
/// page_layout=")`.
pub(in crate::python) fn refuse_extra_keywords(
    func: &str,
    extra: Option<&Bound<'_, PyDict>>,
    renamed: &[(&str, &str)],
) -> PyResult<()> {
    let Some((key, _)) = extra.and_then(|kw| kw.iter().next()) else {
        return Ok(());
    };
    let key = key.str()?.to_string();
    let mut msg = format!("{func}() got an unexpected keyword argument '{key}'");
    if let Some((_, now)) = renamed.iter().find(|(old, _)| *old == key) {
        msg.push_str(&format!(": {now}"));
    }
    Err(PyTypeError::new_err(msg))
}
