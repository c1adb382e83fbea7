//! The Python bindings: the only file that knows PyO3 and NumPy.
//!
//! Each function validates its arrays, releases the GIL for the real work,
//! calls the core and maps its errors. The rules it enforces
//! (`design.md`, "Conventions"):
//!
//! - **Read-only arguments** are read in place when they already have the
//!   right dtype and C order; otherwise one conversion is made when it keeps
//!   the meaning (integer arrays whose values fit in int32; floats to the
//!   kernel's float type), and anything else is refused.
//! - **The in-place buffer is never converted**: a buffer of another dtype is
//!   a `TypeError`; one that is not 2-D, not C-contiguous, read-only, or
//!   overlapping another argument is a `WitnessError`, checked on every call
//!   (the off switch included) before anything is written.
//! - **Counts** (segments, budgets, lengths, seeds) are Python integers; a
//!   negative or oversized one is a `ValueError` subclass, never an
//!   `OverflowError`.
//! - **No panic reaches Python**: the core returns `Result` for every refusal
//!   and the arrays it is given are checked against the shapes it is told.
//! - **The GIL is released** when a call has enough work to be worth the
//!   hand-off ([`DETACH_MIN`] elements); below that, releasing and
//!   re-acquiring it would cost more than the work.

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

use crate::attention::{self, AttentionError, AttentionShape, OracleTopK, Selector};
use crate::block_sparse::{self, BlockSparseConfig};
use crate::metrics;
use crate::{pool, simd, witness};

pyo3::create_exception!(
    kvselect,
    WitnessError,
    PyValueError,
    "A refused segment-witness call (a ValueError).\n\n\
     `variant` names the spec's refusal (\"RowsMismatch\", \"SegmentsOutOfRange\",\n\
     \"LearnedKeepOutOfRange\") or is None for an argument the bindings refuse\n\
     (a bad buffer, a negative count); `argument` names the argument at fault,\n\
     and the variant's fields are attributes too."
);
pyo3::create_exception!(
    kvselect,
    SelectionError,
    PyValueError,
    "A refused block-selection or attention call (a ValueError); `argument`\n\
     names the argument at fault."
);

/// Below this many elements of work the GIL is kept: releasing and
/// re-acquiring it costs more than the call.
const DETACH_MIN: usize = 1 << 14;

/// Outputs larger than this are allocated through `numpy.empty`, which
/// raises `MemoryError` when the allocation fails; smaller ones through the
/// C API, which is faster but would turn a failed allocation into a panic.
const BIG_OUTPUT_BYTES: usize = 64 << 20;

/// Which exception family a refusal belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Domain {
    Witness,
    Selection,
}

/// A refusal of `argument` that the bindings make themselves.
fn refuse(py: Python<'_>, domain: Domain, argument: &str, msg: impl Into<String>) -> PyErr {
    let err = match domain {
        Domain::Witness => WitnessError::new_err(msg.into()),
        Domain::Selection => SelectionError::new_err(msg.into()),
    };
    let value = err.value(py);
    let _ = value.setattr("argument", argument);
    if domain == Domain::Witness {
        let _ = value.setattr("variant", py.None());
    }
    err
}

/// Maps a core refusal to `kvselect.WitnessError`, carrying the variant's
/// name and fields; `rows_name` is the 2-D argument (`learned` or
/// `topk_indices`) whose rows `RowsMismatch` speaks of.
fn witness_error(py: Python<'_>, e: witness::WitnessError, rows_name: &str) -> PyErr {
    use witness::WitnessError as E;
    let (msg, argument) = match &e {
        E::RowsMismatch {
            learned_len,
            topk,
            rows,
        } => {
            let have = if *topk == 0 { 0 } else { learned_len / topk };
            (
                format!(
                    "{rows_name} has {have} rows of topk={topk}, but context_lens has {rows} \
                     lengths: every row needs its context length"
                ),
                "context_lens",
            )
        }
        E::SegmentsOutOfRange { .. } => (e.to_string(), "num_segments"),
        E::LearnedKeepOutOfRange { .. } => (e.to_string(), "learned_keep"),
    };
    let err = WitnessError::new_err(msg);
    let v = err.value(py);
    let _ = v.setattr("argument", argument);
    let _ = match e {
        E::RowsMismatch {
            learned_len,
            topk,
            rows,
        } => v
            .setattr("variant", "RowsMismatch")
            .and(v.setattr("learned_len", learned_len))
            .and(v.setattr("topk", topk))
            .and(v.setattr("rows", rows)),
        E::SegmentsOutOfRange { num_segments } => v
            .setattr("variant", "SegmentsOutOfRange")
            .and(v.setattr("num_segments", num_segments)),
        E::LearnedKeepOutOfRange { learned_keep, topk } => v
            .setattr("variant", "LearnedKeepOutOfRange")
            .and(v.setattr("learned_keep", learned_keep))
            .and(v.setattr("topk", topk)),
    };
    err
}

fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))
        .map(|m| m.bind(py))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// A non-negative integer argument, at most `max`.
fn count(obj: &Bound<'_, PyAny>, name: &str, domain: Domain, max: u64) -> PyResult<u64> {
    let py = obj.py();
    let too_large = || {
        refuse(
            py,
            domain,
            name,
            format!("{name} is too large: at most {max}"),
        )
    };
    match obj.extract::<i64>() {
        Ok(v) if v < 0 => Err(refuse(
            py,
            domain,
            name,
            format!("{name} must be non-negative, got {v}"),
        )),
        Ok(v) if v as u64 > max => Err(too_large()),
        Ok(v) => Ok(v as u64),
        Err(e) if e.is_instance_of::<PyOverflowError>(py) => {
            if obj.lt(0i64)? {
                return Err(refuse(
                    py,
                    domain,
                    name,
                    format!("{name} must be non-negative, got {obj}"),
                ));
            }
            match obj.extract::<u64>() {
                Ok(v) if v <= max => Ok(v),
                _ => Err(too_large()),
            }
        }
        Err(e) => Err(PyTypeError::new_err(format!(
            "{name} must be an integer, got {}: {e}",
            type_name(obj)
        ))),
    }
}

const I32_MAX: u64 = i32::MAX as u64;

/// An integer array argument as a C-contiguous int32 array: the caller's own
/// array when it already is one, else one converted copy. Floats are a
/// `TypeError`; integers outside int32 a `ValueError` subclass.
fn int32_array<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    domain: Domain,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    if let Ok(a) = obj.cast::<PyArrayDyn<i32>>() {
        if a.is_c_contiguous() && is_aligned(a.as_untyped()) {
            return Ok(a.clone());
        }
    }
    let py = obj.py();
    let np = numpy(py)?;
    let arr = np.call_method1("asarray", (obj,))?;
    let untyped = arr.cast::<PyUntypedArray>()?;
    let kind = untyped.dtype().kind();
    let size = untyped.len();
    if !(kind == b'i' || kind == b'u' || size == 0) {
        return Err(PyTypeError::new_err(format!(
            "{name} must hold integers (row-relative int32 offsets), got dtype {}",
            untyped.dtype()
        )));
    }
    // int8/16/32 and uint8/16 always fit; wider types are checked.
    let itemsize = untyped.dtype().itemsize();
    let fits = (kind == b'i' && itemsize <= 4) || (kind == b'u' && itemsize <= 2);
    if size > 0 && !fits {
        let lo: i128 = arr.call_method0("min")?.extract()?;
        let hi: i128 = arr.call_method0("max")?.extract()?;
        if lo < i32::MIN as i128 || hi > i32::MAX as i128 {
            return Err(refuse(
                py,
                domain,
                name,
                format!("{name} holds values in [{lo}, {hi}], outside int32: offsets are int32"),
            ));
        }
    }
    let int32 = np.getattr("int32")?;
    let kwargs = [("dtype", int32)].into_py_dict(py)?;
    kwargs.set_item("requirements", "CA")?;
    let converted = np.call_method("require", (arr,), Some(&kwargs))?;
    Ok(converted.cast_into::<PyArrayDyn<i32>>()?)
}

/// A float array argument as a C-contiguous array of `T`: the caller's own
/// when it already is one, else one converted copy. Non-float data is a
/// `TypeError`.
fn float_array<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    if let Ok(a) = obj.cast::<PyArrayDyn<T>>() {
        if a.is_c_contiguous() && is_aligned(a.as_untyped()) {
            return Ok(a.clone());
        }
    }
    let py = obj.py();
    let np = numpy(py)?;
    let arr = np.call_method1("asarray", (obj,))?;
    let untyped = arr.cast::<PyUntypedArray>()?;
    if untyped.dtype().kind() != b'f' && untyped.len() > 0 {
        return Err(PyTypeError::new_err(format!(
            "{name} must hold floats, got dtype {}",
            untyped.dtype()
        )));
    }
    let dtype = numpy::dtype::<T>(py);
    let kwargs = [("dtype", dtype)].into_py_dict(py)?;
    kwargs.set_item("requirements", "CA")?;
    let converted = np.call_method("require", (arr,), Some(&kwargs))?;
    Ok(converted.cast_into::<PyArrayDyn<T>>()?)
}

use pyo3::types::IntoPyDict;

fn is_aligned(a: &Bound<'_, PyUntypedArray>) -> bool {
    // NPY_ARRAY_ALIGNED
    const ALIGNED: i32 = 0x0100;
    // SAFETY: `a` is a live ndarray; reading its flags field is what
    // `PyArray_FLAGS` does.
    unsafe { (*a.as_array_ptr()).fields.flags & ALIGNED != 0 }
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

/// Whether the memory of `a` and the array behind `b` (if `b` is one) may
/// overlap, in `numpy.may_share_memory`'s sense (bounds overlap).
fn may_overlap(a: &Bound<'_, PyUntypedArray>, b: &Bound<'_, PyAny>) -> bool {
    let Ok(b) = b.cast::<PyUntypedArray>() else {
        return false;
    };
    match (extent(a), extent(b)) {
        (Some((alo, ahi)), Some((blo, bhi))) => alo < bhi && blo < ahi,
        _ => false,
    }
}

/// The caller's buffer for in-place writes: an int32, C-contiguous,
/// writeable ndarray of `ndim` dimensions that overlaps none of `others`.
/// Never converted: anything else is refused and left untouched.
fn inplace_i32<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    ndim: usize,
    others: &[&Bound<'py, PyAny>],
    domain: Domain,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let py = obj.py();
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a numpy.ndarray of int32 (it is written in place; for a torch \
             tensor pass t.numpy(), after .int() if it is int64), got {}",
            type_name(obj)
        )));
    };
    let Ok(arr) = obj.cast::<PyArrayDyn<i32>>() else {
        return Err(PyTypeError::new_err(format!(
            "{name} must have dtype int32, got {}: it is written in place, so it is never \
             converted (torch.topk gives int64: call .int() first)",
            untyped.dtype()
        )));
    };
    if untyped.ndim() != ndim {
        return Err(refuse(
            py,
            domain,
            name,
            format!("{name} must be {ndim}-D, got {}-D", untyped.ndim()),
        ));
    }
    if !untyped.is_c_contiguous() {
        return Err(refuse(
            py,
            domain,
            name,
            format!("{name} is not C-contiguous: it is written in place, so it is never copied"),
        ));
    }
    if !is_aligned(untyped) {
        return Err(refuse(py, domain, name, format!("{name} is not aligned")));
    }
    // SAFETY: reading the flags of a live ndarray, as PyArray_ISWRITEABLE does.
    let writeable = unsafe { (*untyped.as_array_ptr()).fields.flags & 0x0400 != 0 };
    if !writeable {
        return Err(refuse(py, domain, name, format!("{name} is read-only")));
    }
    for other in others {
        if may_overlap(untyped, other) {
            return Err(refuse(
                py,
                domain,
                name,
                format!("{name} overlaps another argument's memory"),
            ));
        }
    }
    Ok(arr.clone())
}

/// Allocates an output of `shape` (never an abort: a failed large
/// allocation is a `MemoryError`).
fn alloc<'py, T: Element>(py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let elems = shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
    match elems.and_then(|e| e.checked_mul(std::mem::size_of::<T>())) {
        Some(bytes) if bytes <= BIG_OUTPUT_BYTES => Ok(PyArrayDyn::<T>::zeros(py, shape, false)),
        _ => {
            let np = numpy(py)?;
            let shape = PyTuple::new(py, shape)?;
            let kwargs = [("dtype", numpy::dtype::<T>(py))].into_py_dict(py)?;
            Ok(np
                .call_method("empty", (shape,), Some(&kwargs))?
                .cast_into::<PyArrayDyn<T>>()?)
        }
    }
}

fn alloc_i32<'py>(py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    alloc::<i32>(py, shape)
}

/// Like [`alloc_i32`] but uninitialised, for an output the core overwrites
/// entirely before Python can see it (zero-filling a large output costs as
/// much as the copy the witness merge is measured against).
///
/// # Safety
/// Every element must be written before the array is returned to Python;
/// on a refusal the array is dropped unread.
unsafe fn alloc_i32_uninit<'py>(
    py: Python<'py>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let elems = shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
    match elems.and_then(|e| e.checked_mul(4)) {
        // SAFETY: the caller writes every element before Python reads any.
        Some(bytes) if bytes <= BIG_OUTPUT_BYTES => {
            Ok(unsafe { PyArrayDyn::<i32>::new(py, shape, false) })
        }
        _ => alloc::<i32>(py, shape),
    }
}

/// Runs `f` with the GIL released when `work` is worth the hand-off.
fn run<T: Send>(py: Python<'_>, work: usize, f: impl FnOnce() -> T + Send) -> T {
    if work >= DETACH_MIN {
        py.detach(f)
    } else {
        f()
    }
}

/// `(rows, topk)` of a 2-D index argument.
fn rows_of(a: &Bound<'_, PyArrayDyn<i32>>, name: &str, domain: Domain) -> PyResult<(usize, usize)> {
    match a.shape() {
        [rows, topk] => Ok((*rows, *topk)),
        s => Err(refuse(
            a.py(),
            domain,
            name,
            format!("{name} must be 2-D [rows, topk], got {}-D", s.len()),
        )),
    }
}

fn one_d(a: &Bound<'_, PyArrayDyn<i32>>, name: &str, domain: Domain) -> PyResult<()> {
    if a.ndim() != 1 {
        return Err(refuse(
            a.py(),
            domain,
            name,
            format!("{name} must be 1-D, got {}-D", a.ndim()),
        ));
    }
    Ok(())
}

/// The slice of an output this call just allocated (C order, aligned, so
/// the conversion cannot fail; the error path is for the type's sake).
fn fresh_mut<'a, T: Element>(
    a: &'a mut numpy::PyReadwriteArrayDyn<'_, T>,
) -> PyResult<&'a mut [T]> {
    a.as_slice_mut()
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

fn contiguous<'a, T: Element>(
    a: &'a numpy::PyReadonlyArrayDyn<'_, T>,
    name: &str,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

#[pyfunction]
#[pyo3(name = "segment_of")]
fn py_segment_of(
    token: &Bound<'_, PyAny>,
    context_len: &Bound<'_, PyAny>,
    num_segments: &Bound<'_, PyAny>,
) -> PyResult<u64> {
    let w = Domain::Witness;
    let token = count(token, "token", w, u64::MAX)?;
    let context_len = count(context_len, "context_len", w, u64::MAX)?;
    let num_segments = count(num_segments, "num_segments", w, u64::MAX)?;
    // u64 fits usize on every 64-bit target this wheel is built for.
    Ok(witness::segment_of(token as usize, context_len as usize, num_segments as usize) as u64)
}

#[pyfunction]
#[pyo3(name = "topology_witness_indices", signature = (learned, context_lens, num_segments, *, out=None))]
fn py_topology_witness_indices<'py>(
    learned: &Bound<'py, PyAny>,
    context_lens: &Bound<'py, PyAny>,
    num_segments: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let py = learned.py();
    let w = Domain::Witness;
    let learned_arr = int32_array(learned, "learned", w)?;
    let lens_arr = int32_array(context_lens, "context_lens", w)?;
    let (_, topk) = rows_of(&learned_arr, "learned", w)?;
    one_d(&lens_arr, "context_lens", w)?;
    let num_segments = count(num_segments, "num_segments", w, u32::MAX as u64)? as usize;
    if num_segments == 0 {
        return Err(witness_error(
            py,
            witness::WitnessError::SegmentsOutOfRange { num_segments },
            "learned",
        ));
    }
    // The rows are the context lengths; `learned` must hold `topk` entries
    // for each (so with topk = 0 any number of empty rows matches).
    let rows = lens_arr.len();
    if learned_arr.len() != topk * rows {
        return Err(witness_error(
            py,
            witness::WitnessError::RowsMismatch {
                learned_len: learned_arr.len(),
                topk,
                rows,
            },
            "learned",
        ));
    }
    let out = match out {
        Some(o) => {
            let a = inplace_i32(o, "out", 2, &[learned, context_lens], w)?;
            if a.shape() != [rows, num_segments] {
                return Err(refuse(
                    py,
                    w,
                    "out",
                    format!(
                        "out must have shape ({rows}, {num_segments}), got {:?}",
                        a.shape()
                    ),
                ));
            }
            a
        }
        // SAFETY: `topology_witness_indices_into` writes every slot of every
        // row (each row is filled with -1 first), or refuses before writing.
        None => unsafe { alloc_i32_uninit(py, &[rows, num_segments])? },
    };
    {
        let learned_ro = learned_arr.try_readonly()?;
        let lens_ro = lens_arr.try_readonly()?;
        let mut out_rw = out
            .try_readwrite()
            .map_err(|e| refuse(py, w, "out", format!("out: {e}")))?;
        let l = contiguous(&learned_ro, "learned")?;
        let c = contiguous(&lens_ro, "context_lens")?;
        let o = out_rw
            .as_slice_mut()
            .map_err(|e| refuse(py, w, "out", format!("out: {e}")))?;
        run(py, l.len() + o.len(), || {
            witness::topology_witness_indices_into(l, topk, c, num_segments, o)
        })
        .map_err(|e| witness_error(py, e, "learned"))?;
    }
    Ok(out)
}

#[pyfunction]
#[pyo3(
    name = "apply_topology_witnesses",
    signature = (learned, context_lens, learned_keep, num_segments, max_replacements, *, out=None)
)]
fn py_apply_topology_witnesses<'py>(
    learned: &Bound<'py, PyAny>,
    context_lens: &Bound<'py, PyAny>,
    learned_keep: &Bound<'py, PyAny>,
    num_segments: &Bound<'py, PyAny>,
    max_replacements: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let py = learned.py();
    let w = Domain::Witness;
    let learned_arr = int32_array(learned, "learned", w)?;
    let lens_arr = int32_array(context_lens, "context_lens", w)?;
    let (rows, topk) = rows_of(&learned_arr, "learned", w)?;
    one_d(&lens_arr, "context_lens", w)?;
    let learned_keep = count(learned_keep, "learned_keep", w, u64::MAX)? as usize;
    let num_segments = count(num_segments, "num_segments", w, u64::MAX)? as usize;
    let max_replacements = count(max_replacements, "max_replacements", w, u64::MAX)? as usize;
    let out = match out {
        Some(o) => {
            let a = inplace_i32(o, "out", 2, &[learned, context_lens], w)?;
            if a.shape() != [rows, topk] {
                return Err(refuse(
                    py,
                    w,
                    "out",
                    format!("out must have shape ({rows}, {topk}), got {:?}", a.shape()),
                ));
            }
            a
        }
        // SAFETY: `apply_topology_witnesses_into` copies every learned row
        // into its output row, or refuses before writing.
        None => unsafe { alloc_i32_uninit(py, &[rows, topk])? },
    };
    {
        let learned_ro = learned_arr.try_readonly()?;
        let lens_ro = lens_arr.try_readonly()?;
        let mut out_rw = out
            .try_readwrite()
            .map_err(|e| refuse(py, w, "out", format!("out: {e}")))?;
        let l = contiguous(&learned_ro, "learned")?;
        let c = contiguous(&lens_ro, "context_lens")?;
        let o = out_rw
            .as_slice_mut()
            .map_err(|e| refuse(py, w, "out", format!("out: {e}")))?;
        run(py, l.len(), || {
            witness::apply_topology_witnesses_into(
                l,
                topk,
                c,
                learned_keep,
                num_segments,
                max_replacements,
                o,
            )
        })
        .map_err(|e| witness_error(py, e, "learned"))?;
    }
    Ok(out)
}

#[pyfunction]
#[pyo3(name = "scatter_topology_witnesses")]
fn py_scatter_topology_witnesses<'py>(
    topk_indices: &Bound<'py, PyAny>,
    context_lens: &Bound<'py, PyAny>,
    num_segments: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let py = topk_indices.py();
    let w = Domain::Witness;
    let buf = inplace_i32(topk_indices, "topk_indices", 2, &[context_lens], w)?;
    let lens_arr = int32_array(context_lens, "context_lens", w)?;
    one_d(&lens_arr, "context_lens", w)?;
    let num_segments = count(num_segments, "num_segments", w, u64::MAX)? as usize;
    if num_segments == 0 {
        return Ok(());
    }
    let (rows, topk) = rows_of(&buf, "topk_indices", w)?;
    let lens_ro = lens_arr.try_readonly()?;
    let mut buf_rw = buf.try_readwrite().map_err(|e| {
        refuse(
            py,
            w,
            "topk_indices",
            format!("topk_indices cannot be written: {e}"),
        )
    })?;
    let c = contiguous(&lens_ro, "context_lens")?;
    let b = buf_rw
        .as_slice_mut()
        .map_err(|e| refuse(py, w, "topk_indices", format!("topk_indices: {e}")))?;
    debug_assert_eq!(b.len(), rows * topk);
    run(py, b.len(), || {
        witness::scatter_topology_witnesses(b, topk, c, num_segments)
    })
    .map_err(|e| witness_error(py, e, "topk_indices"))
}

#[pyfunction]
#[pyo3(name = "random_null")]
fn py_random_null<'py>(
    context_len: &Bound<'py, PyAny>,
    budget: &Bound<'py, PyAny>,
    seed: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
    let py = context_len.py();
    let w = Domain::Witness;
    let len = count(context_len, "context_len", w, I32_MAX)? as usize;
    let budget = count(budget, "budget", w, u64::MAX)? as usize;
    let seed = count(seed, "seed", w, u64::MAX)?;
    let v = run(py, budget.min(len), || {
        witness::random_null(len, budget, seed)
    });
    Ok(numpy::PyArray1::from_vec(py, v))
}

#[pyfunction]
#[pyo3(name = "locality_null")]
fn py_locality_null<'py>(
    context_len: &Bound<'py, PyAny>,
    budget: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
    let py = context_len.py();
    let w = Domain::Witness;
    let len = count(context_len, "context_len", w, I32_MAX)? as usize;
    let budget = count(budget, "budget", w, u64::MAX)? as usize;
    Ok(numpy::PyArray1::from_vec(
        py,
        witness::locality_null(len, budget),
    ))
}

#[pyfunction]
#[pyo3(name = "segment_coverage")]
fn py_segment_coverage(
    candidates: &Bound<'_, PyAny>,
    context_len: &Bound<'_, PyAny>,
    num_segments: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let py = candidates.py();
    let w = Domain::Witness;
    let cand = int32_array(candidates, "candidates", w)?;
    one_d(&cand, "candidates", w)?;
    let len = count(context_len, "context_len", w, u64::MAX)? as usize;
    let num_segments = count(num_segments, "num_segments", w, u64::MAX)? as usize;
    let ro = cand.try_readonly()?;
    let c = contiguous(&ro, "candidates")?;
    Ok(run(py, c.len(), || {
        witness::segment_coverage(c, len, num_segments)
    }))
}

#[pyfunction]
#[pyo3(name = "attention_mass_recall")]
fn py_attention_mass_recall(
    candidates: &Bound<'_, PyAny>,
    attention_row: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let py = candidates.py();
    let w = Domain::Witness;
    let cand = int32_array(candidates, "candidates", w)?;
    one_d(&cand, "candidates", w)?;
    let row = float_array::<f64>(attention_row, "attention_row")?;
    if row.ndim() != 1 {
        return Err(refuse(
            py,
            w,
            "attention_row",
            format!("attention_row must be 1-D, got {}-D", row.ndim()),
        ));
    }
    let cro = cand.try_readonly()?;
    let rro = row.try_readonly()?;
    let c = contiguous(&cro, "candidates")?;
    let r = contiguous(&rro, "attention_row")?;
    Ok(run(py, c.len() + r.len(), || {
        witness::attention_mass_recall(c, r)
    }))
}

// ---------------------------------------------------------------------------
// Block-sparse selection
// ---------------------------------------------------------------------------

/// Maps a core block-selection refusal to `kvselect.SelectionError` (or
/// `MemoryError` for an output too large to allocate).
fn selection_error(py: Python<'_>, e: block_sparse::SelectionError) -> PyErr {
    if let block_sparse::SelectionError::OutputTooLarge { .. } = e {
        return pyo3::exceptions::PyMemoryError::new_err(e.to_string());
    }
    refuse(py, Domain::Selection, e.argument(), e.to_string())
}

/// `BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1,
/// local_blocks=2)`: how many blocks a query may see, and which are free.
///
/// Immutable, compares by value, hashable. Building one refuses a config
/// that can select nothing (block_size 0, or top_blocks 0 with no forced
/// block), since an empty selection is a NaN downstream. The released
/// MiniMax-M3 checkpoint uses top_blocks=16, init_blocks=0, local_blocks=1.
#[pyclass(name = "BlockSparseConfig", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PyBlockSparseConfig {
    block_size: usize,
    top_blocks: usize,
    init_blocks: usize,
    local_blocks: usize,
}

impl PyBlockSparseConfig {
    fn core(&self) -> BlockSparseConfig {
        BlockSparseConfig {
            block_size: self.block_size,
            top_blocks: self.top_blocks,
            init_blocks: self.init_blocks,
            local_blocks: self.local_blocks,
        }
    }
}

#[pymethods]
impl PyBlockSparseConfig {
    #[new]
    #[pyo3(
        signature = (block_size=None, top_blocks=None, init_blocks=None, local_blocks=None),
        text_signature = "(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)"
    )]
    fn new(
        py: Python<'_>,
        block_size: Option<&Bound<'_, PyAny>>,
        top_blocks: Option<&Bound<'_, PyAny>>,
        init_blocks: Option<&Bound<'_, PyAny>>,
        local_blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let d = BlockSparseConfig::default();
        // Counts past i32 cannot be honoured by an int32 output anyway.
        let field = |obj: Option<&Bound<'_, PyAny>>, name: &str, default: usize| match obj {
            Some(o) if !o.is_none() => {
                count(o, name, Domain::Selection, I32_MAX).map(|v| v as usize)
            }
            _ => Ok(default),
        };
        let block_size = field(block_size, "block_size", d.block_size)?;
        let top_blocks = field(top_blocks, "top_blocks", d.top_blocks)?;
        let init_blocks = field(init_blocks, "init_blocks", d.init_blocks)?;
        let local_blocks = field(local_blocks, "local_blocks", d.local_blocks)?;
        BlockSparseConfig::new(block_size, top_blocks, init_blocks, local_blocks)
            .map_err(|e| selection_error(py, e))?;
        Ok(PyBlockSparseConfig {
            block_size,
            top_blocks,
            init_blocks,
            local_blocks,
        })
    }

    /// Tokens per block (128 for a real checkpoint; also the KV page size).
    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total blocks visible per query, forced ones counted.
    #[getter]
    fn top_blocks(&self) -> usize {
        self.top_blocks
    }

    /// Blocks at the start of the sequence that are always visible.
    #[getter]
    fn init_blocks(&self) -> usize {
        self.init_blocks
    }

    /// Blocks nearest the query that are always visible.
    #[getter]
    fn local_blocks(&self) -> usize {
        self.local_blocks
    }

    /// The fixed width of an output row: max(top_blocks, init_blocks + local_blocks).
    #[getter]
    fn width(&self) -> usize {
        self.core().width()
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockSparseConfig(block_size={}, top_blocks={}, init_blocks={}, local_blocks={})",
            self.block_size, self.top_blocks, self.init_blocks, self.local_blocks
        )
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<ConfigReduce<'py>> {
        let c = slf.get();
        Ok((
            slf.get_type(),
            (c.block_size, c.top_blocks, c.init_blocks, c.local_blocks),
        ))
    }
}

/// What `BlockSparseConfig.__reduce__` returns: the class and its fields.
type ConfigReduce<'py> = (
    Bound<'py, pyo3::types::PyType>,
    (usize, usize, usize, usize),
);

fn config_or_default(config: Option<&Bound<'_, PyAny>>) -> PyResult<BlockSparseConfig> {
    match config {
        None => Ok(BlockSparseConfig::default()),
        Some(c) if c.is_none() => Ok(BlockSparseConfig::default()),
        Some(c) => match c.cast::<PyBlockSparseConfig>() {
            Ok(c) => Ok(c.get().core()),
            Err(_) => Err(PyTypeError::new_err(format!(
                "config must be a kvselect.BlockSparseConfig or None, got {}",
                type_name(c)
            ))),
        },
    }
}

/// A position array as C-contiguous int64: the caller's own when it already
/// is int64 (NumPy's and torch's default), else one converted copy.
/// Floats are a `TypeError`; values are range-checked by the core.
fn int64_array<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyArrayDyn<i64>>> {
    if let Ok(a) = obj.cast::<PyArrayDyn<i64>>() {
        if a.is_c_contiguous() && is_aligned(a.as_untyped()) {
            return Ok(a.clone());
        }
    }
    let py = obj.py();
    let np = numpy(py)?;
    let arr = np.call_method1("asarray", (obj,))?;
    let untyped = arr.cast::<PyUntypedArray>()?;
    let kind = untyped.dtype().kind();
    if !(kind == b'i' || kind == b'u' || untyped.len() == 0) {
        return Err(PyTypeError::new_err(format!(
            "{name} must hold integers, got dtype {}",
            untyped.dtype()
        )));
    }
    if kind == b'u' && untyped.dtype().itemsize() == 8 && untyped.len() > 0 {
        let hi: u64 = arr.call_method0("max")?.extract()?;
        if hi > i64::MAX as u64 {
            return Err(refuse(
                py,
                Domain::Selection,
                name,
                format!("{name} holds {hi}, past any position"),
            ));
        }
    }
    let kwargs = [("dtype", np.getattr("int64")?)].into_py_dict(py)?;
    kwargs.set_item("requirements", "CA")?;
    let converted = np.call_method("require", (arr,), Some(&kwargs))?;
    Ok(converted.cast_into::<PyArrayDyn<i64>>()?)
}

/// The output buffer of a selection: the caller's `out` (checked, never
/// converted) or a new array.
fn selection_out<'py>(
    py: Python<'py>,
    out: Option<&Bound<'py, PyAny>>,
    shape: &[usize],
    inputs: &[&Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    match out {
        Some(o) if !o.is_none() => {
            let a = inplace_i32(o, "out", shape.len(), inputs, Domain::Selection)?;
            if a.shape() != shape {
                return Err(refuse(
                    py,
                    Domain::Selection,
                    "out",
                    format!("out must have shape {shape:?}, got {:?}", a.shape()),
                ));
            }
            Ok(a)
        }
        _ => alloc_i32(py, shape),
    }
}

fn shape_error(py: Python<'_>, argument: &str, msg: String) -> PyErr {
    refuse(py, Domain::Selection, argument, msg)
}

/// `index_k` as `[n_positions, d]` float32, read in place when it already is.
fn index_keys<'py>(index_k: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, usize)> {
    let k = float_array::<f32>(index_k, "index_k")?;
    match k.shape() {
        [_, d] => {
            let d = *d;
            Ok((k, d))
        }
        s => Err(shape_error(
            index_k.py(),
            "index_k",
            format!("index_k must be 2-D [n_positions, d], got {}-D", s.len()),
        )),
    }
}

#[pyfunction]
#[pyo3(name = "block_sparse_select", signature = (index_q, index_k, query_pos, config=None, *, out=None))]
fn py_block_sparse_select<'py>(
    index_q: &Bound<'py, PyAny>,
    index_k: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    config: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let py = index_q.py();
    let cfg = config_or_default(config)?;
    let q = float_array::<f32>(index_q, "index_q")?;
    let (k, d) = index_keys(index_k)?;
    let width = cfg.width();
    let (n_queries, n_kv_heads, batched) = match *q.shape() {
        [h, dq] | [_, h, dq] if dq != d => {
            let _ = h;
            return Err(shape_error(
                py,
                "index_q",
                format!("index_q has d={dq} but index_k has d={d}"),
            ));
        }
        [h, _] => (1, h, false),
        [n, h, _] => (n, h, true),
        ref s => {
            return Err(shape_error(
                py,
                "index_q",
                format!(
                    "index_q must be [n_kv_heads, d] (one query) or [n_queries, n_kv_heads, d], \
                     got {}-D",
                    s.len()
                ),
            ))
        }
    };
    let positions: Option<Bound<'py, PyArrayDyn<i64>>> = if batched {
        let p = int64_array(query_pos, "query_pos")?;
        if p.shape() != [n_queries] {
            return Err(shape_error(
                py,
                "query_pos",
                format!(
                    "query_pos must be 1-D with one position per query ({n_queries}), got shape {:?}",
                    p.shape()
                ),
            ));
        }
        Some(p)
    } else {
        None
    };
    let single_pos = if batched {
        0
    } else {
        let array_like = query_pos
            .cast::<PyUntypedArray>()
            .is_ok_and(|a| a.ndim() > 0)
            || query_pos.cast::<pyo3::types::PyList>().is_ok()
            || query_pos.cast::<PyTuple>().is_ok();
        if array_like {
            return Err(shape_error(
                py,
                "query_pos",
                "with a 2-D index_q (one query), query_pos must be one integer; pass a 3-D \
                 index_q [n_queries, n_kv_heads, d] for a batch"
                    .into(),
            ));
        }
        count(query_pos, "query_pos", Domain::Selection, i64::MAX as u64)? as usize
    };
    let shape: Vec<usize> = if batched {
        vec![n_queries, n_kv_heads, width]
    } else {
        vec![n_kv_heads, width]
    };
    let out = selection_out(py, out, &shape, &[index_q, index_k, query_pos])?;
    {
        let q_ro = q.try_readonly()?;
        let k_ro = k.try_readonly()?;
        let p_ro = positions.as_ref().map(|p| p.try_readonly()).transpose()?;
        let mut o_rw = out
            .try_readwrite()
            .map_err(|e| shape_error(py, "out", format!("out: {e}")))?;
        let qs = contiguous(&q_ro, "index_q")?;
        let ks_ = contiguous(&k_ro, "index_k")?;
        let ps: &[i64] = match &p_ro {
            Some(p) => contiguous(p, "query_pos")?,
            None => &[],
        };
        let os = o_rw
            .as_slice_mut()
            .map_err(|e| shape_error(py, "out", format!("out: {e}")))?;
        let work = qs.len().saturating_add(ks_.len());
        run(py, work, || {
            if batched {
                block_sparse::select_batch_into(qs, n_queries, n_kv_heads, ks_, d, ps, &cfg, os)
            } else {
                block_sparse::select_into(qs, n_kv_heads, ks_, d, single_pos, &cfg, os)
            }
        })
        .map_err(|e| selection_error(py, e))?;
    }
    Ok(out)
}

#[pyfunction]
#[pyo3(
    name = "block_sparse_select_packed",
    signature = (index_q, index_k, cu_seqlens, seq_ids, query_pos, config=None, *, out=None)
)]
#[allow(clippy::too_many_arguments)]
fn py_block_sparse_select_packed<'py>(
    index_q: &Bound<'py, PyAny>,
    index_k: &Bound<'py, PyAny>,
    cu_seqlens: &Bound<'py, PyAny>,
    seq_ids: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    config: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let py = index_q.py();
    let cfg = config_or_default(config)?;
    let q = float_array::<f32>(index_q, "index_q")?;
    let (k, d) = index_keys(index_k)?;
    let (n_queries, n_kv_heads) = match *q.shape() {
        [n, h, dq] if dq == d => (n, h),
        [_, _, dq] => {
            return Err(shape_error(
                py,
                "index_q",
                format!("index_q has d={dq} but index_k has d={d}"),
            ))
        }
        ref s => {
            return Err(shape_error(
                py,
                "index_q",
                format!(
                    "index_q must be 3-D [n_queries, n_kv_heads, d], got {}-D",
                    s.len()
                ),
            ))
        }
    };
    let cu = int64_array(cu_seqlens, "cu_seqlens")?;
    let sid = int64_array(seq_ids, "seq_ids")?;
    let pos = int64_array(query_pos, "query_pos")?;
    for (a, name) in [(&cu, "cu_seqlens"), (&sid, "seq_ids"), (&pos, "query_pos")] {
        if a.ndim() != 1 {
            return Err(shape_error(
                py,
                name,
                format!("{name} must be 1-D, got {}-D", a.ndim()),
            ));
        }
    }
    let width = cfg.width();
    let out = selection_out(
        py,
        out,
        &[n_queries, n_kv_heads, width],
        &[index_q, index_k, cu_seqlens, seq_ids, query_pos],
    )?;
    {
        let q_ro = q.try_readonly()?;
        let k_ro = k.try_readonly()?;
        let cu_ro = cu.try_readonly()?;
        let sid_ro = sid.try_readonly()?;
        let pos_ro = pos.try_readonly()?;
        let mut o_rw = out
            .try_readwrite()
            .map_err(|e| shape_error(py, "out", format!("out: {e}")))?;
        let qs = contiguous(&q_ro, "index_q")?;
        let ks_ = contiguous(&k_ro, "index_k")?;
        let cus = contiguous(&cu_ro, "cu_seqlens")?;
        let sids = contiguous(&sid_ro, "seq_ids")?;
        let poss = contiguous(&pos_ro, "query_pos")?;
        let os = o_rw
            .as_slice_mut()
            .map_err(|e| shape_error(py, "out", format!("out: {e}")))?;
        run(py, qs.len().saturating_add(ks_.len()), || {
            block_sparse::select_packed_into(
                qs, n_queries, n_kv_heads, ks_, d, cus, sids, poss, &cfg, os,
            )
        })
        .map_err(|e| selection_error(py, e))?;
    }
    Ok(out)
}

#[pyfunction]
#[pyo3(name = "positions_of_blocks", signature = (blocks, query_pos, n_positions, config=None))]
fn py_positions_of_blocks<'py>(
    blocks: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    n_positions: &Bound<'py, PyAny>,
    config: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
    let py = blocks.py();
    let s = Domain::Selection;
    let cfg = config_or_default(config)?;
    let b = int32_array(blocks, "blocks", s)?;
    if b.ndim() != 1 {
        return Err(shape_error(
            py,
            "blocks",
            format!("blocks must be 1-D, got {}-D", b.ndim()),
        ));
    }
    let query_pos = count(query_pos, "query_pos", s, u64::MAX)? as usize;
    let n_positions = count(n_positions, "n_positions", s, u64::MAX)? as usize;
    let ro = b.try_readonly()?;
    let bs = contiguous(&ro, "blocks")?;
    let v = block_sparse::positions_of_blocks_i32(bs, query_pos, n_positions, &cfg)
        .map_err(|e| selection_error(py, e))?;
    Ok(numpy::PyArray1::from_vec(py, v))
}

// ---------------------------------------------------------------------------
// Attention: selectors, the sparse and dense passes, metrics
// ---------------------------------------------------------------------------

/// Maps a core attention refusal to `kvselect.SelectionError` (or
/// `MemoryError` for an output too large to allocate).
fn attention_error(py: Python<'_>, e: AttentionError) -> PyErr {
    if let AttentionError::TooLarge { .. } = e {
        return pyo3::exceptions::PyMemoryError::new_err(e.to_string());
    }
    refuse(py, Domain::Selection, e.argument(), e.to_string())
}

/// Query positions as `usize` (one small copy of `n` entries): any integer
/// array; a negative entry is a `SelectionError` naming its index.
fn positions(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    let py = obj.py();
    let a = int64_array(obj, name)?;
    if a.ndim() != 1 {
        return Err(shape_error(
            py,
            name,
            format!("{name} must be 1-D, got {}-D", a.ndim()),
        ));
    }
    let ro = a.try_readonly()?;
    let v = contiguous(&ro, name)?;
    v.iter()
        .enumerate()
        .map(|(i, &p)| {
            usize::try_from(p)
                .map_err(|_| shape_error(py, name, format!("{name}[{i}] = {p} is negative")))
        })
        .collect()
}

/// A 3-D float32 array argument and its shape.
fn tensor3<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    what: &str,
) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, [usize; 3])> {
    let a = float_array::<f32>(obj, name)?;
    match *a.shape() {
        [x, y, z] => Ok((a, [x, y, z])),
        ref s => Err(shape_error(
            obj.py(),
            name,
            format!("{name} must be 3-D {what}, got {}-D", s.len()),
        )),
    }
}

/// The values argument, read in place when it is float32 with unit stride
/// in its last axis and a uniform row stride over (key, head) — a C-order
/// array, or MLA's `kv[..., :d_v]` view of the keys — else converted once.
/// Returns the array, `d_v` and the row stride in elements.
fn values<'py>(
    obj: &Bound<'py, PyAny>,
    n_keys: usize,
    n_kv_heads: usize,
) -> PyResult<(Bound<'py, PyArrayDyn<f32>>, usize, usize)> {
    let py = obj.py();
    let strided = |a: &Bound<'py, PyArrayDyn<f32>>| -> Option<usize> {
        let u = a.as_untyped();
        if !is_aligned(u) {
            return None;
        }
        match (u.shape(), u.strides()) {
            ([_, h, dv], [s0, s1, 4]) if *s1 > 0 && *s1 % 4 == 0 && *s0 == *s1 * (*h as isize) => {
                let stride = (*s1 / 4) as usize;
                (stride >= *dv).then_some(stride)
            }
            ([_, _, _], _) if u.is_c_contiguous() => Some(u.shape()[2]),
            _ => None,
        }
    };
    let a = match obj.cast::<PyArrayDyn<f32>>() {
        Ok(a) if strided(a).is_some() => a.clone(),
        _ => {
            // One conversion to an aligned C-order float32 array (never a
            // second: `numpy.require` guarantees the layout).
            let np = numpy(py)?;
            let arr = np.call_method1("asarray", (obj,))?;
            let untyped = arr.cast::<PyUntypedArray>()?;
            if untyped.dtype().kind() != b'f' && untyped.len() > 0 {
                return Err(PyTypeError::new_err(format!(
                    "v must hold floats, got dtype {}",
                    untyped.dtype()
                )));
            }
            let kwargs = [("dtype", numpy::dtype::<f32>(py).into_any())].into_py_dict(py)?;
            kwargs.set_item("requirements", "CA")?;
            np.call_method("require", (arr,), Some(&kwargs))?
                .cast_into::<PyArrayDyn<f32>>()?
        }
    };
    if a.ndim() != 3 {
        return Err(shape_error(
            py,
            "v",
            format!(
                "v must be 3-D [n_keys, n_kv_heads, d_v], got {}-D",
                a.ndim()
            ),
        ));
    }
    let Some(stride) = strided(&a) else {
        return Err(shape_error(
            py,
            "v",
            "v has an unusable memory layout".into(),
        ));
    };
    match *a.shape() {
        [nk, h, dv] if nk == n_keys && h == n_kv_heads => Ok((a, dv, stride)),
        ref s => Err(shape_error(
            py,
            "v",
            format!("v must be [n_keys={n_keys}, n_kv_heads={n_kv_heads}, d_v], got {s:?}"),
        )),
    }
}

/// The slice of `v`'s memory its value rows occupy.
///
/// # Safety
/// `v` must be borrowed read-only (its rust-numpy borrow held) for the
/// slice's lifetime; `values` guaranteed the layout (unit stride in the last
/// axis, row stride `stride >= d_v`), so every element of the slice lies
/// inside `v`'s own extent.
unsafe fn value_rows<'a>(
    v: &'a numpy::PyReadonlyArrayDyn<'_, f32>,
    rows: usize,
    stride: usize,
    d_v: usize,
) -> &'a [f32] {
    if rows == 0 || d_v == 0 {
        return &[];
    }
    let len = (rows - 1) * stride + d_v;
    // SAFETY: see the function's contract.
    unsafe { std::slice::from_raw_parts(v.data(), len) }
}

fn scale_arg(scale: Option<f64>, d_k: usize) -> f32 {
    scale.map_or_else(|| attention::softmax_scale(d_k), |s| s as f32)
}

/// Dense causal attention probabilities, float64 ``[n_queries, n_q_heads,
/// n_keys]`` (zeros after each query's position): the rows recall is
/// measured against.
#[pyfunction]
#[pyo3(name = "attention_probabilities", signature = (q, k, query_pos, *, scale=None))]
fn py_attention_probabilities<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    scale: Option<f64>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let py = q.py();
    let (qa, [n, hq, d]) = tensor3(q, "q", "[n_queries, n_q_heads, d_k]")?;
    let (ka, [nk, hkv, dk]) = tensor3(k, "k", "[n_keys, n_kv_heads, d_k]")?;
    if d != dk {
        return Err(shape_error(
            py,
            "q",
            format!("q has d_k={d} but k has d_k={dk}"),
        ));
    }
    let pos = positions(query_pos, "query_pos")?;
    let shape = AttentionShape {
        n_queries: n,
        n_q_heads: hq,
        n_kv_heads: hkv,
        d_k: d,
        d_v: 0,
        n_keys: nk,
    };
    let scale = scale.unwrap_or_else(|| attention::softmax_scale(d) as f64);
    shape.validate().map_err(|e| attention_error(py, e))?;
    let out = alloc::<f64>(py, &[n, hq, nk])?;
    {
        let qr = qa.try_readonly()?;
        let kr = ka.try_readonly()?;
        let mut or = out.try_readwrite()?;
        let (qs, kss) = (contiguous(&qr, "q")?, contiguous(&kr, "k")?);
        let os = fresh_mut(&mut or)?;
        run(py, os.len().saturating_mul(d.max(1)), || {
            metrics::attention_probabilities(qs, kss, &shape, &pos, scale, os)
        })
        .map_err(|e| attention_error(py, e))?;
    }
    Ok(out)
}

/// `(out, lse)` of the dense pass.
type DenseOut<'py> = (Bound<'py, PyArrayDyn<f32>>, Bound<'py, PyArrayDyn<f32>>);

/// `(out, lse, empty_rows)` of an attention pass.
type AttentionOut<'py> = (
    Bound<'py, PyArrayDyn<f32>>,
    Bound<'py, PyArrayDyn<f32>>,
    usize,
);

/// The shared body of the dense and sparse passes.
fn attention_pass<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    selection: Option<&Bound<'py, PyAny>>,
    scale: Option<f64>,
) -> PyResult<AttentionOut<'py>> {
    let py = q.py();
    let (qa, [n, hq, d]) = tensor3(q, "q", "[n_queries, n_q_heads, d_k]")?;
    let (ka, [nk, hkv, dk]) = tensor3(k, "k", "[n_keys, n_kv_heads, d_k]")?;
    if d != dk {
        return Err(shape_error(
            py,
            "q",
            format!("q has d_k={d} but k has d_k={dk}"),
        ));
    }
    let (va, dv, stride) = values(v, nk, hkv)?;
    let pos = positions(query_pos, "query_pos")?;
    let shape = AttentionShape {
        n_queries: n,
        n_q_heads: hq,
        n_kv_heads: hkv,
        d_k: d,
        d_v: dv,
        n_keys: nk,
    };
    shape.validate().map_err(|e| attention_error(py, e))?;
    let sel = match selection {
        Some(s) => {
            let a = int32_array(s, "selection", Domain::Selection)?;
            match *a.shape() {
                [sn, sh, w] if sn == n && sh == hkv => Some((a, w)),
                ref sh => {
                    return Err(shape_error(
                        py,
                        "selection",
                        format!(
                        "selection must be [n_queries={n}, n_kv_heads={hkv}, width], got {sh:?}"
                    ),
                    ))
                }
            }
        }
        None => None,
    };
    let scale = scale_arg(scale, d);
    let out = alloc::<f32>(py, &[n, hq, dv])?;
    let lse = alloc::<f32>(py, &[n, hq])?;
    let empty = {
        let qr = qa.try_readonly()?;
        let kr = ka.try_readonly()?;
        let vr = va.try_readonly()?;
        let sr = sel.as_ref().map(|(a, _)| a.try_readonly()).transpose()?;
        let mut or = out.try_readwrite()?;
        let mut lr = lse.try_readwrite()?;
        let (qs, kss) = (contiguous(&qr, "q")?, contiguous(&kr, "k")?);
        // SAFETY: `vr` holds the read-only borrow for this block; `values`
        // checked the layout.
        let vs = unsafe { value_rows(&vr, nk * hkv, stride, dv) };
        let ss: Option<(&[i32], usize)> = match (&sr, &sel) {
            (Some(r), Some((_, w))) => Some((contiguous(r, "selection")?, *w)),
            _ => None,
        };
        let os = fresh_mut(&mut or)?;
        let ls = fresh_mut(&mut lr)?;
        let work = match ss {
            Some((s, _)) => s
                .len()
                .saturating_mul(d + dv)
                .saturating_mul((hq / hkv.max(1)).max(1)),
            None => n
                .saturating_mul(hq)
                .saturating_mul(nk)
                .saturating_mul(d + dv),
        };
        run(py, work, || match ss {
            Some((s, w)) => {
                attention::sparse_attention(qs, kss, vs, stride, &shape, &pos, s, w, scale, os, ls)
            }
            None => attention::dense_attention(qs, kss, vs, stride, &shape, &pos, scale, os, ls),
        })
        .map_err(|e| attention_error(py, e))?
    };
    Ok((out, lse, empty))
}

/// Dense causal attention: ``(out [n_queries, n_q_heads, d_v], lse
/// [n_queries, n_q_heads])``, every query over keys ``0..=query_pos``.
#[pyfunction]
#[pyo3(name = "dense_attention", signature = (q, k, v, query_pos, *, scale=None))]
fn py_dense_attention<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    scale: Option<f64>,
) -> PyResult<DenseOut<'py>> {
    let (out, lse, _) = attention_pass(q, k, v, query_pos, None, scale)?;
    Ok((out, lse))
}

/// Sparse causal attention over selected positions: ``(out, lse,
/// empty_rows)``; a row that selects nothing gets zeros and ``lse = -inf``
/// and is counted in ``empty_rows``.
#[pyfunction]
#[pyo3(name = "sparse_attention", signature = (q, k, v, query_pos, selection, *, scale=None))]
fn py_sparse_attention<'py>(
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    selection: &Bound<'py, PyAny>,
    scale: Option<f64>,
) -> PyResult<AttentionOut<'py>> {
    attention_pass(q, k, v, query_pos, Some(selection), scale)
}

/// A score-free baseline selector: which keys query row ``i`` of a causal
/// sequence (keys ``0..=i``) may attend to. Build one with
/// ``Selector.dense()``, ``Selector.local(window)``,
/// ``Selector.random(budget, seed)`` or ``Selector.sink_window(sinks,
/// window)``; rows are distinct, ascending and causal.
#[pyclass(name = "Selector", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PySelector {
    kind: u8,
    a: u64,
    b: u64,
}

impl PySelector {
    fn core(&self) -> Selector {
        match self.kind {
            0 => Selector::Dense,
            1 => Selector::Local {
                window: self.a as usize,
            },
            2 => Selector::Random {
                budget: self.a as usize,
                seed: self.b,
            },
            _ => Selector::SinkWindow {
                sinks: self.a as usize,
                window: self.b as usize,
            },
        }
    }
}

#[pymethods]
impl PySelector {
    /// Every causal key.
    #[staticmethod]
    fn dense() -> Self {
        PySelector {
            kind: 0,
            a: 0,
            b: 0,
        }
    }

    /// The ``window`` most recent keys, the query's own included.
    #[staticmethod]
    fn local(window: &Bound<'_, PyAny>) -> PyResult<Self> {
        let window = count(window, "window", Domain::Selection, I32_MAX)?;
        Ok(PySelector {
            kind: 1,
            a: window,
            b: 0,
        })
    }

    /// ``budget`` distinct keys drawn uniformly from the causal set
    /// (ChaCha8 keyed by ``seed`` on stream ``i``: deterministic per seed and row).
    #[staticmethod]
    fn random(budget: &Bound<'_, PyAny>, seed: &Bound<'_, PyAny>) -> PyResult<Self> {
        let budget = count(budget, "budget", Domain::Selection, I32_MAX)?;
        let seed = count(seed, "seed", Domain::Selection, u64::MAX)?;
        Ok(PySelector {
            kind: 2,
            a: budget,
            b: seed,
        })
    }

    /// StreamingLLM: the first ``sinks`` keys plus the ``window`` most recent.
    #[staticmethod]
    fn sink_window(sinks: &Bound<'_, PyAny>, window: &Bound<'_, PyAny>) -> PyResult<Self> {
        let sinks = count(sinks, "sinks", Domain::Selection, I32_MAX)?;
        let window = count(window, "window", Domain::Selection, I32_MAX)?;
        Ok(PySelector {
            kind: 3,
            a: sinks,
            b: window,
        })
    }

    /// The candidates of query row ``row`` (keys ``0..=row``), ascending.
    fn row<'py>(
        &self,
        py: Python<'py>,
        row: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
        let row = count(row, "row", Domain::Selection, I32_MAX - 1)? as usize;
        let sel = self.core();
        let v = run(py, sel.row_len(row), || sel.row(row));
        Ok(numpy::PyArray1::from_vec(py, v))
    }

    /// The candidates of every query position in ``query_pos``: int32
    /// ``[n, width]``, ascending then -1; ``width`` defaults to the widest row.
    #[pyo3(signature = (query_pos, width=None))]
    fn rows<'py>(
        &self,
        query_pos: &Bound<'py, PyAny>,
        width: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
        let py = query_pos.py();
        let pos = positions(query_pos, "query_pos")?;
        let sel = self.core();
        let width = match width {
            Some(w) if !w.is_none() => count(w, "width", Domain::Selection, I32_MAX)? as usize,
            _ => pos.iter().map(|&p| sel.row_len(p)).max().unwrap_or(0),
        };
        let out = alloc_i32(py, &[pos.len(), width])?;
        {
            let mut o = out.try_readwrite()?;
            let os = fresh_mut(&mut o)?;
            run(py, os.len(), || sel.rows_into(&pos, width, os))
                .map_err(|e| attention_error(py, e))?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        match self.core() {
            Selector::Dense => "Selector.dense()".into(),
            Selector::Local { window } => format!("Selector.local(window={window})"),
            Selector::Random { budget, seed } => {
                format!("Selector.random(budget={budget}, seed={seed})")
            }
            Selector::SinkWindow { sinks, window } => {
                format!("Selector.sink_window(sinks={sinks}, window={window})")
            }
        }
    }
}

/// The oracle top-k: for each row of ``attention`` (float64 ``[n,
/// row_len]``, the dense attention row of query position ``query_pos[i]``),
/// the ``budget`` keys with the largest weight among ``0..=query_pos[i]``,
/// ties to the lower key; int32 ``[n, width]`` ascending then -1.
#[pyfunction]
#[pyo3(name = "oracle_topk", signature = (attention, query_pos, budget, *, width=None))]
fn py_oracle_topk<'py>(
    attention: &Bound<'py, PyAny>,
    query_pos: &Bound<'py, PyAny>,
    budget: &Bound<'py, PyAny>,
    width: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<i32>>> {
    let py = attention.py();
    let (a, n, row_len) = attention_rows(attention)?;
    let pos = positions(query_pos, "query_pos")?;
    let budget = count(budget, "budget", Domain::Selection, I32_MAX)? as usize;
    let oracle = OracleTopK { budget };
    let width = match width {
        Some(w) if !w.is_none() => count(w, "width", Domain::Selection, I32_MAX)? as usize,
        _ => pos
            .iter()
            .map(|&p| oracle.row_len(p, row_len))
            .max()
            .unwrap_or(0),
    };
    if pos.len() != n {
        return Err(shape_error(
            py,
            "query_pos",
            format!(
                "query_pos has {} positions for {n} attention rows",
                pos.len()
            ),
        ));
    }
    let out = alloc_i32(py, &[n, width])?;
    {
        let ar = a.try_readonly()?;
        let asl = contiguous(&ar, "attention")?;
        let mut o = out.try_readwrite()?;
        let os = fresh_mut(&mut o)?;
        run(py, asl.len(), || {
            oracle.rows_into(asl, row_len, &pos, width, os)
        })
        .map_err(|e| attention_error(py, e))?;
    }
    Ok(out)
}

/// A 2-D float64 ``attention`` argument ``[n_rows, row_len]`` and its shape.
fn attention_rows<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyArrayDyn<f64>>, usize, usize)> {
    let a = float_array::<f64>(obj, "attention")?;
    match *a.shape() {
        [n, l] => Ok((a, n, l)),
        ref s => Err(shape_error(
            obj.py(),
            "attention",
            format!("attention must be 2-D [n_rows, row_len], got {}-D", s.len()),
        )),
    }
}

/// A 2-D candidates argument ``[rows, width]`` as int32.
fn candidates2<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Bound<'py, PyArrayDyn<i32>>, usize, usize)> {
    let a = int32_array(obj, "candidates", Domain::Selection)?;
    match *a.shape() {
        [r, w] => Ok((a, r, w)),
        ref s => Err(shape_error(
            obj.py(),
            "candidates",
            format!("candidates must be 2-D [rows, width], got {}-D", s.len()),
        )),
    }
}

/// ``segment_coverage`` of every row: float64 ``[rows]``.
#[pyfunction]
#[pyo3(name = "segment_coverage_rows")]
fn py_segment_coverage_rows<'py>(
    candidates: &Bound<'py, PyAny>,
    context_lens: &Bound<'py, PyAny>,
    num_segments: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let py = candidates.py();
    let (c, rows, width) = candidates2(candidates)?;
    let lens = positions(context_lens, "context_lens")?;
    let num_segments = count(num_segments, "num_segments", Domain::Selection, u64::MAX)? as usize;
    let out = alloc::<f64>(py, &[rows])?;
    {
        let cr = c.try_readonly()?;
        let cs = contiguous(&cr, "candidates")?;
        let mut o = out.try_readwrite()?;
        let os = fresh_mut(&mut o)?;
        run(py, cs.len(), || {
            metrics::segment_coverage_rows(cs, width, &lens, num_segments, os)
        })
        .map_err(|e| attention_error(py, e))?;
    }
    Ok(out)
}

/// ``attention_mass_recall`` of every attention row: ``attention`` is
/// float64 ``[n_rows, row_len]``, read against candidate row ``r / group``
/// with ``group = n_rows / rows`` (a KV head's selection serves its query
/// heads); float64 ``[n_rows]``.
#[pyfunction]
#[pyo3(name = "attention_mass_recall_rows")]
fn py_attention_mass_recall_rows<'py>(
    candidates: &Bound<'py, PyAny>,
    attention: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let py = candidates.py();
    let (c, rows, width) = candidates2(candidates)?;
    let (a, n_rows, row_len) = attention_rows(attention)?;
    // With no candidate rows there must be no attention rows either.
    let group = match n_rows.checked_div(rows) {
        Some(g) if g * rows == n_rows && g > 0 => g,
        None if n_rows == 0 => 1,
        _ => {
            return Err(shape_error(
                py,
                "attention",
                format!(
                "attention has {n_rows} rows, not a positive multiple of the {rows} candidate rows"
            ),
            ))
        }
    };
    let out = alloc::<f64>(py, &[n_rows])?;
    {
        let cr = c.try_readonly()?;
        let cs = contiguous(&cr, "candidates")?;
        let ar = a.try_readonly()?;
        let asl = contiguous(&ar, "attention")?;
        let mut o = out.try_readwrite()?;
        let os = fresh_mut(&mut o)?;
        run(py, asl.len(), || {
            metrics::attention_mass_recall_rows(cs, width, asl, row_len, group, os)
        })
        .map_err(|e| attention_error(py, e))?;
    }
    Ok(out)
}

/// ``‖sparse − dense‖ / ‖dense‖`` per row over the last axis: float64 of
/// the leading shape.
#[pyfunction]
#[pyo3(name = "output_relative_error_rows")]
fn py_output_relative_error_rows<'py>(
    sparse: &Bound<'py, PyAny>,
    dense: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<f64>>> {
    let py = sparse.py();
    let s = float_array::<f32>(sparse, "sparse")?;
    let d = float_array::<f32>(dense, "dense")?;
    if s.shape() != d.shape() || s.ndim() == 0 {
        return Err(shape_error(
            py,
            "sparse",
            format!(
                "sparse {:?} and dense {:?} must have one shape, at least 1-D",
                s.shape(),
                d.shape()
            ),
        ));
    }
    let lead: Vec<usize> = s.shape()[..s.ndim() - 1].to_vec();
    let width = s.shape()[s.ndim() - 1];
    let out = alloc::<f64>(py, &lead)?;
    {
        let sr = s.try_readonly()?;
        let dr = d.try_readonly()?;
        let (ss, ds) = (contiguous(&sr, "sparse")?, contiguous(&dr, "dense")?);
        let mut o = out.try_readwrite()?;
        let os = fresh_mut(&mut o)?;
        run(py, ss.len(), || {
            metrics::output_relative_error_rows(ss, ds, width, os)
        })
        .map_err(|e| attention_error(py, e))?;
    }
    Ok(out)
}

/// ``‖sparse − dense‖ / ‖dense‖`` over whole arrays (float64).
#[pyfunction]
#[pyo3(name = "output_relative_error")]
fn py_output_relative_error(sparse: &Bound<'_, PyAny>, dense: &Bound<'_, PyAny>) -> PyResult<f64> {
    let py = sparse.py();
    let s = float_array::<f32>(sparse, "sparse")?;
    let d = float_array::<f32>(dense, "dense")?;
    if s.shape() != d.shape() {
        return Err(shape_error(
            py,
            "sparse",
            format!(
                "sparse {:?} and dense {:?} must have one shape",
                s.shape(),
                d.shape()
            ),
        ));
    }
    let sr = s.try_readonly()?;
    let dr = d.try_readonly()?;
    let (ss, ds) = (contiguous(&sr, "sparse")?, contiguous(&dr, "dense")?);
    metrics::output_relative_error(ss, ds).map_err(|e| attention_error(py, e))
}

/// Sets the number of threads kvselect's parallel paths use; 0 restores
/// the default (`RAYON_NUM_THREADS`, else every core).
#[pyfunction]
#[pyo3(name = "set_num_threads")]
fn py_set_num_threads(n: &Bound<'_, PyAny>) -> PyResult<()> {
    let n = count(n, "n", Domain::Selection, 1 << 16)? as usize;
    pool::set_num_threads(n);
    Ok(())
}

/// The number of threads kvselect's parallel paths use.
#[pyfunction]
#[pyo3(name = "get_num_threads")]
fn py_get_num_threads() -> usize {
    pool::num_threads()
}

/// The instruction-set level the SIMD kernels dispatched to on this CPU
/// ("avx2" or "scalar").
#[pyfunction]
#[pyo3(name = "simd_level")]
fn py_simd_level() -> &'static str {
    simd::level().name()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_TOPOLOGY_SEGMENTS", witness::MAX_TOPOLOGY_SEGMENTS)?;
    m.add("WitnessError", py.get_type::<WitnessError>())?;
    m.add("SelectionError", py.get_type::<SelectionError>())?;
    m.add_function(wrap_pyfunction!(py_segment_of, m)?)?;
    m.add_function(wrap_pyfunction!(py_topology_witness_indices, m)?)?;
    m.add_function(wrap_pyfunction!(py_apply_topology_witnesses, m)?)?;
    m.add_function(wrap_pyfunction!(py_scatter_topology_witnesses, m)?)?;
    m.add_function(wrap_pyfunction!(py_random_null, m)?)?;
    m.add_function(wrap_pyfunction!(py_locality_null, m)?)?;
    m.add_function(wrap_pyfunction!(py_segment_coverage, m)?)?;
    m.add_function(wrap_pyfunction!(py_attention_mass_recall, m)?)?;
    m.add("MINIMAX_BLOCK_SIZE", block_sparse::MINIMAX_BLOCK_SIZE)?;
    m.add_class::<PyBlockSparseConfig>()?;
    m.add_function(wrap_pyfunction!(py_block_sparse_select, m)?)?;
    m.add_function(wrap_pyfunction!(py_block_sparse_select_packed, m)?)?;
    m.add_function(wrap_pyfunction!(py_positions_of_blocks, m)?)?;
    m.add_class::<PySelector>()?;
    m.add_function(wrap_pyfunction!(py_oracle_topk, m)?)?;
    m.add_function(wrap_pyfunction!(py_attention_probabilities, m)?)?;
    m.add_function(wrap_pyfunction!(py_dense_attention, m)?)?;
    m.add_function(wrap_pyfunction!(py_sparse_attention, m)?)?;
    m.add_function(wrap_pyfunction!(py_segment_coverage_rows, m)?)?;
    m.add_function(wrap_pyfunction!(py_attention_mass_recall_rows, m)?)?;
    m.add_function(wrap_pyfunction!(py_output_relative_error, m)?)?;
    m.add_function(wrap_pyfunction!(py_output_relative_error_rows, m)?)?;
    m.add_function(wrap_pyfunction!(py_set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(py_get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(py_simd_level, m)?)?;
    Ok(())
}
