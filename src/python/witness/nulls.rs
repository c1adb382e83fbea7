//! The null models witnesses are measured against: random and local
//! selections of the same budget.
//!
//! Reads `context_len`, the budget and a seed. The rule: every count fits
//! int32, and a null is reproducible from its seed.

use numpy::PyArray1;
use pyo3::prelude::*;

use crate::python::args::{detach, Obj, I32_MAX, W};
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
/// TypeError
///     when an argument is not an integer (a float, ``np.float64``, a string).
#[pyfunction]
pub(super) fn random_null<'py>(
    py: Python<'py>,
    context_len: &Obj<'py>,
    budget: &Obj<'py>,
    seed: &Obj<'py>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let len = W.count(context_len, "context_len", I32_MAX)?;
    let budget = W.count(budget, "budget", u64::MAX)?;
    let seed = W.count(seed, "seed", u64::MAX)? as u64;
    let v = detach(py, budget.min(len), || {
        witness::random_null(len, budget, seed)
    });
    Ok(PyArray1::from_vec(py, v))
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
/// TypeError
///     when an argument is not an integer (a string, a float).
#[pyfunction]
pub(super) fn locality_null<'py>(
    py: Python<'py>,
    context_len: &Obj<'py>,
    budget: &Obj<'py>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let len = W.count(context_len, "context_len", I32_MAX)?;
    let budget = W.count(budget, "budget", u64::MAX)?;
    Ok(PyArray1::from_vec(py, witness::locality_null(len, budget)))
}
