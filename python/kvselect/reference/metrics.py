"""Attention probabilities, batched coverage and recall, the output
relative error; the twin of ``src/metrics.rs``.

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ._args import (
    _SELECTION,
    _WITNESS,
    ReferenceSelectionError,
    _count,
    _deliver,
    _float_array,
    _index_array,
    _out_buffer,
    _refuse,
)
from .attn import native_scale, qk_operands
from .witness import attention_mass_recall, segment_coverage

# ==========================================================================
# metrics: attention probabilities, batched coverage/recall, output error
# --------------------------------------------------------------------------
# Written from the module docs of src/metrics.rs. Each batched metric is the
# witness section's scalar metric of every row (called, not reimplemented);
# with GQA, attention row ``r`` is read against candidate row ``r // group``.
# ==========================================================================


def attention_probabilities(
    q: Any,
    k: Any,
    query_pos: Any,
    *,
    scale: Optional[float] = None,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Dense causal softmax rows, float64 ``[n_queries, n_q_heads, n_keys]``:
    row ``(i, h)`` is ``softmax((q_ih . k_j) * scale)`` over the visible keys
    ``j <= min(query_pos[i], n_keys - 1)`` of KV head ``h // group``, 0 after
    (one integer ``query_pos`` is ``[query_pos]``; ``out`` filled when given)."""
    raw = (q, k, query_pos)
    q, k, pos, group = qk_operands(q, k, query_pos)
    n_queries, n_q_heads, d_k = q.shape
    n_keys = k.shape[0]
    scale = native_scale(d_k) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ReferenceSelectionError("scale", f"scale={scale} is not finite")
    buf = _out_buffer(out, "out", (n_queries, n_q_heads, n_keys), _SELECTION, np.float64, raw)
    out = np.zeros((n_queries, n_q_heads, n_keys))
    for i, p in enumerate(pos):
        visible = min(p + 1, n_keys)
        if visible == 0:
            continue
        for h in range(n_q_heads):
            s = (k[:visible, h // group] @ q[i, h]) * scale
            e = np.exp(s - s.max())
            out[i, h, :visible] = e / e.sum()
    if buf is not None:
        buf[...] = out
        return buf
    return out


def _row_lens(context_lens: Any, rows: int) -> np.ndarray:
    """``context_lens`` as one length per candidate row, ``[rows]``."""
    lens = _index_array("context_lens", context_lens, 1, _WITNESS, positions=True)
    if lens.shape != (rows,):
        raise _refuse(_WITNESS, "context_lens", f"context_lens must be [rows={rows}], got {list(lens.shape)}")
    return lens


def segment_coverage_rows(
    candidates: Any, context_lens: Any, num_segments: int, *, out: Optional[np.ndarray] = None
) -> np.ndarray:
    """:func:`segment_coverage` of every row of ``candidates [rows, width]``
    with its own context length (``context_lens [rows]``); float64 ``[rows]``
    (or ``out`` filled)."""
    c = _index_array("candidates", candidates, 2, _WITNESS)
    lens = _row_lens(context_lens, c.shape[0])
    num_segments = _count("num_segments", num_segments)
    buf = _out_buffer(out, "out", (c.shape[0],), _WITNESS, np.float64, (candidates, context_lens))
    result = np.array(
        [segment_coverage(c[r], int(lens[r]), num_segments) for r in range(c.shape[0])],
        dtype=np.float64,
    )
    return result if buf is None else _deliver(result, buf)


def slots_used_rows(candidates: Any, context_lens: Any, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """How many distinct entries of each row of ``candidates [rows, width]``
    lie in ``[0, context_lens[r])``; int64 ``[rows]`` (or ``out`` filled)."""
    c = _index_array("candidates", candidates, 2, _WITNESS)
    lens = _row_lens(context_lens, c.shape[0])
    buf = _out_buffer(out, "out", (c.shape[0],), _WITNESS, np.int64, (candidates, context_lens))
    result = np.array([len({int(x) for x in row if 0 <= x < L}) for row, L in zip(c, lens)], dtype=np.int64)
    return result if buf is None else _deliver(result, buf)


def attention_mass_recall_rows(candidates: Any, attention: Any, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`attention_mass_recall` of every attention row ``r`` of
    ``attention [n_rows, row_len]`` against candidate row ``r // group``,
    ``group = n_rows // rows`` (a KV head's selection serves its query-head
    group); float64 ``[n_rows]``, NaN for a row with no mass. Or 3-D:
    ``candidates [n_queries, n_kv_heads, width]`` and ``attention
    [n_queries, n_q_heads, n_keys]``, the same rows flattened, float64
    ``[n_queries, n_q_heads]``. ``out`` filled when given."""
    c = _index_array("candidates", candidates, np.ndim(candidates) if np.ndim(candidates) == 3 else 2, _WITNESS)
    if c.ndim == 3:
        a = _float_array("attention", attention, None, _WITNESS, dtype=np.float64)
        n, hkv = c.shape[0], c.shape[1]
        if a.ndim != 3 or a.shape[0] != n:
            raise _refuse(
                _WITNESS, "attention", f"attention must be [n_queries={n}, n_q_heads, n_keys], got {list(a.shape)}"
            )
        hq = a.shape[1]
        if hkv == 0 or hq % hkv:
            raise _refuse(_WITNESS, "attention", f"n_q_heads={hq} is not a positive multiple of {hkv}")
        shape: tuple = (n, hq)
        c = c.reshape(n * hkv, c.shape[2])
        a = a.reshape(n * hq, a.shape[2])
    else:
        a = _float_array("attention", attention, None, _WITNESS, dtype=np.float64)
        if a.ndim != 2:
            raise _refuse(_WITNESS, "attention", f"attention must be 2-D like candidates, got {list(a.shape)}")
        shape = (a.shape[0],)
    rows, n_rows = c.shape[0], a.shape[0]
    buf = _out_buffer(out, "out", shape, _WITNESS, np.float64, (candidates, attention))
    if rows == 0:
        if n_rows != 0:
            raise _refuse(_WITNESS, "attention", "attention rows without candidate rows")
        return np.zeros(shape) if buf is None else buf
    group = n_rows // rows
    if group == 0 or group * rows != n_rows:
        raise _refuse(_WITNESS, "attention", f"{n_rows} attention rows are not a positive multiple of {rows}")
    result = np.array([attention_mass_recall(c[r // group], a[r]) for r in range(n_rows)], dtype=np.float64).reshape(
        shape
    )
    return result if buf is None else _deliver(result, buf)


def _relative_error(sparse: np.ndarray, dense: np.ndarray) -> float:
    """``||sparse - dense|| / ||dense||`` in float64: 0 when they are equal
    (both zero included), +inf when only ``dense`` is zero, NaN with NaN."""
    diff = float(np.sum((sparse - dense) ** 2))
    if diff == 0.0:
        return 0.0
    norm = float(np.sum(dense**2))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sqrt(np.float64(diff) / np.float64(norm)))


def _outputs(sparse: Any, dense: Any):
    """``sparse`` and ``dense`` as the native metric reads them (float32,
    widened to float64), of one shape."""
    s = _float_array("sparse", sparse, None, _SELECTION)
    d = _float_array("dense", dense, None, _SELECTION)
    if s.shape != d.shape:
        raise ReferenceSelectionError("dense", f"dense must be {list(s.shape)}, got {list(d.shape)}")
    return s, d


def output_relative_error(sparse: Any, dense: Any) -> float:
    """``||sparse - dense||_2 / ||dense||_2`` over whole arrays, float64."""
    s, d = _outputs(sparse, dense)
    return _relative_error(s.ravel(), d.ravel())


def output_relative_error_rows(sparse: Any, dense: Any, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`output_relative_error` per row over the last axis: float64 of
    the leading shape (or ``out`` filled). ``dense`` must have ``sparse``'s
    shape axis by axis."""
    s = _float_array("sparse", sparse, None, _SELECTION)
    if s.ndim == 0:
        raise ReferenceSelectionError("sparse", "sparse must be at least 1-D")
    d = _float_array("dense", dense, None, _SELECTION)
    if s.shape != d.shape:
        raise ReferenceSelectionError("dense", f"dense must be {list(s.shape)}, got {list(d.shape)}")
    lead = s.shape[:-1]
    buf = _out_buffer(out, "out", lead, _SELECTION, np.float64, (sparse, dense))
    s2 = s.reshape(-1, s.shape[-1]) if s.size else s.reshape(int(np.prod(lead)), s.shape[-1])
    d2 = d.reshape(s2.shape)
    result = np.array([_relative_error(s2[r], d2[r]) for r in range(s2.shape[0])]).reshape(lead)
    return result if buf is None else _deliver(result, buf)
