"""DeepSeek-V4's combined index rows, checked: is each row vLLM's
``combine_topk_swa_indices`` layout of a right CSA top-k and the exact
sliding window?

A row of the sparse-prefill index (docs/compressed-keys.md) is three parts:
the top-k over compressed entries, ``topk_len = min((p + 1) // m, topk)``
workspace offsets ``M*b + w``; the window, ``swa_len = min(p + 1, W)``
offsets ``M*b + N + (t - gather_start)`` for ``t = p - swa_len + 1 .. p``,
ascending; then ``-1``. Nothing but the top-k part is a choice, so:

- the top-k part, read back as entry ids (``offset - M*b``), is judged by
  :func:`kvselect.checking.check_indexer_topk` with ``compress_ratio`` over
  the request's entries: a dropped entry, one not yet written (``w >= (p +
  1) // m``), a duplicate — with its tolerance rules, any order of the
  entries passing;
- the window and the padding must be exactly the layout's (``window_slot``:
  a slot outside the window, one missing, or out of order; ``padding``: a
  non-``-1`` entry past the row's length);
- ``combined_lens`` must be ``topk_len + swa_len`` (``wrong_len``).

The report is :func:`kvselect.checking.check_indexer_topk`'s over the rows,
its reasons joined by these three (each row listed once, with every problem
found).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from kvselect.checking._common import _refused
from kvselect.checking.exact import check_indexer_topk
from kvselect.checking.report import Report

_REASONS = ("window_slot", "padding", "wrong_len")


#: The most any of the layout's counts can be: an int32 index.
_I32_MAX = 2**31 - 1


def check_v4_combined_indices(
    combined_indices: Any,
    combined_lens: Any,
    index_q: Any,
    weights: Any,
    index_k: Any,
    cu_entries: Any,
    query_start_loc: Any,
    seq_lens: Any,
    gather_lens: Any,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    precision: str = "float32",
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
) -> Report:
    """Whether each row of vLLM's combined index (``combine_topk_swa_indices``'s
    ``(combined_indices, combined_lens)``) is the layout of a right top-k
    over compressed entries followed by the exact window (module docs).

    Parameters
    ----------
    combined_indices : array_like of int, [num_tokens, width]
        The engine's rows.
    combined_lens : array_like of int, [num_tokens]
        The engine's row lengths.
    index_q, weights : array_like
        The indexer's queries and head weights, one per token row, as
        :func:`kvselect.indexer_topk` takes them.
    index_k : array_like, [n_entries, d]
        Every request's compressed indexer keys, concatenated.
    cu_entries : array_like of int, [num_reqs + 1]
        Request ``b``'s entries are rows ``cu_entries[b] .. cu_entries[b + 1]`` of ``index_k``.
    query_start_loc, seq_lens, gather_lens : array_like of int
        As :func:`kvselect.combine_topk_swa_indices` takes them.
    window_size, compress_ratio, topk, M, N : int
        As :func:`kvselect.combine_topk_swa_indices` takes them.
    key_scale, key_format, query_format, precision, atol, rtol : optional
        As :func:`kvselect.checking.check_indexer_topk` takes them.

    Returns
    -------
    Report
        :func:`kvselect.checking.check_indexer_topk`'s report over the rows
        (``rows``, ``correct``, ``wrong``, ``vacuous``, ``by_reason``,
        ``details``), with the reasons ``window_slot``, ``padding`` and
        ``wrong_len`` joined.

    Raises
    ------
    SelectionError
        (a ValueError) on arguments that do not fit together: shapes,
        ``query_start_loc`` not rising from 0 to ``num_tokens``, a query
        longer than its sequence, ``cu_entries`` not rising to the keys.
    """
    rows = np.asarray(combined_indices)
    lens = np.asarray(combined_lens).astype(np.int64).reshape(-1)
    if rows.ndim != 2 or rows.dtype.kind not in "iu":
        raise _refused("combined_indices", f"combined_indices must be 2-D integers, got {rows.dtype} {rows.shape}")
    n, width = rows.shape
    if len(lens) != n:
        raise _refused("combined_lens", f"combined_lens has {len(lens)} entries for {n} rows")
    qsl = np.asarray(query_start_loc).astype(np.int64).reshape(-1)
    sl = np.asarray(seq_lens).astype(np.int64).reshape(-1)
    gl = np.asarray(gather_lens).astype(np.int64).reshape(-1)
    cu = np.asarray(cu_entries).astype(np.int64).reshape(-1)
    n_req = len(sl)
    if len(qsl) != n_req + 1 or qsl[0] != 0 or qsl[-1] != n or np.any(np.diff(qsl) < 0):
        raise _refused(
            "query_start_loc", f"query_start_loc must rise from 0 to the {n} rows, one entry per request and one more"
        )
    if len(gl) != n_req or len(cu) != n_req + 1:
        raise _refused("gather_lens", "gather_lens, seq_lens and cu_entries[1:] need one entry per request")
    if np.any(np.diff(qsl) > sl):
        raise _refused("seq_lens", "a request has more query tokens than its sequence")
    m, w_size, k, big_m, big_n = int(compress_ratio), int(window_size), int(topk), int(M), int(N)
    for name, v in (("window_size", w_size), ("compress_ratio", m), ("topk", k), ("M", big_m), ("N", big_n)):
        if not 0 <= v <= _I32_MAX:  # as combine_topk_swa_indices reads them
            raise _refused(name, f"{name} must be 0 ..= {_I32_MAX}, got {v}")
    if k < 1:
        raise _refused("topk", f"topk must be at least 1, got {k}")
    if m < 1:
        raise _refused("compress_ratio", f"compress_ratio must be at least 1, got {m}")
    req = np.repeat(np.arange(n_req), np.diff(qsl))
    pos = sl[req] - np.diff(qsl)[req] + (np.arange(n) - qsl[req])
    topk_len = np.minimum((pos + 1) // m, k)
    swa_len = np.minimum(pos + 1, w_size)
    gather_start = sl[req] - gl[req]
    # The top-k part as entry ids, -1 padded: what check_indexer_topk judges. No row
    # holds more than its topk_len, so the rows are that wide at most (a topk far
    # past the entries, 2**26, would otherwise size them [n, topk]).
    entries = np.full((n, int(topk_len.max(initial=0))), -1, dtype=np.int64)
    for i in range(n):
        part = rows[i, : min(int(topk_len[i]), width)].astype(np.int64) - big_m * int(req[i])
        entries[i, : len(part)] = np.where(part >= 0, part, -1)
    report = check_indexer_topk(
        entries,
        index_q,
        weights,
        index_k,
        pos,
        k,
        key_scale=key_scale,
        key_format=key_format,
        query_format=query_format,
        cu_seqlens=cu,
        seq_ids=req,
        precision=precision,
        atol=atol,
        rtol=rtol,
        compress_ratio=m,
    )
    problems: Dict[int, List[Dict[str, Any]]] = {}
    for i in range(n):
        t0, sw = int(topk_len[i]), int(swa_len[i])
        found: List[Dict[str, Any]] = []
        if lens[i] != t0 + sw:
            found.append({"reason": "wrong_len", "engine": int(lens[i]), "expected": t0 + sw})
        p, b = int(pos[i]), int(req[i])
        want = big_m * b + big_n + np.arange(p - sw + 1, p + 1) - int(gather_start[i])
        got = rows[i, t0 : t0 + sw].astype(np.int64)
        if len(got) != sw or not np.array_equal(got, want):
            bad = sorted(set(got.tolist()) - set(want.tolist()))
            missing = sorted(set(want.tolist()) - set(got.tolist()))
            found.append(
                {"reason": "window_slot", "outside_window": bad[:8], "missing": missing[:8], "window": [p - sw + 1, p]}
            )
        tail = rows[i, t0 + sw :]
        if np.any(tail != -1):
            at = int(np.flatnonzero(tail != -1)[0]) + t0 + sw
            found.append({"reason": "padding", "slot": at, "engine": int(rows[i, at])})
        if found:
            problems[i] = found
    by_reason = dict(report["by_reason"])
    for r in _REASONS:
        by_reason[r] = sum(any(x["reason"] == r for x in f) for f in problems.values())
    details = {d["row"]: d for d in report["details"]}
    for i, found in problems.items():
        details.setdefault(i, {"row": i, "problems": []})["problems"].extend(found)
    out = Report(report)
    out["by_reason"] = by_reason
    out["details"] = [details[i] for i in sorted(details)]
    out["wrong"] = len(details)
    out["correct"] = n - len(details)
    return out
