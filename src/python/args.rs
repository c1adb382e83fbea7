//! The typed argument layer: every entry point turns its Python arguments
//! into checked inputs here, and nowhere else.
//!
//! - [`Args::input`]: an array argument as a borrowed, C-contiguous, aligned
//!   array of the kernel's element type with its shape as `[usize; N]` —
//!   the caller's own array when it already is one (zero copy), else one
//!   conversion that keeps the meaning ([`Dtype`] states the rule per type).
//! - [`Args::count`]: a Python integer as a count, never `OverflowError`.
//! - [`Args::output`] / [`Args::inplace`]: the caller's buffer (checked,
//!   never converted, overlapping no input *as handed to the core*) or a new
//!   zeroed array.
//! - [`detach`]: the core call, with the GIL released when the work is
//!   worth the hand-off.
//!
//! # Releasing the GIL while holding NumPy buffers
//!
//! While a call runs detached, the core reads and writes the arrays'
//! memory through plain slices. rust-numpy's borrow flags keep other Rust
//! extensions out, and our reference to each array keeps it alive and
//! unresizable (`ndarray.resize` refuses while we hold it), but nothing can
//! stop *Python* code in another thread from writing into the same memory
//! through a view or a memoryview while we work. Like `hashlib` and
//! blake3-py with a buffer mutated during hashing, the result is then
//! unspecified: don't mutate an array that a running kvselect call holds.
//! No memory outside the arrays is ever touched; the bounds the core
//! relies on are its own checks against the shapes recorded here.

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn,
    PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyTuple};

use super::dlpack;
use super::errors::{refuse, Domain};
use crate::keys::{Encoded, Format};

/// A Python argument.
pub(super) type Obj<'py> = Bound<'py, PyAny>;
/// An optional Python argument (`out=`, `config=`, `width=`).
pub(super) type Opt<'a, 'py> = Option<&'a Bound<'py, PyAny>>;
/// Output arrays.
pub(super) type I32<'py> = Bound<'py, PyArrayDyn<i32>>;
pub(super) type F64<'py> = Bound<'py, PyArrayDyn<f64>>;

/// Below this many elements of work the GIL is kept: releasing and
/// re-acquiring it costs more than the call.
pub(super) const DETACH_MIN: usize = 1 << 14;

/// Outputs above this many bytes are allocated through `numpy.zeros`,
/// which raises `MemoryError` when the allocation fails (and is calloc of
/// fresh pages, about the cost of `numpy.empty`); smaller ones through the
/// C API, which is faster but would turn a failed allocation into a panic.
const BIG_OUTPUT_BYTES: usize = 64 << 20;

pub(super) fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))
        .map(|m| m.bind(py))
}

pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// An element type a kernel reads, and which arrays convert to it.
pub(super) trait Dtype: Element + Copy {
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
pub(super) fn is_aligned(a: &Bound<'_, PyUntypedArray>) -> bool {
    const ALIGNED: i32 = 0x0100;
    // SAFETY: `a` is a live ndarray; reading its flags field is what
    // `PyArray_FLAGS` does.
    unsafe { (*a.as_array_ptr()).fields.flags & ALIGNED != 0 }
}

fn is_writeable(a: &Bound<'_, PyUntypedArray>) -> bool {
    const WRITEABLE: i32 = 0x0400;
    // SAFETY: as in `is_aligned` (`PyArray_ISWRITEABLE`).
    unsafe { (*a.as_array_ptr()).fields.flags & WRITEABLE != 0 }
}

/// The one converter: `obj` as a C-contiguous, aligned array of `T`, the
/// caller's own array when it already is one, else one `numpy.require`
/// conversion when `T::KINDS` says it keeps the meaning.
pub(super) fn convert<'py, T: Dtype>(
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
fn not_raw_bits(view: &Bound<'_, PyAny>, name: &str, holds: &str) -> PyResult<()> {
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
fn may_overlap(a: &Bound<'_, PyUntypedArray>, b: &Bound<'_, PyUntypedArray>) -> bool {
    match (extent(a), extent(b)) {
        (Some((alo, ahi)), Some((blo, bhi))) => alo < bhi && blo < ahi,
        _ => false,
    }
}

/// An input as the core will read it: converted, shape-checked and
/// borrowed read-only for the call.
pub(super) struct In<'py, T: Element, const N: usize> {
    ro: PyReadonlyArrayDyn<'py, T>,
    pub shape: [usize; N],
}

impl<'py, T: Element, const N: usize> In<'py, T, N> {
    /// The elements, row-major.
    pub fn slice(&self) -> PyResult<&[T]> {
        self.ro
            .as_slice()
            .map_err(|e| PyTypeError::new_err(e.to_string()))
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        self.ro.as_untyped()
    }
}

/// An output buffer borrowed read-write for the call.
pub(super) struct Out<'py, T: Element> {
    rw: PyReadwriteArrayDyn<'py, T>,
}

impl<'py, T: Element> Out<'py, T> {
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

    /// The array, its borrow released.
    pub fn finish(self) -> Bound<'py, PyArrayDyn<T>> {
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

/// The argument context of one entry point: its exception domain.
#[derive(Clone, Copy)]
pub(super) struct Args(pub Domain);

impl Args {
    /// The one way into the argument layer for an object that may be a
    /// DLPack producer: `obj` itself (an ndarray, a list, a scalar), or a
    /// zero-copy ndarray view of a producer's memory ([`dlpack::view`]),
    /// which every rule below then applies to as to any ndarray.
    pub fn arg<'py>(self, obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Obj<'py>> {
        Ok(dlpack::view(obj, name, self.0)?.unwrap_or_else(|| obj.clone()))
    }

    /// An `N`-D array argument of `T` (`what` describes its axes in
    /// messages, e.g. `"[rows, topk]"`).
    pub fn input<'py, T: Dtype, const N: usize>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        what: &str,
    ) -> PyResult<In<'py, T, N>> {
        let a = convert::<T>(obj, name, self.0)?;
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
    ) -> PyResult<(In<'py, T, 0>, Vec<usize>)> {
        let a = convert::<T>(obj, name, self.0)?;
        let shape = a.shape().to_vec();
        Ok((
            In {
                ro: a.try_readonly()?,
                shape: [],
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
                self.0,
                name,
                format!("{name} must be {N}-D {what}, got {}-D", a.ndim()),
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
        Err(refuse(self.0, name, msg))
    }

    /// Refuses query heads (`index_q`) of another dimension than `keys`'.
    pub fn same_d(self, dq: usize, d: usize, keys: &str) -> PyResult<()> {
        if dq == d {
            return Ok(());
        }
        let msg = format!("index_q has d={dq} but {keys} has d={d}");
        Err(refuse(self.0, "index_q", msg))
    }

    /// A non-negative integer argument, at most `max`.
    pub fn count(self, obj: &Bound<'_, PyAny>, name: &str, max: u64) -> PyResult<usize> {
        self.count_within(obj, name, max, max)
    }

    /// An optional [`Args::count`]: `default` when the argument is None.
    pub fn count_or(self, obj: Opt, name: &str, max: u64, default: usize) -> PyResult<usize> {
        obj.map_or(Ok(default), |o| self.count(o, name, max))
    }

    /// [`Args::count`] whose refusal names `bound` (the rule's real bound,
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
                self.0,
                name,
                format!("{name} must be non-negative, got {obj}"),
            )
        };
        let too_large = || {
            refuse(
                self.0,
                name,
                format!("{name} is too large: at most {bound}"),
            )
        };
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

    /// The caller's buffer for in-place writes: an ndarray of `T`, `ndim`
    /// dims, C-contiguous, aligned, writeable, overlapping none of `inputs`.
    /// Never converted: anything else is refused and left untouched.
    pub fn inplace<'py, T: Element>(
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
            format!("{name} must be {ndim}-D, got {}-D", untyped.ndim())
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
                .map_err(|e| refuse(self.0, name, format!("{name} cannot be written: {e}")));
        };
        Err(refuse(self.0, name, fault))
    }

    /// [`Args::output`] where the core writes every slot of a new output,
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
    /// [`Args::inplace`], and of exactly `shape`) or a new zeroed array.
    pub fn output<'py, T: Element>(
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

    /// The caller's buffer `name` (checked as [`Args::inplace`]) of exactly
    /// `shape`.
    pub fn buffer<'py, T: Element>(
        self,
        obj: &Bound<'py, PyAny>,
        name: &str,
        shape: &[usize],
        inputs: &[&Bound<'py, PyUntypedArray>],
    ) -> PyResult<Out<'py, T>> {
        let buf = self.inplace::<T>(obj, name, shape.len(), inputs)?;
        if buf.shape() != shape {
            let msg = format!("{name} must have shape {shape:?}, got {:?}", buf.shape());
            return Err(refuse(self.0, name, msg));
        }
        Ok(buf)
    }
}

/// A new zeroed array (a failed large allocation is a `MemoryError`, never
/// an abort).
pub(super) fn zeros<'py, T: Element>(
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
pub(super) unsafe fn filled_by_core<'py>(
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
pub(super) fn detach<T: Send>(py: Python<'_>, work: usize, f: impl FnOnce() -> T + Send) -> T {
    if work >= DETACH_MIN {
        py.detach(f)
    } else {
        f()
    }
}

/// A 1-D array of positions (any integer dtype) as `usize`: one small copy
/// of `n` entries; a negative entry is refused, naming its index.
pub(super) fn positions(args: Args, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    let p = args.input::<i64, 1>(obj, name, "[n]")?;
    non_negative(args, p.slice()?, name)
}

/// `p` as positions, a negative entry refused naming its index.
pub(super) fn non_negative(args: Args, p: &[i64], name: &str) -> PyResult<Vec<usize>> {
    p.iter()
        .enumerate()
        .map(|(i, &v)| {
            usize::try_from(v)
                .map_err(|_| refuse(args.0, name, format!("{name}[{i}] = {v} is negative")))
        })
        .collect()
}

/// [`positions`] whose one axis the other arguments fix: refused, naming
/// both shapes, unless `obj` is exactly `[axis.0=axis.1]` (a `[1, n]`
/// reshape is refused as such, not read as `[n]`).
pub(super) fn positions_along(
    args: Args,
    obj: &Bound<'_, PyAny>,
    name: &str,
    axis: (&str, usize),
) -> PyResult<Vec<usize>> {
    let (p, shape) = args.input_dyn::<i64>(obj, name)?;
    args.axes(name, &shape, &[axis])?;
    non_negative(args, p.slice()?, name)
}

/// [`query_positions`] for a batch of `n` queries (fixed by `index_q`):
/// `query_pos` must be `[n_queries=n]`, or one integer when `n` is 1.
pub(super) fn query_positions_for(
    args: Args,
    obj: &Bound<'_, PyAny>,
    n: usize,
) -> PyResult<Vec<usize>> {
    let obj = &args.arg(obj, "query_pos")?;
    let ndim: usize = numpy(obj.py())?.call_method1("ndim", (obj,))?.extract()?;
    if ndim != 0 {
        return positions_along(args, obj, "query_pos", ("n_queries", n));
    }
    let p = query_positions(args, obj)?;
    if n != 1 {
        let msg = format!(
            "query_pos is one integer (a batch of one query), but index_q has n_queries={n}: \
             pass query_pos [n_queries={n}]"
        );
        return Err(refuse(args.0, "query_pos", msg));
    }
    Ok(p)
}

/// `obj` if it is an ndarray: an argument the core reads through a copy
/// (positions, lengths) is still memory an output must not share, since no
/// input may alias an output whatever the core does with it.
///
/// A DLPack producer counts as its view (a producer that cannot be viewed
/// is refused where the argument is read, not here).
pub(super) fn ndarray<'py>(obj: &Obj<'py>) -> Option<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        return Some(a.clone());
    }
    let view = dlpack::view(obj, "", Domain::Selection).ok()??;
    view.cast_into::<PyUntypedArray>().ok()
}

/// The ndarrays among `objs` (see [`ndarray`]).
pub(super) fn ndarrays<'py>(objs: &[&Obj<'py>]) -> Vec<Bound<'py, PyUntypedArray>> {
    objs.iter().filter_map(|o| ndarray(o)).collect()
}

/// The `query_pos` argument: one position per query, `[n_queries]`, or one
/// integer (a 0-D array too) for a batch of one query, read as `[p]` — the
/// other arguments keep their query axis, of length 1, and so does the
/// result. (Broadcasting one position over many queries would hide a
/// forgotten array.)
pub(super) fn query_positions(args: Args, obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let obj = &args.arg(obj, "query_pos")?;
    // A Python int, a NumPy integer or a 0-D array (`numpy.ndim` is 0).
    let ndim: usize = numpy(obj.py())?.call_method1("ndim", (obj,))?.extract()?;
    if ndim != 0 {
        return positions(args, obj, "query_pos");
    }
    Ok(vec![args.count(obj, "query_pos", i64::MAX as u64)?])
}

/// An array of keys or queries in one of the engines' element formats,
/// borrowed as the core reads it: float32 in place (float64 and array-likes
/// converted once), float16 / bfloat16 / float8 e4m3fn (`ml_dtypes` arrays,
/// or raw `uint16` / `uint8` views with an explicit `format`) reinterpreted
/// in place, never widened. An array of any format in non-native byte order,
/// misaligned or not C-contiguous is copied once to a native, aligned,
/// C-order one first (same values).
pub(super) enum EncodedIn<'py> {
    F32(In<'py, f32, 0>),
    U16(PyReadonlyArrayDyn<'py, u16>, Format),
    U8(PyReadonlyArrayDyn<'py, u8>),
}

impl<'py> EncodedIn<'py> {
    /// `obj` in its format, and its shape. `format` (the `key_format` /
    /// `query_format` argument) is required for raw `uint16` / `uint8`
    /// arrays and must agree with a typed array's dtype.
    pub fn new(
        args: Args,
        obj: &Bound<'py, PyAny>,
        name: &str,
        format: FormatArg<'_>,
    ) -> PyResult<(Self, Vec<usize>)> {
        let np = numpy(obj.py())?;
        let view = dlpack::view(obj, name, args.0)?;
        // A DLPack view of bfloat16 / float8_e4m3fn holds raw bits, tagged.
        let tag = view.as_ref().and_then(dlpack::format_tag);
        let arr = np.call_method1("asarray", (view.as_ref().unwrap_or(obj),))?;
        let dtype: String = match tag {
            Some(f) => f.name().to_string(),
            None => arr.getattr("dtype")?.getattr("name")?.extract()?,
        };
        let chosen = format_of(name, &dtype, format, true)?;
        let shape = arr.getattr("shape")?.extract::<Vec<usize>>()?;
        if chosen == Format::F32 {
            let (a, _) = args.input_dyn::<f32>(&arr, name)?;
            return Ok((EncodedIn::F32(a), shape));
        }
        // One copy only if the caller's array is not already native byte
        // order, C-contiguous and aligned (`>f2`, `>u2` and misaligned views
        // are converted once, as float64 is to float32); then a zero-copy
        // reinterpretation of its bytes.
        let arr = native_aligned(&arr)?;
        let raw = match chosen.size() {
            2 => np.getattr("uint16")?,
            _ => np.getattr("uint8")?,
        };
        let view = arr.call_method1("view", (raw,))?;
        let encoded = match chosen {
            Format::Fp8E4m3 => EncodedIn::U8(view.cast_into::<PyArrayDyn<u8>>()?.try_readonly()?),
            f => EncodedIn::U16(view.cast_into::<PyArrayDyn<u16>>()?.try_readonly()?, f),
        };
        Ok((encoded, shape))
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        match self {
            EncodedIn::F32(a) => a.untyped(),
            EncodedIn::U16(a, _) => a.as_untyped(),
            EncodedIn::U8(a) => a.as_untyped(),
        }
    }

    /// The elements as the core reads them.
    pub fn encoded(&self) -> PyResult<Encoded<'_>> {
        let err = |e: numpy::AsSliceError| PyTypeError::new_err(e.to_string());
        Ok(match self {
            EncodedIn::F32(a) => Encoded::F32(a.slice()?),
            EncodedIn::U16(a, Format::Bf16) => Encoded::Bf16(a.as_slice().map_err(err)?),
            EncodedIn::U16(a, _) => Encoded::F16(a.as_slice().map_err(err)?),
            EncodedIn::U8(a) => Encoded::Fp8E4m3(a.as_slice().map_err(err)?),
        })
    }
}

/// `arr` (an ndarray) in native byte order, C-contiguous and aligned: itself
/// when it already is, else one copy with the same values.
pub(super) fn native_aligned<'py>(arr: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let np = numpy(arr.py())?;
    let dtype = arr.getattr("dtype")?;
    let arr = if dtype.getattr("isnative")?.extract::<bool>()? {
        arr.clone()
    } else {
        arr.call_method1("astype", (dtype.call_method1("newbyteorder", ("=",))?,))?
    };
    let kwargs = [("requirements", "CA")].into_py_dict(arr.py())?;
    np.call_method("require", (arr,), Some(&kwargs))
}

/// Whether an ndarray `arr`'s elements are in the machine's byte order
/// (single bytes always are, whatever order their dtype is flagged with).
pub(super) fn is_native_order(arr: &Bound<'_, PyAny>) -> PyResult<bool> {
    let dtype = arr.getattr("dtype")?;
    Ok(dtype.getattr("itemsize")?.extract::<usize>()? <= 1
        || dtype.getattr("isnative")?.extract::<bool>()?)
}

/// A format argument: its name (`key_format` / `query_format`) and value.
pub(super) type FormatArg<'a> = (&'a str, Option<&'a str>);

/// The format an array `name` of `dtype` is read in: a typed array's own
/// (which the format argument must agree with when given), or the one the
/// argument names for a raw `uint16` / `uint8` view. float64 is read as
/// float32, converted once, only where `converts`.
pub(super) fn format_of(
    name: &str,
    dtype: &str,
    (arg, format): FormatArg<'_>,
    converts: bool,
) -> PyResult<Format> {
    // A format name that is none of them is a bad value, not a bad type.
    let unknown = |f| {
        let msg = format!("{arg} {f:?} is not one of float32, float16, bfloat16, float8_e4m3fn");
        refuse(Domain::Selection, arg, msg)
    };
    let asked = format
        .map(|f| Format::from_name(f).ok_or_else(|| unknown(f)))
        .transpose()?;
    let typed = match dtype {
        "float64" if converts => Some(Format::F32),
        d => Format::from_name(d),
    };
    match (typed, asked, dtype) {
        (Some(t), None, _) => Ok(t),
        (Some(t), Some(a), _) if t == a => Ok(t),
        (None, Some(a @ (Format::F16 | Format::Bf16)), "uint16") => Ok(a),
        (None, Some(Format::Fp8E4m3), "uint8") => Ok(Format::Fp8E4m3),
        _ => {
            let why = match asked {
                Some(a) => format!("which does not hold {} ({arg})", a.name()),
                None if dtype == "float64" => "and is read in place, never converted".into(),
                None => "which is not a key format".into(),
            };
            Err(PyTypeError::new_err(format!(
                "{name} has dtype {dtype}, {why}: pass float32, float16, ml_dtypes bfloat16 / \
                 float8_e4m3fn, or a raw uint16 (bfloat16, float16) / uint8 (float8_e4m3fn) \
                 view with {arg}"
            )))
        }
    }
}

/// An array read in place as rows: its first `lead` axes index `rows` rows
/// of `row_len` C-contiguous elements, `stride` elements apart (`stride >=
/// row_len`, uniform over the leading axes). A C-order array is the case
/// `stride = row_len`; MLA's `kv[..., :d_v]` view of the keys and an
/// engine's pages interleaved with other layers' are the strided ones.
pub(super) struct StridedRows<'py, T: Element> {
    ro: PyReadonlyArrayDyn<'py, T>,
    pub shape: Vec<usize>,
    pub rows: usize,
    pub row_len: usize,
    pub stride: usize,
}

impl<'py, T: Element> StridedRows<'py, T> {
    /// `(rows, row_len, stride)` of `a`'s layout, `None` when it is not
    /// usable in place (unaligned, a row not contiguous, a non-uniform or
    /// non-positive row stride).
    fn layout(a: &Bound<'_, PyUntypedArray>, lead: usize) -> Option<(usize, usize, usize)> {
        let (shape, strides) = (a.shape(), a.strides());
        let item = std::mem::size_of::<T>() as isize;
        if !is_aligned(a) || lead > shape.len() {
            return None;
        }
        // Axes of length 1 may carry any stride: they are skipped.
        let chained = |axes: std::ops::Range<usize>, mut want: isize| {
            axes.rev().all(|j| {
                let ok = shape[j] == 1 || strides[j] == want;
                want = want.saturating_mul(shape[j] as isize);
                ok
            })
        };
        let row_len: usize = shape[lead..].iter().product();
        let rows: usize = shape[..lead].iter().product();
        if rows == 0 || row_len == 0 {
            // Nothing is read (NumPy gives empty arrays zero strides).
            return Some((rows, row_len, row_len));
        }
        if !chained(lead..shape.len(), item) {
            return None;
        }
        // The row stride: the innermost leading axis longer than 1.
        let Some(inner) = (0..lead).rev().find(|&j| shape[j] > 1) else {
            return Some((rows, row_len, row_len));
        };
        let s = strides[inner];
        let ok =
            s > 0 && s % item == 0 && (s / item) as usize >= row_len && chained(0..inner + 1, s);
        ok.then_some((rows, row_len, (s / item) as usize))
    }

    /// `a` read in place when its layout allows it, else `None`.
    pub fn new(a: &Bound<'py, PyArrayDyn<T>>, lead: usize) -> PyResult<Option<Self>> {
        let Some((rows, row_len, stride)) = Self::layout(a.as_untyped(), lead) else {
            return Ok(None);
        };
        let shape = a.shape().to_vec();
        Ok(Some(StridedRows {
            ro: a.try_readonly()?,
            shape,
            rows,
            row_len,
            stride,
        }))
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        self.ro.as_untyped()
    }

    /// The memory the rows occupy: row `r` is the `row_len` elements at
    /// `r · stride`.
    pub fn slice(&self) -> &[T] {
        if self.rows == 0 || self.row_len == 0 {
            return &[];
        }
        let len = (self.rows - 1) * self.stride + self.row_len;
        // SAFETY: `layout` checked that every row is `row_len` contiguous
        // elements and that the rows are `stride` elements apart uniformly
        // over the leading axes, from the array's first element (positive
        // strides only), so the last element of the last row, at
        // `(rows − 1)·stride + row_len − 1`, lies inside the array; `self.ro`
        // keeps it alive and borrowed read-only for as long as the slice lives.
        unsafe { std::slice::from_raw_parts(self.ro.data(), len) }
    }
}

/// A float32 or float64 array argument, read in place either way (scores
/// the checkers compare as given: a float64 one is never rounded).
pub(super) enum Floats<'py> {
    F32(In<'py, f32, 0>),
    F64(In<'py, f64, 0>),
}

impl Floats<'_> {
    pub fn values(&self) -> PyResult<crate::check::Values<'_>> {
        Ok(match self {
            Floats::F32(a) => crate::check::Values::F32(a.slice()?),
            Floats::F64(a) => crate::check::Values::F64(a.slice()?),
        })
    }
}

impl Args {
    /// A float argument read as float64 when it is float64, else as
    /// float32: with `strict`, only float32 (or empty) arrays take that
    /// branch and any other dtype (float16, an integer) is a `TypeError`
    /// naming `name`; without, any float converts to float32 as
    /// [`Args::input_dyn`] does. Returns the array and its shape.
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
