//! NSA's block selection as fla computes it, every entry point raising
//! `SelectionError`, one file per family: what they all read alike (the
//! `window` option, the geometry) in [`common`]; the entry points on the keys, dense and packed, in [`dense`];
//! those on given compressed keys (an engine's decode) in [`compressed`];
//! those on an engine's paged cache of compressed keys in [`paged`].
//! This file only registers them.

mod common;
mod compressed;
mod dense;
mod paged;

use pyo3::prelude::*;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dense::nsa_block_scores, m)?)?;
    m.add_function(wrap_pyfunction!(dense::nsa_select, m)?)?;
    m.add_function(wrap_pyfunction!(compressed::nsa_compress_keys, m)?)?;
    m.add_function(wrap_pyfunction!(
        compressed::nsa_block_scores_compressed,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(compressed::nsa_select_compressed, m)?)?;
    m.add_function(wrap_pyfunction!(paged::nsa_block_scores_paged, m)?)?;
    m.add_function(wrap_pyfunction!(paged::nsa_select_paged, m)?)?;
    Ok(())
}
