"""The key formats (float32, float16, bfloat16, float8 e4m3fn) and their
exact decodes from the bits (``decode``), which block selection and the
indexer read their keys and queries through; the twin of ``src/keys/``.

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._args import ReferenceSelectionError


def fp8_e4m3fn_table() -> np.ndarray:
    """The 256 float8 e4m3fn values, from the format's definition (1 sign,
    4 exponent bits of bias 7, 3 mantissa bits; 0x7F / 0xFF are NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(b & 0x7F) == 0x7F] = np.nan
    return value


_FORMATS = ("float32", "float16", "bfloat16", "float8_e4m3fn")


def decode(
    values: Any, format: Optional[str] = None, argument: Optional[str] = None, *, name: str = "values"
) -> np.ndarray:
    """``values`` decoded exactly to float64: float arrays as they are (float64
    rounded to float32 first, as natively), ml_dtypes bfloat16 / float8_e4m3fn
    arrays from their bits, and raw uint16 (``format`` "bfloat16" or
    "float16") / uint8 (``format`` "float8_e4m3fn") views. A format that is
    none of these is a ``TypeError``, or with ``argument`` (the format's
    parameter name) a refusal naming it, as natively. ``name`` is the
    values' own parameter name (``index_k``, ``keys``), which a dtype that
    holds no key format's values names, as natively."""
    a = np.asarray(values)
    if not a.dtype.isnative:  # '>f2', '>u2' bits: the same values in native order
        a = a.astype(a.dtype.newbyteorder("="))
    dtype = a.dtype.name
    if format is not None and format not in _FORMATS:
        if argument is not None:
            raise ReferenceSelectionError(argument, f"{argument} {format!r} is not one of {', '.join(_FORMATS)}")
        raise TypeError(f"unknown format {format!r}")
    if dtype in ("uint16", "uint8"):
        if format is None or (dtype == "uint16") != (format in ("bfloat16", "float16")):
            raise TypeError(f"{name} is a raw {dtype} array: it needs a matching format, got {format!r}")
        dtype = format
    elif format is not None and format != ("float32" if dtype == "float64" else dtype):
        raise TypeError(f"{name} has dtype {a.dtype}, which does not hold {format}")
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if dtype == "float16":
        return np.ascontiguousarray(a).view(np.float16).astype(np.float64)
    if dtype == "float8_e4m3fn":
        return fp8_e4m3fn_table()[np.ascontiguousarray(a).view(np.uint8)]
    if a.dtype.kind != "f" and a.size:
        raise TypeError(f"{name} must hold floats, got dtype {a.dtype}")
    return a.astype(np.float32).astype(np.float64)
