//! The typed argument layer: every entry point turns its Python arguments
//! into checked inputs here, and nowhere else. One file per concern, each
//! stating what it reads and the rule it enforces:
//!
//! - [`arrays`]: an array argument as a borrowed, C-contiguous, aligned
//!   array of the kernel's element type with its shape as `[usize; N]` (or
//!   of any rank) — the caller's own array when it already is one (zero
//!   copy), else one conversion that keeps the meaning ([`arrays::Dtype`]).
//! - [`out`]: the caller's buffer (checked, never converted, overlapping no
//!   input *as handed to the core*) or a new zeroed array, and [`detach`],
//!   the core call with the GIL released when the work is worth it.
//! - [`counts`]: a Python integer as a count, never `OverflowError`;
//!   position arrays; the one `query_pos` reader and its [`Broadcast`]
//!   policy.
//! - [`formats`]: keys and queries in the engines' element formats.
//! - [`options`]: the option strings, parsed once into typed values.
//! - [`strided`]: arrays read in place as rows a stride apart.
//! - [`floats`]: the checkers' float32 / float64 scores, never rounded.
//! - [`renamed`]: keywords renamed in the API, refused naming the new one.
//! - [`objects`]: the names of the objects above (`Obj`, `Opt`, the output
//!   array types) and the `numpy` module.
//!
//! This file only re-exports them: no file below imports it, so the layer
//! has no import cycle (each file imports its siblings, and [`errors`] /
//! [`dlpack`] above it, which import nothing of it).
//!
//! [`errors`]: super::errors
//! [`dlpack`]: super::dlpack
//!
//! Every reader is a method of (or takes) the entry point's exception
//! domain, [`Domain`](crate::python::errors::Domain): `S` (a
//! `SelectionError`) or `W` (a `WitnessError`), named here once.
//!
//! # Releasing the GIL while holding NumPy buffers
//!
//! While a call runs detached, the core reads and writes the arrays'
//! memory through plain slices. rust-numpy's borrow flags keep other Rust
//! extensions out, and our reference to each array keeps it alive and
//! unresizable (`ndarray.resize` refuses while we hold it), but nothing can
//! stop *Python* code in another thread from writing into the same memory
//! through a view or a memoryview while we work. Like `hashlib` and
//! blake3-py with a buffer mutated during hashing, the result is then
//! unspecified: don't mutate an array that a running kvselect call holds.
//! No memory outside the arrays is ever touched; the bounds the core
//! relies on are its own checks against the shapes recorded here.

mod arrays;
mod counts;
mod floats;
mod formats;
mod objects;
mod options;
mod out;
mod renamed;
mod strided;

pub(super) use self::arrays::{convert, ndarray, ndarrays, In, InAnyRank};
pub(super) use self::counts::{
    positions, positions_along, query_positions, Broadcast, CompressedSeqs, Queries, I32_MAX,
};
pub(super) use self::floats::Floats;
pub(super) use self::formats::{element_name, format_of, is_native_order, EncodedIn};
pub(super) use self::objects::{numpy, Obj, Opt, F64, I32};
pub(super) use self::options::{
    AsFormatArg, Choice, FormatArg, KeyFormat, MobaVariantName, Named, PageLayoutName, QueryFormat,
    QuestVariantName, VslashVariantName,
};
pub(super) use self::out::{detach, Out, OutElement};
pub(super) use self::renamed::refuse_extra_keywords;
pub(super) use self::strided::StridedRows;
/// The exception domains, as the entry points name them: `S.count(..)`
/// refuses with a `SelectionError`, `W.count(..)` with a `WitnessError`.
pub(super) use super::errors::Domain::{Selection as S, Witness as W};
