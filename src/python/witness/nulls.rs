//! The null models witnesses are measured against: random and local
//! selections of the same budget.
//!
//! Reads `context_len`, the budget and a seed. The rule: every count fits
//! int32, and a null is reproducible from its seed.

use numpy::PyArrayDyn;
use pyo3::prelude::*;

use crate::python::args::{detach, Obj, Opt, I32_MAX, W};
use crate::witness;

/// The random null: ``min(budget, context_len)`` tokens drawn uniformly.
///
/// Drawn without replacement from ``[0, context_len)``, ascending, deterministic in
/// ``seed`` (row ``L - 1`` of ``Selector.random(budget, seed)``).
///
/// Parameters
/// ----------
/// context_len : int
///     The row's length ``L``, 0 to 2**31 - 1.
/// budget : int
///     How many tokens to draw, 0 to 2**64 - 1 (capped at ``L``).
/// seed : int
///     The seed, 0 to 2**64 - 1.
/// out : ndarray of int32, [min(budget, context_len)], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [min(budget, context_len)]
///     The drawn tokens, ascending.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
///     2**31 - 1, or an argument is negative or above 2**64 - 1.
///     Also when ``out`` is refused (its shape, layout or read-only).
/// TypeError
///     when an argument is not an integer (a float, ``np.float64``, a string).
///     Also when ``out`` is not an int32 ndarray.
#[pyfunction]
#[pyo3(signature = (context_len, budget, seed, *, out=None))]
pub(super) fn random_null<'py>(
    py: Python<'py>,
    context_len: &Obj<'py>,
    budget: &Obj<'py>,
    seed: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let len = W.count(context_len, "context_len", I32_MAX)?;
    let budget = W.count(budget, "budget", u64::MAX)?;
    let seed = W.count(seed, "seed", u64::MAX)? as u64;
    let out = W.output(py, out, &[budget.min(len)], &[])?;
    let v = detach(py, budget.min(len), || {
        witness::random_null(len, budget, seed)
    });
    out.deliver(v.into_iter())
}

/// The locality null: the ``min(budget, context_len)`` most recent tokens.
///
/// The tokens ``[L - k, L)``, ``k = min(budget, L)`` (row ``L - 1`` of
/// ``Selector.local(budget)``).
///
/// Parameters
/// ----------
/// context_len : int
///     The row's length ``L``, 0 to 2**31 - 1.
/// budget : int
///     How many tokens to keep, 0 to 2**64 - 1 (capped at ``L``).
/// out : ndarray of int32, [min(budget, context_len)], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [min(budget, context_len)]
///     ``L - k, ..., L - 1``.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
///     2**31 - 1, or an argument is negative or above 2**64 - 1.
///     Also when ``out`` is refused (its shape, layout or read-only).
/// TypeError
///     when an argument is not an integer (a string, a float).
///     Also when ``out`` is not an int32 ndarray.
#[pyfunction]
#[pyo3(signature = (context_len, budget, *, out=None))]
pub(super) fn locality_null<'py>(
    py: Python<'py>,
    context_len: &Obj<'py>,
    budget: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let len = W.count(context_len, "context_len", I32_MAX)?;
    let budget = W.count(budget, "budget", u64::MAX)?;
    let out = W.output(py, out, &[budget.min(len)], &[])?;
    out.deliver(witness::locality_null(len, budget).into_iter())
}
