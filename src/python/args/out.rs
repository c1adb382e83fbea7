//! Outputs: the caller's buffers (`out=`, in-place arguments) and new
//! arrays, and the core call that writes them.
//!
//! Reads the buffers an entry point writes. The rule: a buffer is never
//! converted or copied — it must already be an ndarray of the output's
//! dtype, C-contiguous, aligned, writeable and of exactly the result's
//! shape, overlapping no input *as handed to the core* — else it is refused
//! and left untouched. A new output is zeroed, except where the core's
//! documented contract writes every slot ([`filled_by_core`], `unsafe`).
//! [`detach`] runs the core call with the GIL released when the work is
//! worth the hand-off.
//!
//! Every NaN a float output holds leaves as the one quiet NaN `0x7FC0_0000`
//! (`f64`: `0x7FF8_0000_0000_0000`, numpy's `np.nan`), [`OutElement`]. The
//! kernels give the same bits at every SIMD level except a NaN's sign and
//! payload: x86's invalid operations make a negative NaN, aarch64's a
//! positive one, and when two NaN operands meet, which one propagates
//! depends on the operand order an instruction encodes (a portable
//! `mul_add` and an AVX2 `vfmadd231ps` differ). No selection reads either
//! (every NaN ranks last); the canonical NaN makes an output's bytes the
//! same at every level and on every architecture, so a dump or a hash
//! compares without `equal_nan`.

use numpy::{
    Element, PyArrayDyn, PyArrayMethods, PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyTuple};

use super::arrays::{is_aligned, is_writeable, may_overlap};
use super::objects::numpy;
use crate::python::errors::{refuse, type_name, Domain};

/// Below this many elements of work the GIL is kept: releasing and
/// re-acquiring it costs more than the call.
pub(in crate::python) const DETACH_MIN: usize = 1 << 14;

/// Outputs above this many bytes are allocated through `numpy.zeros`,
/// which raises `MemoryError` when the allocation fails (and is calloc of
/// fresh pages, about the cost of `numpy.empty`); smaller ones through the
/// C API, which is faster but would turn a failed allocation into a panic.
const BIG_OUTPUT_BYTES: usize = 64 << 20;

/// An output element type: how its values leave (floats' NaNs made the one
/// quiet NaN; integers as written).
pub(in crate::python) trait OutElement: Element {
    /// Rewrites `values` as they leave; the identity for all but floats.
    fn canonicalize(_values: &mut [Self]) {}
}

impl OutElement for f32 {
    fn canonicalize(values: &mut [Self]) {
        for x in values {
            if x.is_nan() {
                *x = f32::NAN;
            }
        }
    }
}

impl OutElement for f64 {
    fn canonicalize(values: &mut [Self]) {
        for x in values {
            if x.is_nan() {
                *x = f64::NAN;
            }
        }
    }
}

impl OutElement for i32 {}
impl OutElement for i64 {}

/// An output buffer borrowed read-write for the call.
pub(in crate::python) struct Out<'py, T: OutElement> {
    rw: PyReadwriteArrayDyn<'py, T>,
}

impl<'py, T: OutElement> Out<'py, T> {
    pub fn slice(&mut self) -> PyResult<&mut [T]> {
        self.rw
            .as_slice_mut()
            .map_err(|e| PyTypeError::new_err(e.to_string()))
    }

    /// A new zeroed output of `shape`.
    pub fn zeros(py: Python<'py>, shape: &[usize]) -> PyResult<Self> {
        Ok(Out {
            rw: zeros::<T>(py, shape)?.try_readwrite()?,
        })
    }

    pub fn shape(&self) -> &[usize] {
        self.rw.shape()
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        self.rw.as_untyped()
    }

    /// The array holding `values`, which a core returned rather than wrote
    /// (as many as the output holds, by the core's contract; else an
    /// internal error, nothing written), finished.
    pub fn deliver(
        mut self,
        values: impl ExactSizeIterator<Item = T>,
    ) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
        let o = self.slice()?;
        if values.len() != o.len() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "internal error: the core gave {} values for an output of {} (please report)",
                values.len(),
                o.len()
            )));
        }
        o.iter_mut().zip(values).for_each(|(d, v)| *d = v);
        Ok(self.finish())
    }

    /// The array, its NaNs canonical ([`OutElement`]), its borrow released.
    pub fn finish(mut self) -> Bound<'py, PyArrayDyn<T>> {
        // An output is C-contiguous (a new array, or a caller's buffer
        // refused unless it is), so the slice is always there.
        if let Ok(values) = self.rw.as_slice_mut() {
            T::canonicalize(values);
        }
        let a: Bound<'py, PyArrayDyn<T>> = (**self.rw).clone();
        drop(self.rw);
        a
    }

    /// Runs the core call `f` on the output's slice (see [`detach`] for
    /// `work`) and hands back the array.
    pub fn run<E: Into<PyErr> + Send>(
        mut self,
        work: usize,
        f: impl FnOnce(&mut [T]) -> Result<(), E> + Send,
    ) -> PyResult<Bound<'py, PyArrayDyn<T>>>
    where
        T: Send,
    {
        let py = self.rw.py();
        let o = self.slice()?;
        detach(py, work, || f(o)).map_err(Into::into)?;
        Ok(self.finish())
    }
}

/// The caller's buffers and new outputs, refused in the entry point's
/// exception domain.
impl Domain {
    /// The caller's buffer for in-place writes: an ndarray of `T`, `ndim`
    /// dims, C-contiguous, aligned, writeable, overlapping none of `inputs`.
    /// Never converted: anything else is refused and left untouched.
    pub fn inplace<'py, T: OutElement>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        ndim: usize,
        inputs: &[&Bound<'py, PyUntypedArray>],
    ) -> PyResult<Out<'py, T>> {
        let obj = &self.arg(obj, name)?;
        let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
            return Err(PyTypeError::new_err(format!(
                "{name} must be a numpy.ndarray or a CPU DLPack tensor (it is written in place; \
                 a torch tensor after .int() if it is int64), got {}",
                type_name(obj)
            )));
        };
        let Ok(arr) = obj.cast::<PyArrayDyn<T>>() else {
            return Err(PyTypeError::new_err(format!(
                "{name} must have dtype {}, got {}: it is written in place, so it is never \
                 converted (torch.topk gives int64: call .int() first)",
                numpy::dtype::<T>(obj.py()),
                untyped.dtype()
            )));
        };
        let fault = if untyped.ndim() != ndim {
            format!(
                "{name} must be {ndim}-D, got {}-D {:?}",
                untyped.ndim(),
                untyped.shape()
            )
        } else if !untyped.is_c_contiguous() {
            format!("{name} is not C-contiguous: it is written in place, so it is never copied")
        } else if !is_aligned(untyped) {
            format!("{name} is not aligned")
        } else if !is_writeable(untyped) {
            format!("{name} is read-only")
        } else if inputs.iter().any(|i| may_overlap(untyped, i)) {
            format!("{name} overlaps another argument's memory")
        } else {
            return arr
                .try_readwrite()
                .map(|rw| Out { rw })
                .map_err(|e| refuse(self, name, format!("{name} cannot be written: {e}")));
        };
        Err(refuse(self, name, fault))
    }

    /// [`Domain::output`] where the core writes every slot of a new output,
    /// which is then not zeroed first (see [`filled_by_core`]).
    ///
    /// # Safety
    /// As [`filled_by_core`]: the output must go whole to a core function
    /// that writes every slot or refuses before writing.
    pub unsafe fn output_filled_by_core<'py>(
        self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
        shape: &[usize],
        inputs: &[&Bound<'py, PyUntypedArray>],
    ) -> PyResult<Out<'py, i32>> {
        match out {
            Some(_) => self.output(py, out, shape, inputs),
            // SAFETY: the caller's contract (above).
            None => unsafe { filled_by_core(py, shape) },
        }
    }

    /// The output of a call: the caller's `out` (checked as
    /// [`Domain::inplace`], and of exactly `shape`) or a new zeroed array.
    pub fn output<'py, T: OutElement>(
        self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
        shape: &[usize],
        inputs: &[&Bound<'py, PyUntypedArray>],
    ) -> PyResult<Out<'py, T>> {
        match out {
            Some(o) => self.buffer(o, "out", shape, inputs),
            None => Out::zeros(py, shape),
        }
    }

    /// The outputs of a call returning `N` arrays: the caller's `out=`, a
    /// tuple of `N` buffers named by `names` (`"(kmin, kmax)"`), each checked
    /// as [`Domain::buffer`] against its shape, the inputs and the buffers
    /// before it; or `N` new zeroed arrays.
    pub fn outputs<'py, T: OutElement, const N: usize>(
        self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
        (names, shapes): (&str, [&[usize]; N]),
        inputs: &[&Bound<'py, PyUntypedArray>],
    ) -> PyResult<[Out<'py, T>; N]> {
        let mut outs = Vec::with_capacity(N);
        match out {
            None => {
                for shape in shapes {
                    outs.push(Out::zeros(py, shape)?);
                }
            }
            Some(o) => {
                let bufs: Vec<Bound<'py, PyAny>> = match o.cast::<PyTuple>() {
                    Ok(t) if t.len() == N => t.iter().collect(),
                    _ => {
                        let count = ["no", "one", "two", "three", "four"]
                            .get(N)
                            .map_or(N.to_string(), |w| w.to_string());
                        return Err(PyTypeError::new_err(format!(
                            "out must be a tuple {names} of {count} {} ndarrays",
                            numpy::dtype::<T>(py)
                        )));
                    }
                };
                // Each buffer as checked (a DLPack tensor's ndarray view, not
                // the object passed), against the inputs and those before it.
                let mut seen: Vec<Bound<'py, PyUntypedArray>> =
                    inputs.iter().map(|&a| a.clone()).collect();
                for (b, shape) in bufs.iter().zip(shapes) {
                    let refs: Vec<&Bound<'py, PyUntypedArray>> = seen.iter().collect();
                    let buf = self.buffer::<T>(b, "out", shape, &refs)?;
                    seen.push(buf.untyped().clone());
                    outs.push(buf);
                }
            }
        }
        Ok(outs
            .try_into()
            .unwrap_or_else(|_| unreachable!("one output per shape")))
    }

    /// The caller's buffer `name` (checked as [`Domain::inplace`]) of exactly
    /// `shape`.
    pub fn buffer<'py, T: OutElement>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        shape: &[usize],
        inputs: &[&Bound<'py, PyUntypedArray>],
    ) -> PyResult<Out<'py, T>> {
        let buf = self.inplace::<T>(obj, name, shape.len(), inputs)?;
        if buf.shape() != shape {
            let msg = format!("{name} must have shape {shape:?}, got {:?}", buf.shape());
            return Err(refuse(self, name, msg));
        }
        Ok(buf)
    }
}

/// A new zeroed array (a failed large allocation is a `MemoryError`, never
/// an abort).
pub(in crate::python) fn zeros<'py, T: Element>(
    py: Python<'py>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let bytes = shape
        .iter()
        .try_fold(std::mem::size_of::<T>(), |a, &n| a.checked_mul(n));
    match bytes {
        Some(b) if b <= BIG_OUTPUT_BYTES => Ok(PyArrayDyn::<T>::zeros(py, shape, false)),
        _ => {
            let kwargs = [("dtype", numpy::dtype::<T>(py))].into_py_dict(py)?;
            Ok(numpy(py)?
                .call_method("zeros", (PyTuple::new(py, shape)?,), Some(&kwargs))?
                .cast_into::<PyArrayDyn<T>>()?)
        }
    }
}

/// A new array whose every element the core overwrites before Python can
/// see it (zero-filling costs as much as the copy the witness merge is
/// measured against). Large outputs are zeroed anyway (`zeros`).
///
/// # Safety
/// The caller must hand the whole array to a core function whose contract
/// is "writes every slot or refuses before writing", and drop it unread on
/// a refusal (each use names the contract it relies on; a test fills the
/// output with a sentinel and checks none survives, at every size).
pub(in crate::python) unsafe fn filled_by_core<'py>(
    py: Python<'py>,
    shape: &[usize],
) -> PyResult<Out<'py, i32>> {
    let bytes = shape.iter().try_fold(4usize, |a, &n| a.checked_mul(n));
    let array = match bytes {
        // SAFETY: the caller's contract (above).
        Some(b) if b <= BIG_OUTPUT_BYTES => unsafe { PyArrayDyn::<i32>::new(py, shape, false) },
        _ => zeros::<i32>(py, shape)?,
    };
    Ok(Out {
        rw: array.try_readwrite()?,
    })
}

/// Runs `f` with the GIL released when `work` (elements touched) is worth
/// the hand-off.
pub(in crate::python) fn detach<T: Send>(
    py: Python<'_>,
    work: usize,
    f: impl FnOnce() -> T + Send,
) -> T {
    if work >= DETACH_MIN {
        py.detach(f)
    } else {
        f()
    }
}
