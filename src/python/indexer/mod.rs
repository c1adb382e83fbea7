//! The lightning indexer, every entry point raising `SelectionError`, one
//! file per family: the arguments every form reads alike in [`call`]; the
//! top-k (single-sequence, packed, paged) in [`topk`]; the score matrix and
//! its magnitudes in [`scores`]. This file only registers them.

mod call;
mod scores;
mod topk;

use pyo3::prelude::*;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scores::indexer_scores, m)?)?;
    m.add_function(wrap_pyfunction!(scores::indexer_magnitudes, m)?)?;
    m.add_function(wrap_pyfunction!(scores::_indexer_rescore, m)?)?;
    m.add_function(wrap_pyfunction!(scores::_indexer_rescore_all, m)?)?;
    m.add_function(wrap_pyfunction!(scores::_indexer_rescore_verdict, m)?)?;
    m.add_function(wrap_pyfunction!(topk::indexer_topk, m)?)?;
    m.add_function(wrap_pyfunction!(topk::indexer_topk_packed, m)?)?;
    m.add_function(wrap_pyfunction!(topk::indexer_topk_paged, m)?)?;
    Ok(())
}
