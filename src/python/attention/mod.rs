//! The attention bindings, every entry point raising `SelectionError`, one
//! file per family: the baseline selectors and the oracle top-k in
//! [`selectors`]; the dense and sparse causal passes and the dense
//! probabilities in [`pass`]; the output error in [`error`]. This file only
//! registers them (the thread and SIMD controls are [`super::runtime`]).

mod error;
mod pass;
mod selectors;

use pyo3::prelude::*;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<selectors::PySelector>()?;
    m.add_function(wrap_pyfunction!(selectors::oracle_topk, m)?)?;
    m.add_function(wrap_pyfunction!(pass::attention_probabilities, m)?)?;
    m.add_function(wrap_pyfunction!(pass::dense_attention, m)?)?;
    m.add_function(wrap_pyfunction!(pass::sparse_attention, m)?)?;
    m.add_function(wrap_pyfunction!(error::output_relative_error, m)?)?;
    m.add_function(wrap_pyfunction!(error::output_relative_error_rows, m)?)?;
    Ok(())
}
