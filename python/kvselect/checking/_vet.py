"""The exact check's arguments judged before any work: shapes against the
rows and the keys, integer index arrays, finite operands (the exact score of
a non-finite one is undefined), ``topk`` and ``filler``; each refusal names
the argument as the native functions do."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from kvselect.checking._common import FILLERS, _codes, _refused, decode32


def _non_finite(name: str, a: np.ndarray) -> None:
    """Refuses a non-finite entry of operand ``name`` (float32 values),
    naming its index, as a dump's check does."""
    if not np.isfinite(a).all():
        bad = ~np.isfinite(a)
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise _refused(
            name,
            f"{name}[{', '.join(map(str, at))}] is {a[at]}: the exact scores of a "
            f"non-finite {name} are undefined, so the rows cannot be checked",
        )


def _finite_codes(k: np.ndarray, fmt: Optional[str]) -> bool:
    """Whether ``k`` holds bfloat16 / float16 / float8_e4m3fn codes (raw
    bits with ``fmt``, or typed values) in native byte order
    (:func:`_codes`), every one finite, read on the bits; False for any
    other array (then decoded and tested)."""
    codes = _codes(k, fmt)
    if codes is None:
        return False
    bits, sign_less, non_finite = codes
    return int((bits & sign_less).max(initial=0)) < non_finite


def _integers(name: str, a: Any) -> None:
    """An index argument holds integers (a float one is a TypeError, never truncated)."""
    if isinstance(a, bool) or not isinstance(a, (int, np.integer)) and np.asarray(a).dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {np.asarray(a).dtype}")


def _vet_api(
    rows: Any,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    topk: Any,
    key_scale: Any,
    key_format: Optional[str],
    query_format: Optional[str],
    cu_seqlens: Any,
    seq_ids: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    page_layout: str,
    filler: str,
) -> None:
    """:func:`check_indexer_topk`'s arguments judged before any work, each
    refusal naming the argument as the native functions do: shapes against
    ``rows`` and the keys, integer index arrays, finite operands (the exact
    score of a non-finite one is undefined), ``topk`` and ``filler``."""
    if filler not in FILLERS:
        raise _refused("filler", f"filler must be one of {', '.join(map(repr, FILLERS))}, got {filler!r}")
    if topk is not None:
        if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
            raise TypeError(f"topk must be an integer, got {type(topk).__name__}")
        if topk < 1:
            raise _refused("topk", f"topk must be at least 1, got {topk}")
    if kv_cache is None:
        for name, v in (("block_table", block_table), ("seq_lens", seq_lens)):
            if v is not None:
                raise _refused(
                    name, f"{name} without kv_cache: a paged cache is kv_cache with block_table, seq_lens and seq_ids"
                )
        if page_layout != "dense":
            raise _refused("page_layout", f"page_layout={page_layout!r} without kv_cache")
        if seq_ids is not None and cu_seqlens is None:
            raise _refused("seq_ids", "seq_ids without cu_seqlens: a packed batch is cu_seqlens with seq_ids")
    _integers("query_pos", query_pos)
    for name, v in (("seq_ids", seq_ids), ("cu_seqlens", cu_seqlens)):
        if v is not None:
            _integers(name, v)
    n = len(np.asarray(rows)) if np.ndim(rows) else 0
    q = np.asarray(index_q)
    if q.ndim == 3:
        h = q.shape[1]
        if weights is not None and np.shape(weights) != (n, h):
            raise _refused("weights", f"weights must be [n_queries={n}, H={h}], got {list(np.shape(weights))}")
        _non_finite("index_q", decode32(q, query_format) if q.dtype.kind in "fV" or query_format else q)
    if weights is not None:
        _non_finite("weights", np.asarray(weights, dtype=np.float32))
    if index_k is not None:
        k = np.asarray(index_k)
        if key_scale is not None and np.ndim(key_scale) != 0 and np.shape(key_scale) != (len(k),):
            raise _refused(
                "key_scale", f"key_scale must be [n_keys={len(k)}] or one number, got {list(np.shape(key_scale))}"
            )
        step = max(1, (16 << 20) // max(1, k[:1].size * 4))
        # Finite codes read on their bits, no decode; any other case (or a
        # non-finite code, to report it) decoded a chunk at a time.
        for t0 in range(0, 0 if _finite_codes(k, key_format) else len(k), step):
            part = decode32(k[t0 : t0 + step], key_format)
            if not np.isfinite(part).all():
                t, i = (int(x) for x in np.argwhere(~np.isfinite(part))[0][:2])
                raise _refused(
                    "index_k",
                    f"index_k[{t0 + t}, {i}] is {part[t, i]}: the exact scores of a "
                    f"non-finite index_k are undefined, so the rows cannot be checked",
                )
    if key_scale is not None:
        _non_finite("key_scale", np.atleast_1d(np.asarray(key_scale, dtype=np.float32)))
