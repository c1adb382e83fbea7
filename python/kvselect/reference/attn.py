"""The baseline selectors, the oracle top-k and the dense and sparse
attention pass; the twin of ``src/attention/`` (the module is ``attn``, not
``attention``, so that ``kvselect.reference.attention`` stays the function).

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ._args import (
    _SELECTION,
    ReferenceSelectionError,
    _count,
    _deliver,
    _float_array,
    _index_array,
    _out_buffer,
    _query_batch,
)

# ==========================================================================
# attention: baseline selectors, the oracle top-k, the dense/sparse pass
# --------------------------------------------------------------------------
# Written from the module docs of src/attention/ and the stubs of the
# native module (``kvselect._core.pyi``):
#
# - a query at position ``p`` over ``n_keys`` keys sees keys
#   ``0 .. min(p, n_keys - 1)``; selector rows are built for a causal
#   sequence (row ``p`` has keys ``0..=p``) and are ascending, distinct;
# - layouts: ``q [n_queries, n_q_heads, d_k]``, ``k [n_keys, n_kv_heads,
#   d_k]``, ``v [n_keys, n_kv_heads, d_v]``, ``selection [n_queries,
#   n_kv_heads, width]``; GQA: query head ``h`` reads KV head ``h // group``
#   with ``group = n_q_heads // n_kv_heads``;
# - a selection row attends to the SET of its entries ``x`` with
#   ``0 <= x <= min(p, n_keys - 1)``: negatives are padding, later entries
#   are masked like future keys, duplicates count once (``duplicates="each"``:
#   the list, a repeat counted each time); an empty set gives
#   zeros, ``lse = -inf``, and is counted (per ``(query, query head)`` row);
# - the oracle ranks a row's visible weights descending, ties to the lower
#   key, NaN read as ``-inf`` and ``-0.0`` as ``+0.0``; rows ascending, -1
#   padded.
#
# The arithmetic is float64 throughout, from inputs first converted to
# float32 (what the native module computes on). The default softmax scale is
# the native one, ``1/sqrt(d_k)`` rounded to float32 (1 for ``d_k = 0``); the
# attention pass takes its ``scale`` as float32 (an explicit scale is rounded
# to float32 there), the probabilities take an explicit scale as given.
# ==========================================================================


def _pad_rows(rows: list, width: Optional[int]) -> np.ndarray:
    """int32 ``[len(rows), width]``: each row, then -1. ``width`` defaults to
    the longest row; a row longer than ``width`` is refused."""
    need = max((len(r) for r in rows), default=0)
    if width is None:
        width = need
    width = _count("width", width)
    if need > width:
        raise ReferenceSelectionError("width", f"width={width} cannot hold a row of {need}")
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out.astype(np.int32)


def dense_rows(query_pos: Any, width: Optional[int] = None) -> np.ndarray:
    """``Selector.dense().rows(query_pos, width=None)``: row ``p`` is ``0..=p``."""
    pos = _query_batch(query_pos)
    return _pad_rows([np.arange(p + 1) for p in pos], width)


def local_rows(query_pos: Any, window: int, width: Optional[int] = None) -> np.ndarray:
    """``Selector.local(window).rows(query_pos, width=None)``: the ``window``
    most recent keys of ``0..=p``, the query's own included."""
    pos = _query_batch(query_pos)
    window = _count("window", window)
    return _pad_rows([np.arange(max(p + 1 - window, 0), p + 1) for p in pos], width)


def sink_window_rows(query_pos: Any, sinks: int, window: int, width: Optional[int] = None) -> np.ndarray:
    """``Selector.sink_window(sinks, window).rows(query_pos, width=None)``:
    the union of the first ``sinks`` keys and the ``window`` most recent of
    ``0..=p``."""
    pos = _query_batch(query_pos)
    sinks = _count("sinks", sinks)
    window = _count("window", window)
    rows = []
    for p in pos:
        head = np.arange(min(sinks, p + 1))
        tail = np.arange(max(p + 1 - window, 0), p + 1)
        rows.append(np.union1d(head, tail))  # sorted, distinct
    return _pad_rows(rows, width)


def _oracle_row(weights: np.ndarray, budget: int) -> np.ndarray:
    """The ``budget`` largest of ``weights`` (all visible), ascending."""
    key = np.where(np.isnan(weights), -np.inf, weights) + 0.0  # NaN -> -inf, -0 -> +0
    idx = np.arange(len(weights))
    # lexsort sorts by the LAST key first: weight descending, then index ascending.
    order = np.lexsort((idx, -key))
    return np.sort(order[: min(budget, len(weights))])


def oracle_topk(
    attention: Any,
    query_pos: Any,
    budget: int,
    *,
    width: Optional[int] = None,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The oracle top-k of each attention row (float64 ``[n, row_len]``,
    row ``r`` belonging to ``query_pos[r]``; one integer is ``[query_pos]``):
    the ``budget`` heaviest keys among ``0..=min(query_pos[r], row_len - 1)``,
    ties to the lower key, NaN read as -inf; int32 ``[n, width]``, ascending
    then -1 (or ``out`` filled)."""
    raw = attention
    a = _float_array("attention", attention, 2, _SELECTION, dtype=np.float64)
    pos = _query_batch(query_pos)
    budget = _count("budget", budget)
    if len(pos) != a.shape[0]:
        raise ReferenceSelectionError("query_pos", "query_pos needs one position per row")
    rows = []
    for r, p in enumerate(pos):
        visible = min(p + 1, a.shape[1])
        rows.append(_oracle_row(a[r, :visible], budget))
    result = _pad_rows(rows, width)
    return _deliver(result, _out_buffer(out, "out", result.shape, _SELECTION, np.int32, (raw, query_pos)))


def native_scale(d_k: int) -> float:
    """The default scale as the native module uses it: ``1/sqrt(d_k)``
    rounded to float32 (1 for ``d_k = 0``)."""
    return 1.0 if d_k == 0 else float(np.float32(1.0 / np.sqrt(d_k)))


def qk_operands(q: Any, k: Any, query_pos: Any):
    """``q``, ``k`` (float64 from float32), the query positions and the GQA
    group, the shapes checked against each other."""
    q = _float_array("q", q, 3, _SELECTION)
    k = _float_array("k", k, 3, _SELECTION)
    if q.shape[2] != k.shape[2]:
        raise ReferenceSelectionError("q", f"q has d_k={q.shape[2]} but k has d_k={k.shape[2]}")
    n_q_heads, n_kv_heads = q.shape[1], k.shape[1]
    if n_kv_heads == 0:
        raise ReferenceSelectionError("n_kv_heads", "n_kv_heads is 0")
    if n_q_heads % n_kv_heads != 0:
        raise ReferenceSelectionError("n_q_heads", "n_q_heads is not a multiple of n_kv_heads")
    pos = _query_batch(query_pos)
    if len(pos) != q.shape[0]:
        raise ReferenceSelectionError("query_pos", "query_pos needs one position per query")
    return q, k, pos, n_q_heads // n_kv_heads


def attention(
    q: Any,
    k: Any,
    v: Any,
    query_pos: Any,
    selection: Any = None,
    *,
    scale: Optional[float] = None,
    duplicates: str = "once",
    out: Optional[np.ndarray] = None,
    lse_out: Optional[np.ndarray] = None,
):
    """The attention pass that :func:`dense_attention` (``selection`` None:
    every visible key) and :func:`sparse_attention` share: ``(out float64
    [n_queries, n_q_heads, d_v], lse float64 [n_queries, n_q_heads],
    empty_rows)``.

    Row ``(i, h)`` attends to the set of entries ``x`` of
    ``selection[i, h // group]`` with ``0 <= x <= min(query_pos[i],
    n_keys - 1)``: ``out = sum_j softmax(s)_j v_j`` and ``lse = log sum_j
    exp(s_j)`` with ``s_j = (q_ih . k_j) * scale``. A row whose set is empty
    gets zeros and ``lse = -inf`` and is counted in ``empty_rows``. With
    ``duplicates="each"`` the row attends to the entries as a list: a
    repeated entry counts each time it appears (the engines' sparse MLA
    kernels). One
    integer ``query_pos`` is ``[query_pos]``. ``out`` / ``lse_out`` (float32
    of exactly those shapes, sharing no input's memory nor each other's) are
    filled with the results rounded to float32 and returned in their place."""
    raw = (q, k, v, selection, query_pos)
    if not isinstance(duplicates, str):
        raise TypeError(f"duplicates must be a string, got {type(duplicates).__name__}")
    if duplicates not in ("once", "each"):
        raise ReferenceSelectionError("duplicates", f'duplicates must be one of "once", "each", got "{duplicates}"')
    q, k, pos, group = qk_operands(q, k, query_pos)
    n_queries, n_q_heads, d_k = q.shape
    n_keys, n_kv_heads = k.shape[0], k.shape[1]
    v = _float_array("v", v, 3, _SELECTION)
    if v.shape[:2] != (n_keys, n_kv_heads):
        raise ReferenceSelectionError("v", f"v must be [{n_keys}, {n_kv_heads}, d_v], got {v.shape}")
    d_v = v.shape[2]
    if selection is not None:
        sel = _index_array("selection", selection, 3, _SELECTION)
        if sel.shape[:2] != (n_queries, n_kv_heads):
            raise ReferenceSelectionError(
                "selection", f"selection must be [{n_queries}, {n_kv_heads}, width], got {sel.shape}"
            )
    out_buf = _out_buffer(out, "out", (n_queries, n_q_heads, d_v), _SELECTION, np.float32, raw)
    lse_buf = _out_buffer(lse_out, "lse_out", (n_queries, n_q_heads), _SELECTION, np.float32, raw + (out_buf,))
    # The attention pass computes with a float32 scale, which must be finite.
    with np.errstate(over="ignore"):
        scale = float(np.float32(native_scale(d_k) if scale is None else scale))
    if not math.isfinite(scale):
        raise ReferenceSelectionError("scale", f"scale={scale} is not finite")

    out = np.zeros((n_queries, n_q_heads, d_v))
    lse = np.full((n_queries, n_q_heads), -np.inf)
    empty_rows = 0
    for i, p in enumerate(pos):
        visible = min(p + 1, n_keys)
        for kv in range(n_kv_heads):
            if selection is None:
                keys = np.arange(visible)
            else:
                row = sel[i, kv]
                keys = row[(row >= 0) & (row < visible)]
                keys = np.unique(keys) if duplicates == "once" else np.sort(keys)
            heads = slice(kv * group, (kv + 1) * group)  # the query heads of KV head kv
            if len(keys) == 0:
                empty_rows += group
                continue
            s = (q[i, heads] @ k[keys, kv].T) * scale  # [group, len(keys)]
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            total = e.sum(axis=1, keepdims=True)
            out[i, heads] = (e @ v[keys, kv]) / total
            lse[i, heads] = (m + np.log(total))[:, 0]
    if out_buf is not None:
        out_buf[...] = out
        out = out_buf
    if lse_buf is not None:
        lse_buf[...] = lse
        lse = lse_buf
    return out, lse, empty_rows


def dense_attention(
    q: Any,
    k: Any,
    v: Any,
    query_pos: Any,
    *,
    scale: Optional[float] = None,
    out: Optional[np.ndarray] = None,
    lse_out: Optional[np.ndarray] = None,
):
    """Dense causal attention: ``(out float64 [n_queries, n_q_heads, d_v],
    lse float64 [n_queries, n_q_heads])``, every query over keys
    ``0..=query_pos``; ``out`` / ``lse_out`` as :func:`attention`."""
    o, lse, _ = attention(q, k, v, query_pos, None, scale=scale, out=out, lse_out=lse_out)
    return o, lse


def sparse_attention(
    q: Any,
    k: Any,
    v: Any,
    query_pos: Any,
    selection: Any,
    *,
    scale: Optional[float] = None,
    duplicates: str = "once",
    out: Optional[np.ndarray] = None,
    lse_out: Optional[np.ndarray] = None,
):
    """Sparse causal attention over ``selection [n_queries, n_kv_heads,
    width]``: ``(out, lse, empty_rows)`` as :func:`attention` (``duplicates``
    ``"once"``: a set; ``"each"``: a repeated entry counted each time)."""
    return attention(q, k, v, query_pos, selection, scale=scale, duplicates=duplicates, out=out, lse_out=lse_out)
