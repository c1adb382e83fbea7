//! Block-sparse selection (MiniMax-M3), every entry point raising
//! `SelectionError`, one file per family: the config class in [`config`];
//! the arguments every form reads alike in [`inputs`]; the selections
//! (single, batched, packed, paged) in [`select`]; the exact block scores
//! and their error scales in [`scores`]; the positions a selection covers
//! in [`positions`]. This file only registers them.

mod config;
mod inputs;
mod positions;
mod scores;
mod select;

use pyo3::prelude::*;

pub(super) use self::config::config;
use crate::block_sparse;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MINIMAX_BLOCK_SIZE", block_sparse::MINIMAX_BLOCK_SIZE)?;
    m.add_class::<config::PyBlockSparseConfig>()?;
    m.add_function(wrap_pyfunction!(select::block_sparse_select, m)?)?;
    m.add_function(wrap_pyfunction!(select::block_sparse_select_packed, m)?)?;
    m.add_function(wrap_pyfunction!(select::block_sparse_select_paged, m)?)?;
    m.add_function(wrap_pyfunction!(positions::positions_of_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(scores::block_scores, m)?)?;
    m.add_function(wrap_pyfunction!(scores::block_magnitudes, m)?)?;
    Ok(())
}
