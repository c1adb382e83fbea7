//! The Python bindings: the only code that knows PyO3 and NumPy.
//!
//! Every entry point reads as "arguments → core call → result": it turns
//! its arguments into checked inputs with the typed argument layer
//! ([`args`]), calls the core with the GIL released when the work is worth
//! it, and lets [`errors`] map the core's refusal to a Python exception.
//! The rules it enforces (`docs/conventions.md`):
//!
//! - **Any array argument** may be a NumPy array or a DLPack producer
//!   (torch, JAX, CuPy): a producer in host memory is read as a zero-copy
//!   ndarray view of its memory ([`dlpack`]), to which every rule below
//!   applies; one elsewhere is refused, naming `.cpu()`.
//! - **Read-only arguments** are read in place when they already have the
//!   right dtype and C order; otherwise one conversion is made when it keeps
//!   the meaning (integer arrays whose values fit; floats to the kernel's
//!   float type), and anything else is refused.
//! - **In-place buffers and `out=` are never converted**, checked on every
//!   call (the off switch included) and refused when they overlap any input
//!   as handed to the core — after conversion, so an alias through a
//!   memoryview or any other buffer-protocol object is caught.
//! - **Counts** are Python integers; a negative or oversized one is a
//!   `ValueError` subclass naming the real bound, never `OverflowError`.
//! - **Outputs are never uninitialised memory** visible to Python: new
//!   arrays are zeroed, except where the core's documented contract writes
//!   every slot (the witness outputs, tested with a sentinel at every size;
//!   the blocks' positions; MoBA's selection, whose core test fills the
//!   output with a sentinel).
//! - **No panic reaches Python**: the core returns `Result` for every
//!   refusal and is handed slices whose lengths match the shapes it is told.
//! - **Option strings** (`key_format`, `query_format`, `page_layout`,
//!   `filler`) are parsed once, as PyO3 extracts them, into typed values
//!   (`args::Named`); an unknown one is refused where it is first used.
//! - **`query_pos`** has one reader (`args::query_positions`), whose
//!   `Broadcast` policy each entry point states: one integer stands for
//!   every row only in `positions_of_blocks`.
//!
//! One module (or folder) per family of entry points, each with `register`
//! as its only hook, named once in the `bindings!` list below (which declares
//! the module and calls its `register`); a folder's `mod.rs` only registers
//! the files beside it. `runtime` holds the thread and SIMD controls. No
//! module imports one that imports it.

#![allow(clippy::too_many_arguments)] // entry points take what their Python signatures take

mod args;
mod cache;
mod errors;

use pyo3::prelude::*;

/// Declares each binding module and registers it, in this order: a binding is
/// one name in the one list below (`mod <name>;` and `<name>::register(m)?`
/// written by the macro, so the two cannot disagree).
macro_rules! bindings {
    ($($name:ident),+ $(,)?) => {
        $(mod $name;)+

        /// Every binding module's entry points added to the module `m`, in
        /// the list's order (the order of `kvselect._core.__all__`).
        fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            $($name::register(m)?;)+
            Ok(())
        }
    };
}

// The binding modules, one name each (a new rule's binding is one more name,
// before `runtime`).
bindings!(
    witness,
    block_sparse,
    attention,
    indexer,
    check,
    dlpack,
    compressed,
    infllm,
    nsa,
    quest,
    vslash,
    moba,
    eviction,
    runtime,
);

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("KvselectError", py.get_type::<errors::KvselectError>())?;
    m.add("WitnessError", py.get_type::<errors::WitnessError>())?;
    m.add("SelectionError", py.get_type::<errors::SelectionError>())?;
    register(m)
}
