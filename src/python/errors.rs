//! The one place where refusals become Python exceptions.
//!
//! One base class, `kvselect.KvselectError` (a `ValueError`), with one
//! subclass per domain: `WitnessError` for the witness functions and their
//! metrics in every form, `SelectionError` for block selection, the
//! selectors and attention. Every refusal carries `argument` (the argument
//! at fault) and `variant` (the core error's variant name, or None for a
//! refusal the bindings make themselves, such as a bad buffer), and the
//! variant's integer fields as attributes — read from the core error's
//! serialised form, so a field the core adds is an attribute with no change
//! here. An output too large to allocate is a `MemoryError`.

use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString};
use serde::Serialize;

use crate::error::ArgumentError;
use crate::witness::WitnessError as CoreWitnessError;

pyo3::create_exception!(
    kvselect,
    KvselectError,
    PyValueError,
    "A refused kvselect call (a ValueError): the base class of WitnessError and\n\
     SelectionError, raised itself by the thread controls.\n\n\
     `argument` names the argument at fault; `variant` names the core's refusal\n\
     (or is None when the bindings refuse an argument themselves, such as a\n\
     buffer that cannot be written); the variant's fields are attributes too."
);
pyo3::create_exception!(
    kvselect,
    WitnessError,
    KvselectError,
    "A refused segment-witness call, or one of its metrics (a ValueError).\n\n\
     `variant` names the spec's refusal (\"RowsMismatch\", \"SegmentsOutOfRange\",\n\
     \"LearnedKeepOutOfRange\") or is None for an argument the bindings refuse\n\
     (a bad buffer, a negative count); `argument` names the argument at fault,\n\
     and the variant's fields (learned_len, topk, rows, num_segments,\n\
     learned_keep) are attributes too."
);
pyo3::create_exception!(
    kvselect,
    SelectionError,
    KvselectError,
    "A refused block-selection, selector or attention call (a ValueError);\n\
     `argument` names the argument at fault, `variant` the core's refusal."
);

/// Which exception class a refusal raises.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Domain {
    Witness,
    Selection,
    /// Neither: the thread controls.
    Base,
}

/// The exception of `domain` for `message`, with its `argument`, and the
/// `variant` tag and every integer field of `core`, the core's error as it
/// serialises (`variant` None for a refusal the bindings make themselves).
fn raise<E: Serialize>(domain: Domain, argument: &str, message: String, core: Option<&E>) -> PyErr {
    let err = match domain {
        Domain::Witness => WitnessError::new_err(message),
        Domain::Selection => SelectionError::new_err(message),
        Domain::Base => KvselectError::new_err(message),
    };
    Python::attach(|py| {
        let v = err.value(py);
        // Setting attributes on a fresh exception instance cannot fail
        // short of memory exhaustion, and the exception is raised anyway.
        let _ = v.setattr("argument", argument);
        let _ = v.setattr("variant", py.None());
        let fields = core.and_then(|e| pythonize::pythonize(py, e).ok());
        let fields = fields.and_then(|f| f.cast_into::<PyDict>().ok());
        for (name, value) in fields.iter().flatten() {
            let Ok(name) = name.cast_into::<PyString>() else {
                continue;
            };
            if value.is_instance_of::<PyInt>() || name == "variant" {
                let _ = v.setattr(name, value);
            }
        }
    });
    err
}

/// The name of `obj`'s type, for a `TypeError`'s "got …" (the argument
/// layer's and the DLPack reader's alike).
pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// A refusal the bindings make themselves (`variant` None).
pub(super) fn refuse(domain: Domain, argument: &str, message: impl Into<String>) -> PyErr {
    raise::<()>(domain, argument, message.into(), None)
}

impl From<CoreWitnessError> for PyErr {
    fn from(e: CoreWitnessError) -> PyErr {
        raise(Domain::Witness, e.argument(), e.to_string(), Some(&e))
    }
}

impl From<ArgumentError> for PyErr {
    fn from(e: ArgumentError) -> PyErr {
        argument_error(Domain::Selection, e)
    }
}

/// An argument refusal raised as a `WitnessError` (the batched witness
/// metrics report through the crate's argument error).
pub(super) struct Witness(pub ArgumentError);

impl From<Witness> for PyErr {
    fn from(Witness(e): Witness) -> PyErr {
        argument_error(Domain::Witness, e)
    }
}

/// An argument refusal in `domain`; a shape or result too large is a
/// `MemoryError`.
fn argument_error(domain: Domain, e: ArgumentError) -> PyErr {
    match e {
        ArgumentError::TooLarge { .. } | ArgumentError::OutputTooLarge { .. } => {
            PyMemoryError::new_err(e.to_string())
        }
        _ => raise(domain, e.argument(), e.to_string(), Some(&e)),
    }
}
