"""The fp8 (e4m3fn) grid the indexer's keys are stored on, as the engines
quantize them: round to the grid, its bytes, per-row scales."""

from __future__ import annotations

from typing import Tuple

import numpy as np


def fp8_e4m3fn(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest float8 e4m3fn value (ties to even).

    Saturates at ``±448``; what ``x.astype(float8_e4m3fn)`` gives, without
    ``ml_dtypes``. e4m3fn has 3 mantissa bits, exponents ``-6..8`` and
    subnormals of ``2^-9``.

    Parameters
    ----------
    x : array_like
        Any shape; read as float32.

    Returns
    -------
    numpy.ndarray
        float32 of ``x``'s shape, every value on the e4m3fn grid.
    """
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x), np.float32(448.0))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(a, where=a > 0, out=np.full_like(a, -7.0)))
    quantum = np.exp2(np.maximum(e, -6.0) - 3.0).astype(np.float32)
    r = np.rint(a / quantum) * quantum
    return np.copysign(np.minimum(r, np.float32(448.0)), x).astype(np.float32)


def fp8_e4m3fn_bytes(grid: np.ndarray) -> np.ndarray:
    """The float8 e4m3fn bytes of values already on its grid.

    Each byte is sign, 4 exponent bits (bias 7), 3 mantissa bits.

    Parameters
    ----------
    grid : array_like
        Values on the e4m3fn grid (as :func:`fp8_e4m3fn` returns them).

    Returns
    -------
    numpy.ndarray
        ``uint8`` of the same shape, C-contiguous.
    """
    v = np.asarray(grid, dtype=np.float32)
    a = np.abs(v).astype(np.float64)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    normal = a >= 2.0**-6
    exp = np.where(normal, e + 7, 0)
    mant = np.where(normal, a / np.exp2(np.where(normal, e, 0)) * 8 - 8, a / 2.0**-9)
    out = (np.signbit(v).astype(np.uint16) << 7) | (exp.astype(np.uint16) << 3) | np.rint(mant).astype(np.uint16)
    return np.ascontiguousarray(out.astype(np.uint8))


def quantize_fp8(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-row fp8 quantisation as vLLM writes its DSA index-K cache.

    As ``indexer_k_quant_and_cache``: ``scale = max(amax, 1e-4) / 448`` per
    row and ``x / scale`` in float8 e4m3fn.

    Parameters
    ----------
    x : array_like
        ``[..., d]``, rows on the last axis; read as float32.

    Returns
    -------
    bytes : numpy.ndarray
        The ``uint8`` e4m3fn bytes, ``[..., d]``.
    scale : numpy.ndarray
        The float32 per-row scales, ``[...]``.
    """
    x = np.asarray(x, dtype=np.float32)
    scale = (np.maximum(np.abs(x).max(axis=-1), np.float32(1e-4)) / np.float32(448.0)).astype(np.float32)
    return fp8_e4m3fn_bytes(fp8_e4m3fn(x / scale[..., None])), scale


def quantize_rows(x: np.ndarray) -> np.ndarray:
    """Per-row symmetric 8-bit quantisation, dequantised back to float32.

    Each row (last axis) is scaled by ``s = max|row| / 127`` and rounded:
    ``round(row / s) * s``, so a row takes at most 255 distinct values
    (``-127 s .. 127 s``); an all-zero row stays zero. This is the precision
    loss of an int8/fp8 indexer cache, kept in float32 so every consumer
    reads it as a plain score input.

    Parameters
    ----------
    x : array_like
        Rows on the last axis; read as float32.

    Returns
    -------
    numpy.ndarray
        float32 C-contiguous, ``x``'s shape.
    """
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    step = amax / np.float32(127.0)
    safe = np.where(step > 0, step, np.float32(1.0))
    out = np.rint(x / safe) * safe
    return np.ascontiguousarray(out, dtype=np.float32)
