//! The output error of a sparse pass against the dense one, whole and per
//! row.
//!
//! Reads `sparse` and `dense`. The rule: both float32 arrays of exactly the
//! same shape (axis by axis, never by element count).

use pyo3::prelude::*;

use crate::metrics;
use crate::python::args::{Obj, Opt, F64, S};
use crate::python::errors::refuse;

/// ``‖sparse − dense‖ / ‖dense‖`` per row over the last axis.
///
/// Parameters
/// ----------
/// sparse : array_like of float32, [..., width]
///     At least 1-D (other float dtypes converted once). Any CPU DLPack tensor too.
/// dense : array_like of float32, [..., width]
///     Of ``sparse``'s shape, checked axis by axis.
/// out : ndarray of float64, [...], optional
///     Filled in place and returned: exactly the leading shape, C-contiguous, writeable,
///     aligned, native byte order, sharing no input's memory (else refused: a refused call
///     leaves it untouched).
///
/// Returns
/// -------
/// ndarray of float64, [...]
///     Each row's relative error, of the leading shape.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``sparse`` is 0-D, ``dense``
///     has another shape (``dense``), or ``out`` is refused (its shape, layout, read-only,
///     or sharing an input's memory).
/// TypeError
///     when an input is not floats, or ``out`` is not a float64 ndarray.
#[pyfunction]
#[pyo3(signature = (sparse, dense, *, out=None))]
pub(super) fn output_relative_error_rows<'py>(
    py: Python<'py>,
    sparse: &Obj<'py>,
    dense: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F64<'py>> {
    let (s, shape) = S.input_dyn::<f32>(sparse, "sparse")?;
    let (d, dense_shape) = S.input_dyn::<f32>(dense, "dense")?;
    let Some((&width, lead)) = shape.split_last() else {
        let msg = "sparse must be at least 1-D [..., width], got a 0-D array";
        return Err(refuse(S, "sparse", msg));
    };
    same_shape(&shape, &dense_shape)?;
    let out = S.output::<f64>(py, out, lead, &[s.untyped(), d.untyped()])?;
    let (ss, ds) = (s.slice()?, d.slice()?);
    out.run(ss.len(), |os| {
        metrics::output_relative_error_rows(ss, ds, width, os)
    })
}

/// Refuses a `dense` whose shape is not `sparse`'s, axis by axis (the
/// refusal names `dense` and both shapes).
fn same_shape(sparse: &[usize], dense: &[usize]) -> PyResult<()> {
    let names: Vec<String> = (0..sparse.len()).map(|i| format!("axis{i}")).collect();
    let want: Vec<(&str, usize)> = names
        .iter()
        .map(String::as_str)
        .zip(sparse.iter().copied())
        .collect();
    S.axes("dense", dense, &want)
}

/// ``‖sparse − dense‖ / ‖dense‖`` over whole arrays of one shape.
///
/// Parameters
/// ----------
/// sparse : array_like of float32
///     Any shape (other float dtypes converted once). Any CPU DLPack tensor too.
/// dense : array_like of float32
///     Of ``sparse``'s shape, checked axis by axis.
///
/// Returns
/// -------
/// float
///     The relative error, computed in float64.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` is ``dense``) when ``dense`` has another shape.
/// TypeError
///     when an input is not floats.
#[pyfunction]
pub(super) fn output_relative_error(sparse: &Obj, dense: &Obj) -> PyResult<f64> {
    let (s, shape) = S.input_dyn::<f32>(sparse, "sparse")?;
    let (d, dense_shape) = S.input_dyn::<f32>(dense, "dense")?;
    same_shape(&shape, &dense_shape)?;
    Ok(metrics::output_relative_error(s.slice()?, d.slice()?)?)
}
