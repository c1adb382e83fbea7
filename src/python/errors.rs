//! The one place where refusals become Python exceptions.
//!
//! One base class, `kvselect.KvselectError` (a `ValueError`), with one
//! subclass per domain: `WitnessError` for the witness functions and their
//! metrics in every form, `SelectionError` for block selection, the
//! selectors and attention. Every refusal carries `argument` (the argument
//! at fault) and `variant` (the core error's variant name, or None for a
//! refusal the bindings make themselves, such as a bad buffer), and the
//! variant's integer fields as attributes. An output too large to allocate
//! is a `MemoryError`.

use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;

use crate::attention::AttentionError;
use crate::block_sparse::SelectionError as CoreSelectionError;
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

/// A refusal on its way to Python.
pub(super) struct Refusal {
    pub domain: Domain,
    pub argument: String,
    pub variant: Option<&'static str>,
    pub message: String,
    pub fields: Vec<(&'static str, usize)>,
}

impl Refusal {
    /// A core refusal of `argument` with the variant's name and fields.
    fn core(
        domain: Domain,
        argument: &str,
        variant: &'static str,
        message: String,
        fields: Vec<(&'static str, usize)>,
    ) -> Self {
        Refusal {
            domain,
            argument: argument.to_string(),
            variant: Some(variant),
            message,
            fields,
        }
    }

    /// The same refusal raised in another domain (a witness metric's
    /// batched form reports through the attention module's errors).
    pub fn in_domain(mut self, domain: Domain) -> Self {
        self.domain = domain;
        self
    }
}

impl From<Refusal> for PyErr {
    fn from(r: Refusal) -> PyErr {
        let err = match r.domain {
            Domain::Witness => WitnessError::new_err(r.message),
            Domain::Selection => SelectionError::new_err(r.message),
            Domain::Base => KvselectError::new_err(r.message),
        };
        Python::attach(|py| {
            let v = err.value(py);
            // Setting attributes on a fresh exception instance cannot fail
            // short of memory exhaustion, and the exception is raised anyway.
            let _ = v.setattr("argument", &r.argument);
            let _ = v.setattr("variant", r.variant);
            for (field, value) in r.fields {
                let _ = v.setattr(field, value);
            }
        });
        err
    }
}

/// A refusal the bindings make themselves (`variant` None).
pub(super) fn refuse(domain: Domain, argument: &str, message: impl Into<String>) -> PyErr {
    Refusal {
        domain,
        argument: argument.to_string(),
        variant: None,
        message: message.into(),
        fields: vec![],
    }
    .into()
}

impl From<CoreWitnessError> for Refusal {
    fn from(e: CoreWitnessError) -> Self {
        use CoreWitnessError as E;
        let (variant, argument, fields, message) = match e {
            E::RowsMismatch {
                learned_len,
                topk,
                rows,
            } => (
                "RowsMismatch",
                "context_lens",
                vec![("learned_len", learned_len), ("topk", topk), ("rows", rows)],
                format!(
                    "the rows hold {learned_len} entries, {} rows of topk={topk}, but \
                     context_lens has {rows} lengths: every row needs its context length",
                    learned_len.checked_div(topk).unwrap_or(0)
                ),
            ),
            E::SegmentsOutOfRange { num_segments } => (
                "SegmentsOutOfRange",
                "num_segments",
                vec![("num_segments", num_segments)],
                e.to_string(),
            ),
            E::LearnedKeepOutOfRange { learned_keep, topk } => (
                "LearnedKeepOutOfRange",
                "learned_keep",
                vec![("learned_keep", learned_keep), ("topk", topk)],
                e.to_string(),
            ),
        };
        Refusal::core(Domain::Witness, argument, variant, message, fields)
    }
}

impl From<CoreSelectionError> for Refusal {
    fn from(e: CoreSelectionError) -> Self {
        use CoreSelectionError as E;
        let (variant, fields) = match e {
            E::InvalidConfig { .. } => ("InvalidConfig", vec![]),
            E::ShapeMismatch { .. } => ("ShapeMismatch", vec![]),
            E::OutOfRange { index, .. } => ("OutOfRange", vec![("index", index)]),
            E::OutputSize {
                expected, actual, ..
            } => (
                "OutputSize",
                vec![("expected", expected), ("actual", actual)],
            ),
            E::OutputTooLarge { len, .. } => ("OutputTooLarge", vec![("len", len)]),
        };
        Refusal::core(
            Domain::Selection,
            e.argument(),
            variant,
            e.to_string(),
            fields,
        )
    }
}

impl From<AttentionError> for Refusal {
    fn from(e: AttentionError) -> Self {
        use AttentionError as E;
        let (variant, fields) = match e {
            E::Length {
                expected, actual, ..
            } => ("Length", vec![("expected", expected), ("actual", actual)]),
            E::Invalid { .. } => ("Invalid", vec![]),
            E::OutOfRange { index, .. } => ("OutOfRange", vec![("index", index)]),
            E::TooLarge { .. } => ("TooLarge", vec![]),
        };
        Refusal::core(
            Domain::Selection,
            e.argument(),
            variant,
            e.to_string(),
            fields,
        )
    }
}

impl From<CoreWitnessError> for PyErr {
    fn from(e: CoreWitnessError) -> PyErr {
        Refusal::from(e).into()
    }
}

impl From<CoreSelectionError> for PyErr {
    fn from(e: CoreSelectionError) -> PyErr {
        if let CoreSelectionError::OutputTooLarge { .. } = e {
            return PyMemoryError::new_err(e.to_string());
        }
        Refusal::from(e).into()
    }
}

impl From<AttentionError> for PyErr {
    fn from(e: AttentionError) -> PyErr {
        if let AttentionError::TooLarge { .. } = e {
            return PyMemoryError::new_err(e.to_string());
        }
        Refusal::from(e).into()
    }
}

/// An attention-module refusal raised as a `WitnessError` (the batched
/// witness metrics report through the attention module's errors).
pub(super) struct Witness(pub AttentionError);

impl From<Witness> for PyErr {
    fn from(Witness(e): Witness) -> PyErr {
        if let AttentionError::TooLarge { .. } = e {
            return PyMemoryError::new_err(e.to_string());
        }
        Refusal::from(e).in_domain(Domain::Witness).into()
    }
}
