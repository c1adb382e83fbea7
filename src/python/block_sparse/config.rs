//! The `BlockSparseConfig` class and the `config` argument every block
//! entry point takes.
//!
//! Reads `config`. The rule: a `BlockSparseConfig` or None (the defaults);
//! anything else is a `TypeError`. Building one refuses a field that is
//! negative or past 2**31 - 1, and a config that can select nothing.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::block_sparse::BlockSparseConfig;
use crate::python::args::{Opt, I32_MAX, S};
use crate::python::errors::type_name;

/// How many blocks a query may see, and which are free.
///
/// ``BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)``.
/// Immutable, compares by value, hashable. Building one refuses a config that can select
/// nothing (block_size 0, or top_blocks 0 with no forced block), since an empty selection is
/// a NaN downstream. The released MiniMax-M3 checkpoint uses top_blocks=16, init_blocks=0,
/// local_blocks=1. Rows of a selection are ``width = max(top_blocks, init_blocks +
/// local_blocks)`` wide.
///
/// Parameters
/// ----------
/// block_size : int, default 128
///     Tokens per block (128 for a real checkpoint; also the KV page size), at least 1.
/// top_blocks : int, default 32
///     Total blocks visible per query, forced ones counted.
/// init_blocks : int, default 1
///     Blocks at the start of the sequence that are always visible.
/// local_blocks : int, default 2
///     Blocks nearest the query that are always visible. Every field is a non-negative
///     integer, at most 2**31 - 1 (None takes the default).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the field) when a field is negative or past
///     2**31 - 1, ``block_size`` is 0, or ``top_blocks`` is 0 with ``init_blocks`` and
///     ``local_blocks`` both 0 (``.argument`` is ``top_blocks``).
/// TypeError
///     when a field is not an integer (or None).
#[pyclass(name = "BlockSparseConfig", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::python) struct PyBlockSparseConfig(BlockSparseConfig);

#[pymethods]
impl PyBlockSparseConfig {
    #[new]
    #[pyo3(
        signature = (block_size=None, top_blocks=None, init_blocks=None, local_blocks=None),
        text_signature = "(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)"
    )]
    fn new(
        block_size: Opt<'_, '_>,
        top_blocks: Opt<'_, '_>,
        init_blocks: Opt<'_, '_>,
        local_blocks: Opt<'_, '_>,
    ) -> PyResult<Self> {
        let d = BlockSparseConfig::default();
        let field = |obj: Opt, name, default| S.count_or(obj, name, I32_MAX, default);
        Ok(PyBlockSparseConfig(BlockSparseConfig::new(
            field(block_size, "block_size", d.block_size)?,
            field(top_blocks, "top_blocks", d.top_blocks)?,
            field(init_blocks, "init_blocks", d.init_blocks)?,
            field(local_blocks, "local_blocks", d.local_blocks)?,
        )?))
    }

    /// Tokens per block (128 for a real checkpoint; also the KV page size).
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }

    /// Total blocks visible per query, forced ones counted.
    #[getter]
    fn top_blocks(&self) -> usize {
        self.0.top_blocks
    }

    /// Blocks at the start of the sequence that are always visible.
    #[getter]
    fn init_blocks(&self) -> usize {
        self.0.init_blocks
    }

    /// Blocks nearest the query that are always visible.
    #[getter]
    fn local_blocks(&self) -> usize {
        self.0.local_blocks
    }

    /// The fixed width of an output row: max(top_blocks, init_blocks + local_blocks).
    #[getter]
    fn width(&self) -> usize {
        self.0.width()
    }

    fn __repr__(&self) -> String {
        let c = self.0;
        format!(
            "BlockSparseConfig(block_size={}, top_blocks={}, init_blocks={}, local_blocks={})",
            c.block_size, c.top_blocks, c.init_blocks, c.local_blocks
        )
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (Bound<'py, PyType>, (usize, usize, usize, usize)) {
        let c = slf.get().0;
        let fields = (c.block_size, c.top_blocks, c.init_blocks, c.local_blocks);
        (slf.get_type(), fields)
    }
}

/// The `config` argument: a `BlockSparseConfig`, or None for the defaults.
pub(in crate::python) fn config(obj: Opt<'_, '_>) -> PyResult<BlockSparseConfig> {
    let Some(c) = obj else {
        return Ok(BlockSparseConfig::default());
    };
    let wrong = |_| {
        let got = type_name(c);
        PyTypeError::new_err(format!(
            "config must be a kvselect.BlockSparseConfig or None, got {got}"
        ))
    };
    c.cast::<PyBlockSparseConfig>()
        .map(|c| c.get().0)
        .map_err(wrong)
}
