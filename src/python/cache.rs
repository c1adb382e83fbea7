//! The paged cache argument both paged forms (the indexer's, block
//! selection's) take: its page layout from the dtype and the layout name,
//! and its pages as bytes read in place.

use numpy::PyArrayDyn;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::args::{numpy, Obj, StridedRows};
use super::errors::{refuse, Domain};
use crate::keys::{Format, PageLayout};

/// A paged cache argument as bytes in place: `[num_blocks, …]`, each page
/// (every axis but the first) contiguous, the block axis with any positive
/// stride (vLLM interleaves other layers' pages); any other layout is
/// copied to C order once.
pub(super) fn pages<'py>(cache: &Obj<'py>) -> PyResult<StridedRows<'py, u8>> {
    let np = numpy(cache.py())?;
    let (arr, uint8) = (np.call_method1("asarray", (cache,))?, np.getattr("uint8")?);
    // The last axis reinterpreted as bytes: a view when it is contiguous.
    let bytes = match arr.call_method1("view", (&uint8,)) {
        Ok(b) => b,
        Err(_) => np
            .call_method1("ascontiguousarray", (arr,))?
            .call_method1("view", (&uint8,))?,
    };
    if let Some(rows) = StridedRows::new(bytes.cast::<PyArrayDyn<u8>>()?, 1)? {
        return Ok(rows);
    }
    let copy = np.call_method1("ascontiguousarray", (bytes,))?;
    let bad = || {
        refuse(
            Domain::Selection,
            "kv_cache",
            "kv_cache has an unusable memory layout",
        )
    };
    StridedRows::new(copy.cast::<PyArrayDyn<u8>>()?, 1)?.ok_or_else(bad)
}

/// The page layout and the cache's shape, from `layout` and the dtype.
pub(super) fn cache_layout(
    cache: &Obj<'_>,
    layout: &str,
    key_format: Option<&str>,
) -> PyResult<(PageLayout, Vec<usize>)> {
    let np = numpy(cache.py())?;
    let arr = np.call_method1("asarray", (cache,))?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    let dtype: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
    match layout {
        "fp8_scaled" => {
            let ok = dtype == "uint8" && matches!(shape[..], [_, _, 1, x] | [_, _, x] if x > 4);
            if !ok {
                let msg = format!(
                    "with layout='fp8_scaled', kv_cache must be uint8 [num_blocks, block_size, 1, d + 4] \
                     or [num_blocks, block_size, d + 4], got {dtype} {shape:?}"
                );
                return Err(refuse(Domain::Selection, "kv_cache", msg));
            }
            Ok((PageLayout::Fp8WithScales, shape))
        }
        "dense" => {
            let typed = Format::from_name(&dtype);
            let format = match (typed, key_format.map(Format::from_name)) {
                (Some(t), None) => t,
                (Some(t), Some(Some(k))) if t == k => t,
                (None, Some(Some(k @ (Format::F16 | Format::Bf16)))) if dtype == "uint16" => k,
                (None, Some(Some(Format::Fp8E4m3))) if dtype == "uint8" => Format::Fp8E4m3,
                (_, Some(None)) => {
                    return Err(PyTypeError::new_err(format!(
                        "key_format {:?} is not one of float32, float16, bfloat16, float8_e4m3fn",
                        key_format.unwrap_or_default()
                    )))
                }
                (_, Some(Some(k))) => {
                    return Err(PyTypeError::new_err(format!(
                        "kv_cache has dtype {dtype}, which does not hold {} (key_format): pass \
                         the pages in that format, or a raw uint16 (bfloat16, float16) / uint8 \
                         (float8_e4m3fn) view of them",
                        k.name()
                    )))
                }
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "kv_cache has dtype {dtype}: pages are read in place, so they must be float32, \
                         float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw uint16 / uint8 view with \
                         key_format"
                    )))
                }
            };
            if shape.len() != 3 {
                let msg = format!(
                    "kv_cache must be 3-D [num_blocks, block_size, d], got {}-D",
                    shape.len()
                );
                return Err(refuse(Domain::Selection, "kv_cache", msg));
            }
            Ok((PageLayout::Dense(format), shape))
        }
        other => Err(PyValueError::new_err(format!(
            "layout must be 'dense' or 'fp8_scaled', got {other:?}"
        ))),
    }
}
