//! The crate's one argument error, and the size checks that build it.
//!
//! [`ArgumentError`] is what every module but the segment witness refuses
//! with: block selection, the baseline selectors, the attention pass, the
//! metrics, the indexer, the key formats and the checkers. Its one public
//! path is the crate root, `kvselect::ArgumentError`. [`product`] and
//! [`checked_size`] are the overflow-checked element count of a shape that
//! every module's size checks use. (`witness::WitnessError` stays with its
//! module: its variants are the spec's refusals.)

use std::fmt;

/// A refused call: an argument that does not fit the others, an entry out of
/// range, or a shape or result too large. Every message names the argument
/// it is about, and nothing is written to an output buffer before every
/// check has passed. Serialises as its fields with the variant's name under
/// `variant`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "variant")]
pub enum ArgumentError {
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
    /// An output buffer has the wrong number of slots.
    OutputSize {
        /// The offending argument (`out`).
        argument: &'static str,
        /// Slots the call needs.
        expected: usize,
        /// Slots the buffer has.
        actual: usize,
        /// How `expected` was computed.
        shape: String,
    },
    /// A dimension, stride, width, shape or parameter is unusable.
    Invalid {
        /// The offending argument.
        argument: &'static str,
        /// The full message.
        message: String,
    },
    /// A [`BlockSparseConfig`](crate::block_sparse::BlockSparseConfig) that
    /// can select nothing (`block_size == 0`, or `top_blocks == 0` with no
    /// forced blocks).
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// The full message.
        message: String,
    },
    /// An entry of an argument (a position, sequence id, sequence boundary,
    /// index) is out of range.
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
    /// A result too large to allocate.
    OutputTooLarge {
        /// What was being built.
        argument: &'static str,
        /// Entries it would hold.
        len: usize,
    },
}

impl ArgumentError {
    /// The argument (or config field) the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            ArgumentError::InvalidConfig { field, .. } => field,
            ArgumentError::Length { argument, .. }
            | ArgumentError::OutputSize { argument, .. }
            | ArgumentError::Invalid { argument, .. }
            | ArgumentError::OutOfRange { argument, .. }
            | ArgumentError::TooLarge { argument }
            | ArgumentError::OutputTooLarge { argument, .. } => argument,
        }
    }
}

impl fmt::Display for ArgumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgumentError::Length {
                argument,
                expected,
                actual,
                shape,
            } => write!(
                f,
                "{argument} has {actual} entries, expected {expected} ({shape})"
            ),
            ArgumentError::OutputSize {
                argument,
                expected,
                actual,
                shape,
            } => write!(
                f,
                "{argument} has {actual} slots, expected {expected} ({shape})"
            ),
            ArgumentError::Invalid { message, .. } | ArgumentError::OutOfRange { message, .. } => {
                f.write_str(message)
            }
            ArgumentError::InvalidConfig { message, .. } => {
                write!(f, "invalid BlockSparseConfig: {message}")
            }
            ArgumentError::TooLarge { argument } => {
                write!(f, "{argument} is too large: its size overflows usize")
            }
            ArgumentError::OutputTooLarge { argument, len } => write!(
                f,
                "{argument} would hold {len} entries, more than can be allocated"
            ),
        }
    }
}

impl std::error::Error for ArgumentError {}

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
) -> Result<usize, ArgumentError> {
    product(factors).ok_or(ArgumentError::TooLarge { argument })
}

/// Refuses `actual != expected`.
pub(crate) fn check_len(
    argument: &'static str,
    actual: usize,
    expected: usize,
    shape: impl FnOnce() -> String,
) -> Result<(), ArgumentError> {
    if actual != expected {
        return Err(ArgumentError::Length {
            argument,
            expected,
            actual,
            shape: shape(),
        });
    }
    Ok(())
}
