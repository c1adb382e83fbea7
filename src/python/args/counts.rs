//! Counts and positions: Python integers and integer arrays read as
//! sizes and token positions.
//!
//! Reads counts (`topk`, `block_size`, `context_len`, …), position arrays
//! (`cu_seqlens`, `seq_ids`, `seq_lens`) and `query_pos`. The rule: a count
//! is a Python integer, and a negative or oversized one is a `ValueError`
//! subclass naming the real bound, never `OverflowError`; a position array
//! is integers, each non-negative (a negative one refused naming its
//! index), of exactly the length the other arguments fix; `query_pos` is
//! read by one reader, [`query_positions`], whose [`Broadcast`] policy each call
//! site states.

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyTuple};

use super::objects::{numpy, Opt};
use crate::python::errors::{refuse, type_name, Domain};

/// Counts past i32 cannot be honoured by an int32 output anyway: the bound
/// of every count an int32 result holds.
pub(in crate::python) const I32_MAX: u64 = i32::MAX as u64;

/// Python integers as counts, refused in the entry point's domain.
impl Domain {
    /// A non-negative integer argument, at most `max`.
    pub fn count(self, obj: &Bound<'_, PyAny>, name: &str, max: u64) -> PyResult<usize> {
        self.count_within(obj, name, max, max)
    }

    /// An optional [`Domain::count`]: `default` when the argument is None.
    pub fn count_or(self, obj: Opt, name: &str, max: u64, default: usize) -> PyResult<usize> {
        obj.map_or(Ok(default), |o| self.count(o, name, max))
    }

    /// [`Domain::count`] whose refusal names `bound` (the rule's real bound,
    /// which the core enforces) for a value past `max` (what can be taken).
    pub fn count_within(
        self,
        obj: &Bound<'_, PyAny>,
        name: &str,
        max: u64,
        bound: u64,
    ) -> PyResult<usize> {
        let negative = || {
            refuse(
                self,
                name,
                format!("{name} must be non-negative, got {obj}"),
            )
        };
        let too_large = || refuse(self, name, format!("{name} is too large: at most {bound}"));
        let value = match obj.extract::<u64>() {
            Ok(v) => v,
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                return Err(if obj.lt(0i64)? {
                    negative()
                } else {
                    too_large()
                });
            }
            // The extraction error's own text ("TypeError: 'str' object
            // cannot be interpreted…") would only repeat this.
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "{name} must be an integer, got {}",
                    type_name(obj)
                )))
            }
        };
        // u64 fits usize on every 64-bit target this wheel is built for.
        (value <= max)
            .then_some(value as usize)
            .ok_or_else(too_large)
    }
}

/// A 1-D array of positions (any integer dtype) as `usize`: one small copy
/// of `n` entries; a negative entry is refused, naming its index.
pub(in crate::python) fn positions(
    args: Domain,
    obj: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<Vec<usize>> {
    let p = args.input::<i64, 1>(obj, name, "[n]")?;
    non_negative(args, p.slice()?, name)
}

/// `p` as positions, a negative entry refused naming its index.
pub(in crate::python) fn non_negative(args: Domain, p: &[i64], name: &str) -> PyResult<Vec<usize>> {
    p.iter()
        .enumerate()
        .map(|(i, &v)| {
            usize::try_from(v)
                .map_err(|_| refuse(args, name, format!("{name}[{i}] = {v} is negative")))
        })
        .collect()
}

/// A packed batch on given compressed keys (InfLLM-v2's varlen call; NSA's
/// on the same arguments): each sequence's tokens (`seq_len`, one a
/// sequence), its queries' and its compressed keys' boundaries
/// (`cu_seqlens_q`, `cu_seqlens_k`), as the core's
/// [`CompressedBatch`](crate::keys::CompressedBatch) names them.
pub(in crate::python) struct CompressedSeqs {
    pub(in crate::python) seq_lens: Vec<usize>,
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
}

impl CompressedSeqs {
    /// The packed batch, if any: both boundaries or neither (the missing
    /// one named), each sequence's length an int32 position (`seq_len`).
    /// The core checks the rest (rising boundaries, the keys' count).
    pub(in crate::python) fn read(
        args: Domain,
        seq_len: &Bound<'_, PyAny>,
        (cu_seqlens_q, cu_seqlens_k): (Opt<'_, '_>, Opt<'_, '_>),
    ) -> PyResult<Option<Self>> {
        let batch = match (cu_seqlens_q, cu_seqlens_k) {
            (None, None) => return Ok(None),
            (Some(cq), Some(ck)) => Self {
                seq_lens: positions(args, seq_len, "seq_len")?,
                cu_q: positions(args, cq, "cu_seqlens_q")?,
                cu_k: positions(args, ck, "cu_seqlens_k")?,
            },
            (None, Some(_)) => {
                let msg = "a packed batch takes cu_seqlens_q with cu_seqlens_k";
                return Err(refuse(args, "cu_seqlens_q", msg));
            }
            (Some(_), None) => {
                let msg = "a packed batch takes cu_seqlens_k with cu_seqlens_q";
                return Err(refuse(args, "cu_seqlens_k", msg));
            }
        };
        let past = batch
            .seq_lens
            .iter()
            .enumerate()
            .find(|(_, &l)| l as u64 > I32_MAX);
        if let Some((s, &l)) = past {
            let msg = format!("seq_len[{s}] = {l} is past an int32 position");
            return Err(refuse(args, "seq_len", msg));
        }
        Ok(Some(batch))
    }

    /// The batch as the core takes it.
    pub(in crate::python) fn core(&self) -> crate::keys::CompressedBatch<'_> {
        crate::keys::CompressedBatch {
            seq_lens: &self.seq_lens,
            cu_seqlens_q: &self.cu_q,
            cu_seqlens_k: &self.cu_k,
        }
    }
}

/// [`positions`] whose one axis the other arguments fix: refused, naming
/// both shapes, unless `obj` is exactly `[axis.0=axis.1]` (a `[1, n]`
/// reshape is refused as such, not read as `[n]`).
pub(in crate::python) fn positions_along(
    args: Domain,
    obj: &Bound<'_, PyAny>,
    name: &str,
    axis: (&str, usize),
) -> PyResult<Vec<usize>> {
    let (p, shape) = args.input_dyn::<i64>(obj, name)?;
    args.axes(name, &shape, &[axis])?;
    non_negative(args, p.slice()?, name)
}

/// How many queries a `query_pos` argument serves, as the other arguments
/// fix it.
#[derive(Clone, Copy)]
pub(in crate::python) enum Queries<'a> {
    /// As many as it holds: `[n]` of any length, or one integer (a 0-D
    /// array too) for a batch of one query, read as `[p]` (the selectors
    /// and the compressed forms, whose query axis `query_pos` fixes).
    AsMany,
    /// One query (block selection with a 2-D `index_q`): one integer; an
    /// array, a list or a tuple is refused, naming the batched form.
    One,
    /// Exactly `n` along the axis named here (`index_q`'s `n_queries`,
    /// `blocks`' `rows`): `[axis=n]`, refused naming both shapes otherwise
    /// (a `[1, n]` reshape as such, not read as `[n]`).
    Along(&'a str, usize),
}

/// Whether one integer may stand for every query of a batch (meaningful
/// with [`Queries::Along`]; the other forms serve one query or fix their
/// own count, and take [`Broadcast::Refuse`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::python) enum Broadcast {
    /// One integer is one query's position: read as `[p]` for a batch of
    /// one, refused for a batch of more. Every entry point that scores
    /// keys takes this: its positions come from the engine one per query,
    /// and broadcasting one over many queries would hide a forgotten array.
    Refuse,
    /// One integer, or a `[1]` array, is every row's (the core broadcasts
    /// a length-1 list). Only `positions_of_blocks` takes this, for
    /// `query_pos` and `n_positions`: it maps a selection's rows back to
    /// token positions, and the rows of one decode step (every head, every
    /// row of one query) share one position and one sequence length.
    Allow,
}

/// The one reader of `query_pos` (and of `positions_of_blocks`'
/// `n_positions`, read alike): the positions of the queries a call serves,
/// as `queries` fixes their count and `broadcast` says whether one integer
/// stands for all of them. A DLPack producer is read through its view.
///
/// How one integer is told from an array, and its bound, are kept as each
/// form has always read them: with [`Queries::One`] and
/// [`Broadcast::Allow`] anything but a list, a tuple or an array of rank > 0
/// (an ndarray, or what `numpy.ndim` reads as one) is read as an integer;
/// otherwise `numpy.ndim` decides (0 is one integer). One integer is at
/// most 2**63 - 1, or 2**64 - 1 where it is broadcast.
pub(in crate::python) fn query_positions(
    domain: Domain,
    obj: &Bound<'_, PyAny>,
    name: &str,
    queries: Queries<'_>,
    broadcast: Broadcast,
) -> PyResult<Vec<usize>> {
    let obj = &domain.arg(obj, name)?;
    // Anything else NumPy reads as an array of rank > 0 (a `memoryview`, an
    // object with `__array_interface__`) is one too.
    let array_like = || {
        obj.cast::<PyUntypedArray>().is_ok_and(|a| a.ndim() > 0)
            || obj.cast::<PyList>().is_ok()
            || obj.cast::<PyTuple>().is_ok()
            || (obj.cast::<PyInt>().is_err() && numpy_ndim(obj).is_some_and(|n| n > 0))
    };
    match (queries, broadcast) {
        (Queries::One, _) => {
            if array_like() {
                return Err(refuse(
                    domain,
                    name,
                    format!(
                        "with a 2-D index_q (one query), {name} must be one integer; pass a 3-D \
                         index_q [n_queries, n_kv_heads, d] for a batch"
                    ),
                ));
            }
            Ok(vec![domain.count(obj, name, i64::MAX as u64)?])
        }
        (Queries::Along(axis, n), Broadcast::Allow) => {
            if !array_like() {
                return Ok(vec![domain.count(obj, name, u64::MAX)?]);
            }
            let (p, shape) = domain.input_dyn::<i64>(obj, name)?;
            if shape != [1] {
                domain.axes(name, &shape, &[(axis, n)])?;
            }
            non_negative(domain, p.slice()?, name)
        }
        (queries, Broadcast::Refuse | Broadcast::Allow) => {
            // A Python int, a NumPy integer or a 0-D array (`numpy.ndim` is 0).
            let ndim: usize = numpy(obj.py())?.call_method1("ndim", (obj,))?.extract()?;
            match (ndim, queries) {
                (0, Queries::Along(axis, n)) if n != 1 => {
                    domain.count(obj, name, i64::MAX as u64)?;
                    let msg = format!(
                        "{name} is one integer (a batch of one query), but index_q has \
                         {axis}={n}: pass {name} [{axis}={n}]"
                    );
                    Err(refuse(domain, name, msg))
                }
                (0, _) => Ok(vec![domain.count(obj, name, i64::MAX as u64)?]),
                (_, Queries::Along(axis, n)) => positions_along(domain, obj, name, (axis, n)),
                _ => positions(domain, obj, name),
            }
        }
    }
}

/// `numpy.ndim(obj)`, None where NumPy cannot read `obj`.
fn numpy_ndim(obj: &Bound<'_, PyAny>) -> Option<usize> {
    numpy(obj.py())
        .ok()?
        .call_method1("ndim", (obj,))
        .ok()?
        .extract()
        .ok()
}
