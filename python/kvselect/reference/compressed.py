"""DeepSeek-V4's attention sets, vLLM's combined index rows, the entry →
tokens map and GLM-5-Next's pool expansion, in plain loops over the rules
of ``src/compressed/mod.rs`` (``m`` the compress ratio, ``W`` the window,
``p`` a query's token position):

- a compressed entry ``w`` is visible to ``p`` iff ``w < (p + 1) // m``;
- the window is ``[max(0, p - W + 1), p]`` ascending;
- CSA entry ``w`` covers tokens ``[max(0, m(w - 1)), m(w + 1))``, HCA entry
  (and GLM-5-Next pool) ``w`` covers ``[m w, m(w + 1))``;
- vLLM's ``combine_topk_swa_indices``: the first ``min((pos + 1) // m, topk)``
  top-k entries plus ``M b``, then the window at ``M b + N + (pos - swa_len +
  1 - gather_start) + j``, then -1 to ``roundup(topk + W, 128)``.

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._args import (
    _SELECTION,
    ReferenceSelectionError,
    _along,
    _count,
    _deliver,
    _index_array,
    _out_buffer,
    _output,
    _query_batch,
    _query_positions,
)

_I32_MAX = 2**31 - 1
SPARSE_PREFILL_TOPK_ALIGNMENT = 128  # vLLM's _SPARSE_PREFILL_TOPK_ALIGNMENT


def _n(name: str, value: Any, most: int = _I32_MAX) -> int:
    """A count argument, refused in the selection domain."""
    try:
        v = _count(name, value)
    except ValueError as e:
        raise ReferenceSelectionError(name, str(e)) from None
    if v > most:
        raise ReferenceSelectionError(name, f"{name} is too large: at most {most}")
    return v


def _ratio(compress_ratio: Any) -> int:
    m = _n("compress_ratio", compress_ratio, 2**32 - 1)
    if m == 0:
        raise ReferenceSelectionError("compress_ratio", "compress_ratio must be at least 1")
    return m


def _positions_fit(pos: np.ndarray) -> None:
    for i, p in enumerate(pos):
        if p >= _I32_MAX:
            raise ReferenceSelectionError("query_pos", f"query_pos[{i}] = {p} is too large")


def window_positions(query_pos: Any, window_size: Any, *, out: Any = None) -> np.ndarray:
    """Each query's window ``[max(0, p - W + 1), p]`` ascending, then -1."""
    pos = _query_batch(query_pos)
    w = _n("window_size", window_size)
    o = _output(out, (len(pos), w), _SELECTION, inputs=(query_pos,))
    _positions_fit(pos)
    rows = np.full((len(pos), w), -1, np.int64)
    for i, p in enumerate(pos):
        window = list(range(max(0, p - w + 1), p + 1))
        rows[i, : len(window)] = window
    return _deliver(rows, o)


def visible_entries(query_pos: Any, compress_ratio: Any, n_entries: Any, *, out: Any = None) -> np.ndarray:
    """Entries ``0 .. min((p + 1) // m, n_entries)`` ascending, then -1."""
    pos = _query_batch(query_pos)
    m = _ratio(compress_ratio)
    t = _n("n_entries", n_entries)
    o = _output(out, (len(pos), t), _SELECTION, inputs=(query_pos,))
    _positions_fit(pos)
    rows = np.full((len(pos), t), -1, np.int64)
    for i, p in enumerate(pos):
        seen = min((p + 1) // m, t)
        rows[i, :seen] = range(seen)
    return _deliver(rows, o)


def compressed_entry_tokens(entries: Any, compress_ratio: Any, *, overlap: bool, out: Any = None) -> np.ndarray:
    """``[start, end)`` of each entry's tokens, ``entries.shape + (2,)``."""
    a = np.asarray(entries)
    e = _index_array("entries", a, a.ndim, _SELECTION)
    m = _ratio(compress_ratio)
    o = _output(out, e.shape + (2,), _SELECTION, inputs=(entries,))
    result = np.full(e.shape + (2,), -1, np.int64)
    for i, w in enumerate(e.reshape(-1)):
        if w < -1:
            raise ReferenceSelectionError("entries", f"entries[{i}] = {w} is negative and not the -1 padding")
        if w >= 0 and (w + 1) * m > _I32_MAX:
            raise ReferenceSelectionError("entries", f"entries[{i}] = {w} ends past int32")
    flat = result.reshape(-1, 2)
    for i, w in enumerate(e.reshape(-1)):
        if w >= 0:
            flat[i] = (max(0, m * (w - 1)) if overlap else m * w, m * (w + 1))
    return _deliver(result, o)


def expand_entries(
    entry_rows: Any, query_pos: Any, compress_ratio: Any, *, tail: bool = False, width: Any = None, out: Any = None
) -> np.ndarray:
    """Entries expanded to their ``m`` tokens at columns ``j*m ..``, the
    visible tail in the next ``m - 1`` columns (``tail``), -1 to ``width``."""
    rows = _index_array("entry_rows", entry_rows, 2, _SELECTION)
    n, k = rows.shape
    pos = _query_positions(query_pos, n)
    m = _ratio(compress_ratio)
    least = k * m + (m - 1 if tail else 0)
    if least > _I32_MAX:
        raise ReferenceSelectionError("compress_ratio", "k * compress_ratio is too large")
    width = least if width is None else _n("width", width)
    o = _output(out, (n, width), _SELECTION, inputs=(entry_rows, query_pos))
    _positions_fit(pos)
    if width < least:
        raise ReferenceSelectionError("width", f"width={width} is below the {least} columns the expansion writes")
    for i, p in enumerate(pos):
        for j, w in enumerate(rows[i]):
            if w < -1 or w >= (p + 1) // m:
                raise ReferenceSelectionError("entry_rows", f"entry_rows[{i}, {j}] = {w} is not a visible entry")
    result = np.full((n, width), -1, np.int64)
    for i, p in enumerate(pos):
        tokens = []
        for w in rows[i]:
            tokens += list(range(m * w, m * (w + 1))) if w >= 0 else [-1] * m
        if tail:
            count = (p + 1) % m
            start = p + 1 - count
            tokens += list(range(start, start + count)) + [-1] * (m - 1 - count)
        result[i, : len(tokens)] = tokens
    return _deliver(result, o)


def combine_topk_swa_indices(
    topk_indices: Any,
    query_start_loc: Any,
    seq_lens: Any,
    gather_lens: Any,
    window_size: Any,
    compress_ratio: Any,
    topk: Any,
    M: Any,
    N: Any,
    *,
    out: Any = None,
    lens_out: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's ``combine_topk_swa_indices``, token by token (see the module
    docstring); the refusals of the native function, before any write."""
    t = _index_array("topk_indices", topk_indices, 2, _SELECTION)
    qsl = _index_array("query_start_loc", query_start_loc, 1, _SELECTION, positions=True)
    reqs = max(len(qsl) - 1, 0)
    seq = _along("seq_lens", seq_lens, ("num_reqs", reqs))
    gather = _along("gather_lens", gather_lens, ("num_reqs", reqs))
    w, k = _n("window_size", window_size), _n("topk", topk)
    m = _ratio(compress_ratio)
    big_m, big_n = _n("M", M), _n("N", N)
    width = (k + w + SPARSE_PREFILL_TOPK_ALIGNMENT - 1) // SPARSE_PREFILL_TOPK_ALIGNMENT * SPARSE_PREFILL_TOPK_ALIGNMENT
    if width > _I32_MAX:
        raise ReferenceSelectionError("window_size", "topk + window_size is too large")
    num_tokens = t.shape[0]
    inputs = (topk_indices, query_start_loc, seq_lens, gather_lens)
    o = _output(out, (num_tokens, width), _SELECTION, inputs=inputs)
    lo: np.ndarray | None = _out_buffer(
        lens_out, "lens_out", (num_tokens,), _SELECTION, np.int32, inputs + ((o,) if o is not None else ())
    )
    if t.shape[1] < k:
        raise ReferenceSelectionError("topk_indices", f"topk_indices has {t.shape[1]} columns, fewer than topk={k}")
    if len(qsl) != reqs + 1 or len(qsl) == 0 or qsl[0] != 0 or qsl[-1] != num_tokens:
        raise ReferenceSelectionError("query_start_loc", "query_start_loc must run from 0 to num_tokens")
    rows = np.full((num_tokens, width), -1, np.int64)
    lens = np.zeros(num_tokens, np.int64)
    for b in range(reqs):
        if qsl[b + 1] < qsl[b]:
            raise ReferenceSelectionError("query_start_loc", f"query_start_loc[{b + 1}] falls")
    for b in range(reqs):
        qlen = qsl[b + 1] - qsl[b]
        if qlen > seq[b]:
            raise ReferenceSelectionError("seq_lens", f"seq_lens[{b}] is shorter than request {b}'s query")
        if gather[b] > seq[b]:
            raise ReferenceSelectionError("gather_lens", f"gather_lens[{b}] is longer than seq_lens[{b}]")
        gather_start = seq[b] - gather[b]
        base = big_m * b
        if qlen > 0:
            first = seq[b] - qlen
            if first - min(first + 1, w) + 1 < gather_start:
                raise ReferenceSelectionError("gather_lens", f"request {b}'s window starts before its gathered tokens")
            if base + big_n + gather[b] > _I32_MAX + 1:
                raise ReferenceSelectionError("M", f"request {b}'s window indices pass int32")
        if b + 1 < reqs and big_n + gather[b] > big_m:
            raise ReferenceSelectionError("M", f"request {b}'s window would run into request {b + 1}'s workspace")
        for i in range(qsl[b], qsl[b + 1]):
            pos = seq[b] - qlen + (i - qsl[b])
            topk_len = min((pos + 1) // m, k)
            swa_len = min(pos + 1, w)
            for j in range(topk_len):
                v = t[i, j]
                if v >= big_n:
                    raise ReferenceSelectionError("topk_indices", f"topk_indices[{i}, {j}] = {v} is at or past N")
                if base + v > _I32_MAX:
                    raise ReferenceSelectionError("M", f"topk_indices[{i}, {j}] + M*{b} passes int32")
                rows[i, j] = v + base
            for j in range(swa_len):
                rows[i, topk_len + j] = base + big_n + (pos - swa_len + 1 - gather_start) + j
            lens[i] = topk_len + swa_len
    return _deliver(rows, o), _deliver(lens, lo)
