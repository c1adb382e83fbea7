//! Refusals shared by more than one module, and the size checks that build
//! them.
//!
//! [`AttentionError`] is what the attention pass, the baseline selectors and
//! the metrics refuse with (all three take the same shapes); it is
//! re-exported as `kvselect::attention::AttentionError`. [`product`], the
//! overflow-checked element count of a shape, serves block selection's
//! checks too. (`block_sparse::SelectionError` and
//! `witness::WitnessError` stay with their modules: their variants differ,
//! and they are public API as they are.)

use std::fmt;

/// A refused selector, attention or metrics call. Every message names the
/// argument it is about, and nothing is written to an output buffer before
/// every check has passed. Serialises as its fields with the variant's name
/// under `variant`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "variant")]
pub enum AttentionError {
    /// A buffer's length does not match the shape the other arguments give
    /// it.
    Length {
        /// The offending argument.
        argument: &'static str,
        /// Entries the shape needs.
        expected: usize,
        /// Entries the buffer has.
        actual: usize,
        /// How `expected` was computed.
        shape: String,
    },
    /// A dimension, stride, width or parameter is unusable.
    Invalid {
        /// The offending argument.
        argument: &'static str,
        /// The full message.
        message: String,
    },
    /// An entry of an argument is out of range.
    OutOfRange {
        /// The offending argument.
        argument: &'static str,
        /// The entry's index within the argument.
        index: usize,
        /// The full message.
        message: String,
    },
    /// A shape whose element count does not fit in `usize`.
    TooLarge {
        /// The argument whose size overflowed.
        argument: &'static str,
    },
}

impl AttentionError {
    /// The argument the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            AttentionError::Length { argument, .. }
            | AttentionError::Invalid { argument, .. }
            | AttentionError::OutOfRange { argument, .. }
            | AttentionError::TooLarge { argument } => argument,
        }
    }
}

impl fmt::Display for AttentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionError::Length {
                argument,
                expected,
                actual,
                shape,
            } => write!(
                f,
                "{argument} has {actual} entries, expected {expected} ({shape})"
            ),
            AttentionError::Invalid { message, .. }
            | AttentionError::OutOfRange { message, .. } => f.write_str(message),
            AttentionError::TooLarge { argument } => {
                write!(f, "{argument} is too large: its size overflows usize")
            }
        }
    }
}

impl std::error::Error for AttentionError {}

/// `Π factors`, or `None` if it overflows `usize`: the element count of a
/// flat row-major shape, as every module's size checks compute it.
pub(crate) fn product(factors: &[usize]) -> Option<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
}

/// `Π factors`, or `TooLarge` naming `argument`.
pub(crate) fn checked_size(
    argument: &'static str,
    factors: &[usize],
) -> Result<usize, AttentionError> {
    product(factors).ok_or(AttentionError::TooLarge { argument })
}

/// Refuses `actual != expected`.
pub(crate) fn check_len(
    argument: &'static str,
    actual: usize,
    expected: usize,
    shape: impl FnOnce() -> String,
) -> Result<(), AttentionError> {
    if actual != expected {
        return Err(AttentionError::Length {
            argument,
            expected,
            actual,
            shape: shape(),
        });
    }
    Ok(())
}
