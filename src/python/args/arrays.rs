//! Array arguments: how an object becomes an array the core reads.
//!
//! Reads any array argument — an ndarray, an array-like, or a DLPack
//! producer through its zero-copy view ([`Domain::arg`]). The rule: an
//! array is read in place when it already is C-contiguous and aligned, of
//! the kernel's element type; otherwise it is converted once, and only when
//! [`Dtype`] says the conversion keeps the meaning (integers whose values
//! fit, floats to the kernel's float type); anything else is refused. Its
//! shape is then checked axis by axis ([`Domain::dims`], [`Domain::axes`]),
//! and [`ndarrays`] / [`may_overlap`] name the memory an output must not
//! share.

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::objects::{numpy, Obj};
use crate::python::dlpack;
use crate::python::errors::{refuse, Domain};

/// An element type a kernel reads, and which arrays convert to it.
pub(in crate::python) trait Dtype: Element + Copy {
    /// What the argument must hold, for the `TypeError`.
    const HOLDS: &'static str;
    /// The NumPy dtype kinds that convert without losing meaning.
    const KINDS: &'static [u8];
    /// For integer targets: the value range; values of a wider input type
    /// are checked against it before converting.
    const RANGE: Option<(i128, i128, &'static str)>;
    /// Whether an input of this kind and item size always fits `RANGE`.
    fn always_fits(kind: u8, itemsize: usize) -> bool;
}

impl Dtype for i32 {
    const HOLDS: &'static str = "integers (int32 offsets)";
    const KINDS: &'static [u8] = b"iu";
    const RANGE: Option<(i128, i128, &'static str)> =
        Some((i32::MIN as i128, i32::MAX as i128, "int32"));
    fn always_fits(kind: u8, itemsize: usize) -> bool {
        (kind == b'i' && itemsize <= 4) || (kind == b'u' && itemsize <= 2)
    }
}

impl Dtype for i64 {
    const HOLDS: &'static str = "integers";
    const KINDS: &'static [u8] = b"iu";
    const RANGE: Option<(i128, i128, &'static str)> =
        Some((i64::MIN as i128, i64::MAX as i128, "int64"));
    fn always_fits(kind: u8, itemsize: usize) -> bool {
        kind == b'i' || (kind == b'u' && itemsize <= 4)
    }
}

impl Dtype for f32 {
    const HOLDS: &'static str = "floats";
    const KINDS: &'static [u8] = b"f";
    const RANGE: Option<(i128, i128, &'static str)> = None;
    fn always_fits(_: u8, _: usize) -> bool {
        true
    }
}

impl Dtype for f64 {
    const HOLDS: &'static str = "floats";
    const KINDS: &'static [u8] = b"f";
    const RANGE: Option<(i128, i128, &'static str)> = None;
    fn always_fits(_: u8, _: usize) -> bool {
        true
    }
}

/// Whether the array's data is aligned for its dtype (`NPY_ARRAY_ALIGNED`).
pub(in crate::python) fn is_aligned(a: &Bound<'_, PyUntypedArray>) -> bool {
    const ALIGNED: i32 = 0x0100;
    // SAFETY: `a` is a live ndarray; reading its flags field is what
    // `PyArray_FLAGS` does.
    unsafe { (*a.as_array_ptr()).fields.flags & ALIGNED != 0 }
}

pub(super) fn is_writeable(a: &Bound<'_, PyUntypedArray>) -> bool {
    const WRITEABLE: i32 = 0x0400;
    // SAFETY: as in `is_aligned` (`PyArray_ISWRITEABLE`).
    unsafe { (*a.as_array_ptr()).fields.flags & WRITEABLE != 0 }
}

/// The one converter: `obj` as a C-contiguous, aligned array of `T`, the
/// caller's own array when it already is one, else one `numpy.require`
/// conversion when `T::KINDS` says it keeps the meaning.
pub(in crate::python) fn convert<'py, T: Dtype>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    domain: Domain,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    if let Ok(a) = obj.cast::<PyArrayDyn<T>>() {
        if a.is_c_contiguous() && is_aligned(a.as_untyped()) {
            return Ok(a.clone());
        }
    }
    let view = dlpack::view(obj, name, domain)?;
    if let Some(v) = &view {
        not_raw_bits(v, name, T::HOLDS)?;
        if let Ok(a) = v.cast::<PyArrayDyn<T>>() {
            if a.is_c_contiguous() && is_aligned(a.as_untyped()) {
                return Ok(a.clone());
            }
        }
    }
    let obj = view.as_ref().unwrap_or(obj);
    let np = numpy(obj.py())?;
    let arr = np.call_method1("asarray", (obj,))?;
    let untyped = arr.cast::<PyUntypedArray>()?;
    let (kind, itemsize, size) = (
        untyped.dtype().kind(),
        untyped.dtype().itemsize(),
        untyped.len(),
    );
    if size > 0 && !T::KINDS.contains(&kind) {
        return Err(PyTypeError::new_err(format!(
            "{name} must hold {}, got dtype {}",
            T::HOLDS,
            untyped.dtype()
        )));
    }
    if let Some((min, max, what)) = T::RANGE {
        if size > 0 && !T::always_fits(kind, itemsize) {
            let lo: i128 = arr.call_method0("min")?.extract()?;
            let hi: i128 = arr.call_method0("max")?.extract()?;
            if lo < min || hi > max {
                return Err(refuse(
                    domain,
                    name,
                    format!("{name} holds values in [{lo}, {hi}], outside {what}"),
                ));
            }
        }
    }
    let kwargs = [("dtype", numpy::dtype::<T>(obj.py()))].into_py_dict(obj.py())?;
    kwargs.set_item("requirements", "CA")?;
    Ok(np
        .call_method("require", (arr,), Some(&kwargs))?
        .cast_into::<PyArrayDyn<T>>()?)
}

/// Refuses a DLPack view of bfloat16 / float8_e4m3fn bits as an argument
/// that must hold `holds` (only keys and queries are read in those formats).
pub(super) fn not_raw_bits(view: &Bound<'_, PyAny>, name: &str, holds: &str) -> PyResult<()> {
    match dlpack::format_tag(view) {
        Some(f) => Err(PyTypeError::new_err(format!(
            "{name} must hold {holds}, got DLPack dtype {}",
            f.name()
        ))),
        None => Ok(()),
    }
}

/// The byte range an array's elements may occupy, `None` when it has none.
fn extent(a: &Bound<'_, PyUntypedArray>) -> Option<(usize, usize)> {
    let shape = a.shape();
    if shape.contains(&0) {
        return None;
    }
    // SAFETY: `a` is a live ndarray; its data pointer is read, not followed.
    let data = unsafe { (*a.as_array_ptr()).fields.data } as isize;
    let (mut lo, mut hi) = (data, data);
    for (&n, &stride) in shape.iter().zip(a.strides()) {
        let span = (n as isize - 1).saturating_mul(stride);
        if span < 0 {
            lo = lo.saturating_add(span);
        } else {
            hi = hi.saturating_add(span);
        }
    }
    let item = a.dtype().itemsize() as isize;
    Some((lo as usize, hi.saturating_add(item) as usize))
}

/// Whether two arrays' memory may overlap (`numpy.may_share_memory`'s
/// bounds test).
pub(super) fn may_overlap(a: &Bound<'_, PyUntypedArray>, b: &Bound<'_, PyUntypedArray>) -> bool {
    match (extent(a), extent(b)) {
        (Some((alo, ahi)), Some((blo, bhi))) => alo < bhi && blo < ahi,
        _ => false,
    }
}

/// An input of rank `N` as the core will read it: converted, shape-checked
/// and borrowed read-only for the call.
pub(in crate::python) struct In<'py, T: Element, const N: usize> {
    ro: PyReadonlyArrayDyn<'py, T>,
    pub shape: [usize; N],
}

/// An input of any rank, converted and borrowed as [`In`] (its shape is
/// handed back beside it, by [`Domain::input_dyn`]).
pub(in crate::python) struct InAnyRank<'py, T: Element> {
    ro: PyReadonlyArrayDyn<'py, T>,
}

/// The elements, row-major, of a borrowed input.
fn elements<'a, T: Element>(ro: &'a PyReadonlyArrayDyn<'_, T>) -> PyResult<&'a [T]> {
    ro.as_slice()
        .map_err(|e| PyTypeError::new_err(e.to_string()))
}

impl<'py, T: Element, const N: usize> In<'py, T, N> {
    /// The elements, row-major.
    pub fn slice(&self) -> PyResult<&[T]> {
        elements(&self.ro)
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        self.ro.as_untyped()
    }
}

impl<'py, T: Element> InAnyRank<'py, T> {
    /// The elements, row-major.
    pub fn slice(&self) -> PyResult<&[T]> {
        elements(&self.ro)
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        self.ro.as_untyped()
    }
}

/// The array arguments of an entry point, read in its exception domain.
impl Domain {
    /// The one way into the argument layer for an object that may be a
    /// DLPack producer: `obj` itself (an ndarray, a list, a scalar), or a
    /// zero-copy ndarray view of a producer's memory ([`dlpack::view`]),
    /// which every rule below then applies to as to any ndarray.
    pub fn arg<'py>(self, obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Obj<'py>> {
        Ok(dlpack::view(obj, name, self)?.unwrap_or_else(|| obj.clone()))
    }

    /// An `N`-D array argument of `T` (`what` describes its axes in
    /// messages, e.g. `"[rows, topk]"`).
    pub fn input<'py, T: Dtype, const N: usize>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        what: &str,
    ) -> PyResult<In<'py, T, N>> {
        let a = convert::<T>(obj, name, self)?;
        let shape = self.dims::<N>(a.as_untyped(), name, what)?;
        Ok(In {
            ro: a.try_readonly()?,
            shape,
        })
    }

    /// An array argument of `T` with any number of dimensions.
    pub fn input_dyn<'py, T: Dtype>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
    ) -> PyResult<(InAnyRank<'py, T>, Vec<usize>)> {
        let a = convert::<T>(obj, name, self)?;
        let shape = a.shape().to_vec();
        Ok((
            InAnyRank {
                ro: a.try_readonly()?,
            },
            shape,
        ))
    }

    /// `a`'s shape as `[usize; N]`, or a refusal naming its `ndim`.
    pub fn dims<const N: usize>(
        self,
        a: &Bound<'_, PyUntypedArray>,
        name: &str,
        what: &str,
    ) -> PyResult<[usize; N]> {
        a.shape().try_into().map_err(|_| {
            refuse(
                self,
                name,
                format!(
                    "{name} must be {N}-D {what}, got {}-D {:?}",
                    a.ndim(),
                    a.shape()
                ),
            )
        })
    }

    /// Refuses `name` unless its shape is `want`, axis by axis. Each axis
    /// of `want` is named with the size the other arguments fix, and the
    /// refusal shows both shapes: `weights must be [n_queries=3, H=4], got
    /// [4, 3]`. (Checking element counts instead would accept a transposed
    /// or reshaped array and read it as another one.)
    pub fn axes(self, name: &str, got: &[usize], want: &[(&str, usize)]) -> PyResult<()> {
        let fits = got.len() == want.len() && got.iter().zip(want).all(|(&g, &(_, w))| g == w);
        if fits {
            return Ok(());
        }
        let want: Vec<String> = want.iter().map(|(a, n)| format!("{a}={n}")).collect();
        let msg = format!("{name} must be [{}], got {got:?}", want.join(", "));
        Err(refuse(self, name, msg))
    }

    /// Refuses query heads (`index_q`) of another dimension than `keys`'.
    pub fn same_d(self, dq: usize, d: usize, keys: &str) -> PyResult<()> {
        if dq == d {
            return Ok(());
        }
        let msg = format!("index_q has d={dq} but {keys} has d={d}");
        Err(refuse(self, "index_q", msg))
    }
}

/// `obj`'s memory as an ndarray, for the overlap check: an argument the
/// core reads through a copy (positions, lengths) is still memory an
/// output must not share, since no input may alias an output whatever the
/// core does with it.
///
/// An ndarray is itself; a DLPack producer is its view (one that cannot be
/// viewed is refused where the argument is read, not here); anything else
/// but a Python number, string or sequence is what `numpy.asarray` makes of
/// it, as the argument's reader does: a view of the caller's memory where it
/// is one (a `memoryview`, an object with `__array_interface__` or
/// `__array__`), else a fresh copy, which overlaps nothing. An object NumPy
/// cannot read gives None: its reader refuses it.
pub(in crate::python) fn ndarray<'py>(obj: &Obj<'py>) -> Option<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Some(a.clone());
    }
    let plain = obj.is_none()
        || obj.cast::<PyList>().is_ok()
        || obj.cast::<PyTuple>().is_ok()
        || obj.cast::<PyInt>().is_ok()
        || obj.cast::<PyFloat>().is_ok()
        || obj.cast::<PyString>().is_ok();
    if plain {
        return None;
    }
    if let Ok(Some(view)) = dlpack::view(obj, "", Domain::Selection) {
        return view.cast_into::<PyUntypedArray>().ok();
    }
    let view = numpy(obj.py()).ok()?.call_method1("asarray", (obj,)).ok()?;
    view.cast_into::<PyUntypedArray>().ok()
}

/// The ndarrays among `objs` (see [`ndarray`]).
pub(in crate::python) fn ndarrays<'py>(objs: &[&Obj<'py>]) -> Vec<Bound<'py, PyUntypedArray>> {
    objs.iter().filter_map(|o| ndarray(o)).collect()
}
