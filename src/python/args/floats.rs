//! The checkers' floats: scores and magnitudes compared as given.
//!
//! Reads `scores`, `block_scores` and `magnitudes` of the checkers. The
//! rule: a float64 array is read as float64 and a float32 one as float32,
//! both in place, so a score is never rounded before it is compared; with
//! `strict`, any other dtype (float16, integers) is a `TypeError`, else it
//! converts to float32 as any float input does.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::arrays::{not_raw_bits, InAnyRank};
use super::objects::numpy;
use crate::python::errors::Domain;

/// A float32 or float64 array argument, read in place either way (scores
/// the checkers compare as given: a float64 one is never rounded).
pub(in crate::python) enum Floats<'py> {
    F32(InAnyRank<'py, f32>),
    F64(InAnyRank<'py, f64>),
}

impl Floats<'_> {
    pub fn values(&self) -> PyResult<crate::check::Values<'_>> {
        Ok(match self {
            Floats::F32(a) => crate::check::Values::F32(a.slice()?),
            Floats::F64(a) => crate::check::Values::F64(a.slice()?),
        })
    }
}

/// Float arguments the checkers compare, refused in the entry point's domain.
impl Domain {
    /// A float argument read as float64 when it is float64, else as
    /// float32: with `strict`, only float32 (or empty) arrays take that
    /// branch and any other dtype (float16, an integer) is a `TypeError`
    /// naming `name`; without, any float converts to float32 as
    /// [`Domain::input_dyn`] does. Returns the array and its shape.
    pub fn floats<'py>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        strict: bool,
    ) -> PyResult<(Floats<'py>, Vec<usize>)> {
        let obj = &self.arg(obj, name)?;
        not_raw_bits(obj, name, "float32 or float64")?;
        let arr = match obj.cast::<PyUntypedArray>() {
            Ok(a) => a.clone().into_any(),
            Err(_) => numpy(obj.py())?.call_method1("asarray", (obj,))?,
        };
        let untyped = arr.cast::<PyUntypedArray>()?;
        let (kind, size, empty) = (
            untyped.dtype().kind(),
            untyped.dtype().itemsize(),
            untyped.len() == 0,
        );
        if kind == b'f' && size == 8 {
            let (a, shape) = self.input_dyn::<f64>(&arr, name)?;
            return Ok((Floats::F64(a), shape));
        }
        if strict && !empty && !(kind == b'f' && size == 4) {
            return Err(PyTypeError::new_err(format!(
                "{name} must be float32 or float64, got dtype {}",
                untyped.dtype()
            )));
        }
        let (a, shape) = self.input_dyn::<f32>(&arr, name)?;
        Ok((Floats::F32(a), shape))
    }
}
