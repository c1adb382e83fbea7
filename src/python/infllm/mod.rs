//! InfLLM-v2's block scores and block rows, every entry point raising
//! `SelectionError`, one file per family: the options every form reads alike
//! in [`config`]; the dense and packed forms in [`dense`]; the paged decode
//! in [`paged`]. This file only registers them.

mod config;
mod dense;
mod paged;

use pyo3::prelude::*;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dense::infllm_block_scores, m)?)?;
    m.add_function(wrap_pyfunction!(dense::infllm_select, m)?)?;
    m.add_function(wrap_pyfunction!(paged::infllm_block_scores_paged, m)?)?;
    m.add_function(wrap_pyfunction!(paged::infllm_select_paged, m)?)?;
    Ok(())
}
