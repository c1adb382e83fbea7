//! The Python objects as the argument layer names them: an argument, an
//! optional one, the output array types, and the `numpy` module.
//!
//! Reads nothing: it names. The rule: an optional argument is `None` when
//! the caller passed None or nothing, and NumPy is imported once.

use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// A Python argument.
pub(in crate::python) type Obj<'py> = Bound<'py, PyAny>;
/// An optional Python argument (`out=`, `config=`, `width=`).
pub(in crate::python) type Opt<'a, 'py> = Option<&'a Bound<'py, PyAny>>;
/// Output arrays.
pub(in crate::python) type I32<'py> = Bound<'py, PyArrayDyn<i32>>;
pub(in crate::python) type F64<'py> = Bound<'py, PyArrayDyn<f64>>;

/// The `numpy` module, imported once.
pub(in crate::python) fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))
        .map(|m| m.bind(py))
}
