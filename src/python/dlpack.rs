//! DLPack arguments: any object exporting `__dlpack__` / `__dlpack_device__`
//! (torch, JAX, CuPy, NumPy ≥ 1.22) read as a NumPy array over the
//! producer's own memory, so the argument layer ([`super::args`]) applies
//! one set of rules — conversion, aliasing, in-place — to both.
//!
//! # The rule
//!
//! [`view`] turns a DLPack producer into an ndarray *view* of the
//! producer's memory, never a copy:
//!
//! 1. the device is asked first (`__dlpack_device__`), so a tensor that is
//!    not in host memory is refused — naming `.cpu()` — before anything is
//!    exported or written;
//! 2. `__dlpack__(max_version=(1, 3))` is called (a versioned capsule),
//!    falling back to `__dlpack__()` (a legacy one) on `TypeError`; a bare
//!    PyCapsule is refused: a capsule can be consumed only once, and the
//!    caller could not know whether it was. What comes back must be a
//!    capsule named `dltensor_versioned` or `dltensor`: one already consumed
//!    (`used_…`) is neither read nor deleted, one of another name is no
//!    DLPack capsule;
//! 3. the capsule is consumed by `dlpark` (which renames it `used_…` and
//!    checks the ABI major version, calling the deleter of a major it cannot
//!    read), and its managed tensor is handed to an
//!    [`Owner`] object that becomes the view's `base`: the producer's memory
//!    stays alive while any view of it does, and the deleter is called
//!    exactly once, when the last view dies (or at once when the import
//!    fails half-way);
//! 4. the DLPack dtype picks the view's dtype: float16/32/64, int8–64 and
//!    uint8–64 as themselves; bfloat16 as its raw `uint16` bits and
//!    float8_e4m3fn as its raw `uint8` bits, *tagged* on the owner with
//!    their [`Format`] — so the dtype decides the format and `key_format=`
//!    is needed only for raw bits. Anything else is a `TypeError`;
//! 5. strides (in elements) and the byte offset become the view's byte
//!    strides and data pointer; the READ_ONLY flag of a versioned capsule
//!    clears the view's `WRITEABLE` flag, so a read-only tensor passed as an
//!    output or an in-place buffer is refused like a read-only ndarray.
//!
//! Every refusal names the argument: what the producer hands back that
//! cannot be read (its `__dlpack__` or `__dlpack_device__` raising or
//! returning something else, a consumed or wrongly named capsule, another
//! major version, an invalid or overflowing descriptor, a null pointer, a
//! device other than the host's) is the entry point's domain error
//! ([`refuse`]: `SelectionError` / `WitnessError`, with `argument`); what
//! the caller passes of the wrong type (a bare capsule, an unsupported
//! dtype) is a `TypeError` whose message names it, as for any argument.
//!
//! From there the view is an ndarray like any other: a read-only input that
//! is not C-contiguous and aligned (negative, zero or padded strides, an odd
//! byte offset) is copied once to one that is, as a NumPy array would be; an
//! output or in-place buffer must be C-contiguous, aligned and writeable, and
//! writes land in the producer's memory.
//!
//! # Why it holds, and what would break it
//!
//! DLPack does not say how large the producer's allocation is: like
//! `numpy.from_dlpack`, the view trusts the descriptor's shape, strides and
//! offset to lie inside it. What is checked here, in release too, is that
//! the byte extent they describe is representable (no overflow) and that a
//! non-empty tensor has a data pointer. A producer that lies about its
//! shape, or frees its memory while the capsule's deleter has not run, would
//! break the rule — as it would for every DLPack consumer.

use std::ffi::{c_int, c_void, CStr};

use dlpark::ffi::{DLDataTypeCode, DLDeviceType, DLManagedTensorVersioned};
use dlpark::python::ImportRequest;
use dlpark::{AllocationDeleter, DlpackFlags};
use numpy::npyffi::{self, npy_intp, NpyTypes, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyString};

use super::errors::{refuse, type_name, Domain};
use crate::keys::Format;

/// The newest DLPack version kvselect reads (dlpark's headers).
const MAX_VERSION: (u32, u32) = (
    dlpark::ffi::DLPACK_MAJOR_VERSION,
    dlpark::ffi::DLPACK_MINOR_VERSION,
);

/// The capsule names of DLPack's two ABIs, before and after consumption.
const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const USED_LEGACY: &CStr = c"used_dltensor";

/// The owner of an imported DLPack tensor: the `base` of every view of it.
/// Dropping it calls the producer's deleter, once.
#[pyclass(frozen, module = "kvselect._core", name = "_DlpackTensor")]
pub(super) struct Owner {
    _deleter: AllocationDeleter,
    /// bfloat16 / float8_e4m3fn, whose view holds their raw bits.
    format: Option<Format>,
}

/// The format a view's raw bits hold when it is a DLPack view of bfloat16
/// or float8_e4m3fn memory, else `None`.
pub(super) fn format_tag(arr: &Bound<'_, PyAny>) -> Option<Format> {
    let base = arr.getattr(pyo3::intern!(arr.py(), "base")).ok()?;
    base.cast::<Owner>().ok()?.get().format
}

/// Whether `obj` should be read through DLPack: it exports `__dlpack__` and
/// is not an ndarray (NumPy arrays keep their own, direct path).
fn is_producer(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<PyUntypedArray>().is_err()
        && obj
            .hasattr(pyo3::intern!(obj.py(), "__dlpack__"))
            .unwrap_or(false)
}

/// Device types whose memory the CPU reads directly.
fn host_readable(device_type: i32) -> bool {
    [
        DLDeviceType::CPU,
        DLDeviceType::CUDAHOST,
        DLDeviceType::ROCMHOST,
    ]
    .iter()
    .any(|d| d.0 as i64 == device_type as i64)
}

fn device_name(device_type: i32) -> &'static str {
    match device_type {
        2 => "cuda",
        4 => "opencl",
        7 => "vulkan",
        8 => "metal",
        10 => "rocm",
        13 => "cuda_managed",
        14 => "oneapi",
        _ => "a non-CPU device",
    }
}

fn refuse_device(domain: Domain, name: &str, device: (i32, i32)) -> PyErr {
    let msg = format!(
        "{name} is on {} (DLPack device type {}, id {}): kvselect reads host memory only; \
         move it first with {name}.cpu() (kvselect.testing copies it to the host for you)",
        device_name(device.0),
        device.0,
        device.1
    );
    refuse(domain, name, msg)
}

/// A producer's exception from `name.{method}()`, re-raised naming the
/// argument, with the original as its cause.
fn producer_failed(py: Python<'_>, domain: Domain, name: &str, method: &str, err: PyErr) -> PyErr {
    let msg = format!(
        "{name}.{method}() raised {}: {}",
        err.get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        err.value(py)
    );
    caused(py, refuse(domain, name, msg), err)
}

/// `new`, with `cause` as its `__cause__`.
fn caused(py: Python<'_>, new: PyErr, cause: PyErr) -> PyErr {
    new.set_cause(py, Some(cause));
    new
}

/// The version a `dltensor_versioned` capsule claims, read before it is
/// consumed (for the message when dlpark refuses it), or `None` for a
/// legacy capsule.
fn claimed_version(cap: &Bound<'_, PyCapsule>) -> Option<(u32, u32)> {
    let ptr = cap.pointer_checked(Some(VERSIONED)).ok()?;
    let managed = ptr.cast::<DLManagedTensorVersioned>().as_ptr();
    // SAFETY: a capsule named `dltensor_versioned` holds a non-null
    // `DLManagedTensorVersioned` (the DLPack ABI), whose first field, its
    // version, has the same layout in every major version (the spec: "it is
    // safe to" read it and call the deleter, and nothing else, when the major
    // differs). It is read before anything else runs, and not kept.
    let v = unsafe { std::ptr::addr_of!((*managed).version).read() };
    Some((v.major, v.minor))
}

/// A DLPack capsule dlpark refused to import (another major version, a null
/// tensor), naming the argument, with dlpark's error as its cause.
fn unreadable(
    py: Python<'_>,
    domain: Domain,
    name: &str,
    version: Option<(u32, u32)>,
    err: PyErr,
) -> PyErr {
    let msg = match version {
        Some((major, minor)) if major != MAX_VERSION.0 => format!(
            "{name}.__dlpack__() returned a DLPack {major}.{minor} capsule: kvselect reads \
             DLPack {}.x (it asks for max_version=({}, {})) and legacy capsules; the \
             capsule was deleted unread",
            MAX_VERSION.0, MAX_VERSION.0, MAX_VERSION.1
        ),
        _ => format!(
            "{name}.__dlpack__() returned a capsule kvselect cannot read: {}",
            err.value(py)
        ),
    };
    caused(py, refuse(domain, name, msg), err)
}

/// The capsule of `obj`: versioned when the producer takes `max_version`,
/// else legacy.
fn capsule<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    domain: Domain,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let method = pyo3::intern!(py, "__dlpack__");
    let kwargs = PyDict::new(py);
    kwargs.set_item(PyString::intern(py, "max_version"), MAX_VERSION)?;
    let cap = match obj.call_method(method, (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => obj
            .call_method0(method)
            .map_err(|e| producer_failed(py, domain, name, "__dlpack__", e))?,
        Err(e) => return Err(producer_failed(py, domain, name, "__dlpack__", e)),
    };
    let Ok(capsule) = cap.cast::<PyCapsule>() else {
        return Err(refuse(
            domain,
            name,
            format!(
                "{name}.__dlpack__() returned {}, not a DLPack capsule",
                type_name(&cap)
            ),
        ));
    };
    if capsule.is_valid_checked(Some(VERSIONED)) || capsule.is_valid_checked(Some(LEGACY)) {
        return Ok(cap);
    }
    let used = capsule.is_valid_checked(Some(USED_VERSIONED))
        || capsule.is_valid_checked(Some(USED_LEGACY));
    let named = match capsule.name()? {
        // SAFETY: the name is a valid C string, copied out at once, before
        // any Python code could rename the capsule.
        Some(n) => format!("named '{}'", unsafe { n.as_cstr() }.to_string_lossy()),
        None => "with no name".to_string(),
    };
    let msg = if used {
        format!(
            "{name}.__dlpack__() returned a capsule that was already consumed ({named}): \
             a DLPack capsule is read once, so a producer exports a new one on every call"
        )
    } else {
        format!(
            "{name}.__dlpack__() returned a PyCapsule {named}, not a DLPack capsule \
             ('dltensor_versioned' or 'dltensor')"
        )
    };
    Err(refuse(domain, name, msg))
}

/// What an imported tensor is, copied out of its descriptor.
struct Meta {
    device: (i32, i32),
    code: u8,
    bits: u8,
    lanes: u16,
    shape: Vec<i64>,
    strides: Vec<i64>,
    data: *mut c_void,
    read_only: bool,
}

/// The view's dtype for a DLPack dtype, and the format its raw bits hold.
fn numpy_dtype<'py>(
    py: Python<'py>,
    name: &str,
    m: &Meta,
) -> PyResult<(Bound<'py, PyArrayDescr>, Option<Format>)> {
    let code = DLDataTypeCode(m.code);
    let (dtype, format) = match (code, m.bits) {
        _ if m.lanes != 1 => (None, None),
        (DLDataTypeCode::FLOAT, 16) => (Some("float16"), None),
        (DLDataTypeCode::FLOAT, 32) => (Some("float32"), None),
        (DLDataTypeCode::FLOAT, 64) => (Some("float64"), None),
        (DLDataTypeCode::INT, 8) => (Some("int8"), None),
        (DLDataTypeCode::INT, 16) => (Some("int16"), None),
        (DLDataTypeCode::INT, 32) => (Some("int32"), None),
        (DLDataTypeCode::INT, 64) => (Some("int64"), None),
        (DLDataTypeCode::UINT, 8) => (Some("uint8"), None),
        (DLDataTypeCode::UINT, 16) => (Some("uint16"), None),
        (DLDataTypeCode::UINT, 32) => (Some("uint32"), None),
        (DLDataTypeCode::UINT, 64) => (Some("uint64"), None),
        (DLDataTypeCode::BFLOAT, 16) => (Some("uint16"), Some(Format::Bf16)),
        (DLDataTypeCode::FLOAT8_E4M3FN, 8) => (Some("uint8"), Some(Format::Fp8E4m3)),
        _ => (None, None),
    };
    let d = dtype.map(|d| PyArrayDescr::new(py, d)).transpose()?;
    d.map(|d| (d, format)).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{name} has an unsupported DLPack dtype (type code {}, {} bits, {} lanes): kvselect \
             reads float32, float16, bfloat16, float8_e4m3fn, float64 and integers",
            m.code, m.bits, m.lanes
        ))
    })
}

/// `obj` as an ndarray view of its DLPack memory (see the module docs), or
/// `None` when `obj` is not a DLPack producer (an ndarray, a list, a
/// scalar), which the caller reads as before.
pub(super) fn view<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    domain: Domain,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    if obj.cast::<PyCapsule>().is_ok() {
        return Err(PyTypeError::new_err(format!(
            "{name} is a bare PyCapsule: pass the tensor itself (an object with __dlpack__), \
             not its capsule"
        )));
    }
    if !is_producer(obj) {
        return Ok(None);
    }
    // 1. The device, before anything is exported.
    let dev = pyo3::intern!(py, "__dlpack_device__");
    if obj.hasattr(dev)? {
        let device: (i32, i32) = obj
            .call_method0(dev)
            .map_err(|e| producer_failed(py, domain, name, "__dlpack_device__", e))?
            .extract()
            .map_err(|e| {
                let msg = format!(
                    "{name}.__dlpack_device__() must return (device_type, device_id), two \
                     integers"
                );
                caused(py, refuse(domain, name, msg), e)
            })?;
        if !host_readable(device.0) {
            return Err(refuse_device(domain, name, device));
        }
    }
    // 2–3. The capsule, consumed by dlpark; from here on `imported` owns the
    // tensor and calls its deleter when dropped, on every path.
    let cap = capsule(obj, name, domain)?;
    let version = cap.cast::<PyCapsule>().ok().and_then(claimed_version);
    let imported = ImportRequest::new(cap.as_borrowed())
        .and_then(|r| r.import(None, None))
        .map_err(|e| unreadable(py, domain, name, version, e))?;
    let meta = {
        let t = imported.validate().map_err(|e| {
            refuse(
                domain,
                name,
                format!("{name}'s DLPack tensor is invalid: {e}"),
            )
        })?;
        let overflow = || refuse(domain, name, format!("{name}'s DLPack layout overflows"));
        let strides = t.strides_or_compact().map_err(|_| overflow())?.into_owned();
        let offset = isize::try_from(t.byte_offset()).map_err(|_| overflow())?;
        Meta {
            device: (t.device().device_type.0 as i32, t.device().device_id),
            code: t.dtype().code.0,
            bits: t.dtype().bits,
            lanes: t.dtype().lanes,
            shape: t.shape().to_vec(),
            strides,
            // The byte offset is applied as an address computation only:
            // `wrapping_byte_offset` never dereferences.
            data: (t.data_ptr() as *mut c_void).wrapping_byte_offset(offset),
            read_only: imported.flags().contains(DlpackFlags::READ_ONLY),
        }
    };
    // A legacy producer without __dlpack_device__: the descriptor's device.
    if !host_readable(meta.device.0) {
        return Err(refuse_device(domain, name, meta.device));
    }
    // 4. The dtype.
    let (descr, format) = numpy_dtype(py, name, &meta)?;
    let item = descr.itemsize() as i64;
    // 5. Shape and byte strides, their extent representable.
    let overflow = || refuse(domain, name, format!("{name}'s DLPack layout overflows"));
    let mut dims = Vec::with_capacity(meta.shape.len());
    let mut strides = Vec::with_capacity(meta.shape.len());
    let mut span: i64 = item;
    for (&n, &s) in meta.shape.iter().zip(&meta.strides) {
        let bytes = s.checked_mul(item).ok_or_else(overflow)?;
        let reach = n
            .checked_sub(1)
            .and_then(|m| m.max(0).checked_mul(bytes.checked_abs()?))
            .ok_or_else(overflow)?;
        span = span.checked_add(reach).ok_or_else(overflow)?;
        dims.push(npy_intp::try_from(n).map_err(|_| overflow())?);
        strides.push(npy_intp::try_from(bytes).map_err(|_| overflow())?);
    }
    isize::try_from(span).map_err(|_| overflow())?;
    let empty = meta.shape.contains(&0);
    if meta.data.is_null() && !empty {
        return Err(refuse(
            domain,
            name,
            format!("{name}'s DLPack data pointer is null"),
        ));
    }
    let owner = Owner {
        _deleter: imported.into_deleter(),
        format,
    };
    let owner = Bound::new(py, owner)?;
    let flags = if meta.read_only {
        0
    } else {
        npyffi::NPY_ARRAY_WRITEABLE
    };
    // An empty tensor may have a null pointer, which NumPy would replace
    // with an allocation of its own: point it at a dangling, aligned, never
    // read address instead (nothing is read from an empty array).
    let data = if empty {
        std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut c_void
    } else {
        meta.data
    };
    // SAFETY: `dims` and `strides` hold `ndim` entries each and outlive the
    // call; `descr` is a new reference, stolen by the call; `data` is the
    // producer's memory (or a dangling pointer for an empty array) which the
    // descriptor states holds `dims` elements at `strides` bytes — the DLPack
    // contract, checked above to be representable — and which stays alive
    // until `owner`, set as the array's base below, is dropped.
    let arr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            dims.len() as c_int,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
            data,
            flags,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `arr` is a new reference or null (an error is set).
    let arr = unsafe { Bound::from_owned_ptr_or_err(py, arr) }?;
    // SAFETY: `arr` is a new ndarray without a base; `SetBaseObject` steals
    // the reference to `owner` (and releases it itself on failure).
    let status = unsafe {
        PY_ARRAY_API.PyArray_SetBaseObject(
            py,
            arr.as_ptr() as *mut npyffi::PyArrayObject,
            owner.into_ptr(),
        )
    };
    if status != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(Some(arr))
}

/// `_dlpack_array(obj, name)`: the view [`view`] makes of a DLPack producer and
/// the format its raw bits hold (`"bfloat16"`, `"float8_e4m3fn"`, or None
/// when the dtype is NumPy's own) — for `kvselect.testing`, whose Python
/// checks read arrays through NumPy. An ndarray is returned as itself.
#[pyfunction]
#[pyo3(signature = (obj, name = "array"))]
fn _dlpack_array<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(Bound<'py, PyAny>, Option<&'static str>)> {
    match view(obj, name, Domain::Selection)? {
        Some(v) => {
            let format = format_tag(&v).map(Format::name);
            Ok((v, format))
        }
        None if obj.cast::<PyUntypedArray>().is_ok() => Ok((obj.clone(), None)),
        None => Err(PyTypeError::new_err(format!(
            "expected a DLPack producer or a numpy.ndarray, got {}",
            type_name(obj)
        ))),
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_dlpack_array, m)?)
}
