//! Key formats: keys and queries in the engines' element formats.
//!
//! Reads `index_q`, `index_k`, `kv_cache` and the attention keys, with
//! `key_format` / `query_format`. The rule: float32, float16 and ml_dtypes
//! bfloat16 / float8_e4m3fn arrays are read in place, never widened (a raw
//! uint16 / uint8 view names its format, and a typed array's format must
//! agree with the one named); float64 converts to float32 once where the
//! form converts; anything else is a `TypeError`. An array in non-native
//! byte order, misaligned or not C-contiguous is copied once to a native,
//! aligned, C-order one with the same values ([`native_aligned`]).

use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::IntoPyDict;

use super::arrays::InAnyRank;
use super::objects::numpy;
use super::options::FormatArg;
use crate::keys::{Encoded, Format};
use crate::python::dlpack;
use crate::python::errors::Domain;

/// An array of keys or queries in one of the engines' element formats,
/// borrowed as the core reads it: float32 in place (float64 and array-likes
/// converted once), float16 / bfloat16 / float8 e4m3fn (`ml_dtypes` arrays,
/// or raw `uint16` / `uint8` views with an explicit `format`) reinterpreted
/// in place, never widened. An array of any format in non-native byte order,
/// misaligned or not C-contiguous is copied once to a native, aligned,
/// C-order one first (same values).
pub(in crate::python) enum EncodedIn<'py> {
    F32(InAnyRank<'py, f32>),
    U16(PyReadonlyArrayDyn<'py, u16>, Format),
    U8(PyReadonlyArrayDyn<'py, u8>),
}

impl<'py> EncodedIn<'py> {
    /// [`EncodedIn::new`] of a 3-D array: the array and its shape, any
    /// other rank refused naming `name`, its axes (`layout`) and the shape
    /// received.
    pub fn new_3d(
        domain: Domain,
        obj: &Bound<'py, PyAny>,
        name: &str,
        layout: &str,
        format: FormatArg<'_>,
    ) -> PyResult<(Self, [usize; 3])> {
        let (e, shape) = Self::new(domain, obj, name, format)?;
        match shape[..] {
            [a, b, c] => Ok((e, [a, b, c])),
            _ => Err(crate::python::errors::refuse(
                domain,
                name,
                format!(
                    "{name} must be 3-D {layout}, got {}-D {:?}",
                    shape.len(),
                    shape
                ),
            )),
        }
    }

    /// `obj` in its format, and its shape. `format` (the `key_format` /
    /// `query_format` argument) is required for raw `uint16` / `uint8`
    /// arrays and must agree with a typed array's dtype.
    pub fn new(
        domain: Domain,
        obj: &Bound<'py, PyAny>,
        name: &str,
        format: FormatArg<'_>,
    ) -> PyResult<(Self, Vec<usize>)> {
        let np = numpy(obj.py())?;
        let view = dlpack::view(obj, name, domain)?;
        let arr = np.call_method1("asarray", (view.as_ref().unwrap_or(obj),))?;
        let dtype = element_name(view.as_ref(), &arr)?;
        let chosen = format_of(name, &dtype, format, true)?;
        let shape = arr.getattr("shape")?.extract::<Vec<usize>>()?;
        if chosen == Format::F32 {
            let (a, _) = domain.input_dyn::<f32>(&arr, name)?;
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
pub(in crate::python) fn native_aligned<'py>(
    arr: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
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
pub(in crate::python) fn is_native_order(arr: &Bound<'_, PyAny>) -> PyResult<bool> {
    let dtype = arr.getattr("dtype")?;
    Ok(dtype.getattr("itemsize")?.extract::<usize>()? <= 1
        || dtype.getattr("isnative")?.extract::<bool>()?)
}

/// The name of the element type an array `arr` holds: its dtype's name
/// (`"float16"`, `"uint8"`, ml_dtypes' `"bfloat16"`), or, for a DLPack
/// `view` of bfloat16 / float8_e4m3fn (raw bits, tagged), the tag's.
pub(in crate::python) fn element_name(
    view: Option<&Bound<'_, PyAny>>,
    arr: &Bound<'_, PyAny>,
) -> PyResult<String> {
    if let Some(f) = view.and_then(dlpack::format_tag) {
        return Ok(f.name().to_string());
    }
    // NumPy's own numeric types named from their descriptor's kind and size
    // (`dtype.name` is a Python-level property, a few microseconds a call);
    // any other type (ml_dtypes' are user-defined) by its name.
    if let Ok(a) = arr.cast::<PyUntypedArray>() {
        let dtype = a.dtype();
        if let Some(name) = builtin_name(dtype.num(), dtype.kind(), dtype.itemsize()) {
            return Ok(name.to_string());
        }
    }
    arr.getattr("dtype")?.getattr("name")?.extract()
}

/// The name NumPy gives a built-in numeric type (type number `num` below
/// `NPY_USERDEF`, 256) of `kind` and `size` bytes: `"float32"`, `"uint8"`,
/// `"bool"`; None for any other (user-defined types, complex, strings, ...).
fn builtin_name(num: std::os::raw::c_int, kind: u8, size: usize) -> Option<&'static str> {
    if num >= 256 {
        return None;
    }
    Some(match (kind, size) {
        (b'f', 2) => "float16",
        (b'f', 4) => "float32",
        (b'f', 8) => "float64",
        (b'u', 1) => "uint8",
        (b'u', 2) => "uint16",
        (b'u', 4) => "uint32",
        (b'u', 8) => "uint64",
        (b'i', 1) => "int8",
        (b'i', 2) => "int16",
        (b'i', 4) => "int32",
        (b'i', 8) => "int64",
        (b'b', 1) => "bool",
        _ => return None,
    })
}

/// The format an array `name` of `dtype` is read in: a typed array's own
/// (which the format argument must agree with when given), or the one the
/// argument names for a raw `uint16` / `uint8` view. float64 is read as
/// float32, converted once, only where `converts`.
pub(in crate::python) fn format_of(
    name: &str,
    dtype: &str,
    format: FormatArg<'_>,
    converts: bool,
) -> PyResult<Format> {
    // A format name that is none of them is a bad value, not a bad type.
    let (arg, asked) = (format.arg, format.asked()?);
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
