"""Quest's query-aware page selection in plain NumPy, written from the sources.

- mit-han-lab/Quest @01c1623b: the page metadata is the element-wise min and
  max of a page's keys per KV head (``quest/utils/controller.py``; a page's
  first appended key sets both bounds, ``kernels/include/decode/decode_page.cuh``);
  a query scores a page ``sum_i max(q_i * max_i, q_i * min_i)``
  (``compute_max_possible`` in ``kernels/include/decode/decode_attn.cuh``;
  ``_ref_cpu_estimate`` in ``quest/tests/test_estimate.py``); a decode step reads
  every page when they fit the budget, else the last page and the top
  ``budget - 1`` of the others (``controller.py``, ``quest/utils/__init__.py``).
  The evaluation script (``evaluation/quest_attention.py``) takes the top
  ``min(max(3, token_budget // page), n)`` chunks, none forced.
- sgl-project/sglang @00544d86 (``mem_cache/sparsity/algorithms/quest_algorithm.py``,
  ``base_algorithm.py``): the group-mean query, scores summed over KV heads, the
  newest ``num_recent_pages`` (4) pages forced, ``max(fixed_topk_page_cnt -
  num_recent_pages, 1)`` of the pages before them.

Scores here are float64 sums of exact float64 products (the bounds and queries
are float32 values), so they equal the native float32 scores exactly on
integer-valued data and within float32 rounding otherwise. Pages are ranked by
score descending, then page id ascending (NaN last), as everywhere in kvselect.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._args import _I32_MAX, ReferenceSelectionError, _count, _index_array, _overlaps, _paged, _scales, _takes_out
from .keys import decode

_VARIANTS = ("kernel", "eval", "sglang")


def _variant(variant: str) -> str:
    if variant not in _VARIANTS:
        raise ReferenceSelectionError("variant", f"variant must be 'kernel', 'eval' or 'sglang', got {variant!r}")
    return variant


def _canon(values: np.ndarray, scale: Optional[np.ndarray]) -> np.ndarray:
    """Key values as the bounds hold them: float32 ``k * scale`` (a float32
    dequantisation), ``+ 0`` (no ``-0.0``)."""
    v = values.astype(np.float32)
    if scale is not None:
        v = v * scale.astype(np.float32)
    return v + np.float32(0.0)


def _page_bounds(v: np.ndarray, page_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """One sequence's ``[n, h, d]`` float32 keys -> bounds ``[ceil(n / P), h, d]``,
    NaN ignored (``fmin`` / ``fmax``, as CUDA's ``max`` and ``__hmax``)."""
    n = len(v)
    n_pages = -(-n // page_size)
    lo = np.empty((n_pages,) + v.shape[1:], np.float32)
    hi = np.empty_like(lo)
    for p in range(n_pages):
        page = v[p * page_size : (p + 1) * page_size]
        with np.errstate(invalid="ignore"):
            lo[p] = np.fmin.reduce(page, axis=0)
            hi[p] = np.fmax.reduce(page, axis=0)
    return lo, hi


def quest_bounds(
    keys: Any,
    page_size: int = 16,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    cu_seqlens: Any = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """Every page's element-wise key bounds (``kvselect.quest_bounds``)."""
    p = _count("page_size", page_size)
    if p == 0:
        raise ReferenceSelectionError("page_size", "page_size must be at least 1")
    k = decode(keys, key_format, "key_format", name="keys")
    if k.ndim != 3:
        raise ReferenceSelectionError("keys", f"keys must be 3-D [n_tokens, n_kv_heads, d], got {k.ndim}-D")
    n = len(k)
    scale = None
    if key_scale is not None:
        scale = _scales("key_scale", key_scale)
        if len(scale) != n:
            raise ReferenceSelectionError("key_scale", f"key_scale has {len(scale)} entries for {n} tokens")
        scale = scale[:, None, None]
    v = _canon(k, scale)
    cu = (
        np.array([0, n])
        if cu_seqlens is None
        else _index_array("cu_seqlens", cu_seqlens, 1, "selection", positions=True)
    )
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != n or np.any(np.diff(cu) < 0):
        raise ReferenceSelectionError("cu_seqlens", f"cu_seqlens must rise from 0 to {n}")
    parts = [_page_bounds(v[a:b], p) for a, b in zip(cu[:-1], cu[1:])]
    lo = np.concatenate([x[0] for x in parts]) if parts else np.zeros((0,) + k.shape[1:], np.float32)
    hi = np.concatenate([x[1] for x in parts]) if parts else np.zeros((0,) + k.shape[1:], np.float32)
    return lo, hi


def quest_bounds_paged(
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    n_kv_heads: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """The bounds of a paged cache's sequences (``kvselect.quest_bounds_paged``):
    each sequence's keys gathered through its block-table row, then
    :func:`quest_bounds` of them, sequence after sequence."""
    h = _count("n_kv_heads", n_kv_heads)
    lens = _index_array("seq_lens", seq_lens, 1, "selection", positions=True)
    cache, table = _paged(kv_cache, block_table, len(lens), h, page_layout)
    for s, n in enumerate(lens):
        if n > _I32_MAX:
            raise ReferenceSelectionError(
                "seq_lens", f"seq_lens[{s}] = {n}: a sequence holds at most {_I32_MAX} tokens (an int32 position)"
            )
    if page_layout == "fp8_scaled":
        nb, bs = cache.shape[0], cache.shape[1]
        raw = np.ascontiguousarray(cache).reshape(nb, -1).view(np.uint8)
        row = raw.shape[1] // bs - 4
        keys_all = decode(raw[:, : bs * row].reshape(nb, bs, row).copy(), "float8_e4m3fn")
        scales_all = raw[:, bs * row :].copy().view("<f4").reshape(nb, bs)
    elif page_layout == "dense":
        nb, bs, row = cache.shape
        keys_all = decode(cache, key_format, "key_format", name="kv_cache")
        scales_all = None
    else:
        raise ReferenceSelectionError(
            "page_layout", f"page_layout must be 'dense' or 'fp8_scaled', got {page_layout!r}"
        )
    if h == 0 or row % h:
        raise ReferenceSelectionError("n_kv_heads", f"n_kv_heads = {h} does not divide the cache's rows of {row}")
    keys, scales, cu = [], [], [0]
    for s, n in enumerate(lens):
        tok = np.arange(int(n))
        pages = table[s, tok // bs]
        keys.append(keys_all[pages, tok % bs])
        if scales_all is not None:
            scales.append(scales_all[pages, tok % bs])
        cu.append(cu[-1] + int(n))
    flat = np.concatenate(keys) if keys else np.zeros((0, row))
    sc = np.concatenate(scales) if scales else None
    return quest_bounds(flat.reshape(len(flat), h, row // h).astype(np.float32), bs, key_scale=sc, cu_seqlens=cu)


def _bounds_pair(kmin: Any, kmax: Any) -> Tuple[np.ndarray, np.ndarray]:
    """The bounds a query is scored against, as float32: floats only (as natively,
    another dtype is a TypeError naming the array)."""
    out = []
    for name, b in (("kmin", kmin), ("kmax", kmax)):
        a = np.asarray(b)
        if a.dtype.kind != "f":
            raise TypeError(f"{name} must hold floats, got dtype {a.dtype}")
        out.append(a.astype(np.float32))
    return out[0], out[1]


def quest_update(
    kmin: np.ndarray,
    kmax: np.ndarray,
    key: Any,
    pos: int,
    page_size: int = 16,
    *,
    key_scale: Optional[float] = None,
    key_format: Optional[str] = None,
) -> None:
    """A decode step's update, in place (``kvselect.quest_update``): the page's
    first token sets its bounds, a later one folds in."""
    # Checked in the native binding's order: the settings and the key, then each
    # buffer whole (written in place: never converted; sharing no memory with the
    # key or the buffer before it), then the shapes, then the page; a refused call
    # leaves the bounds byte-identical.
    p = _count("page_size", page_size)
    t = _count("pos", pos)
    k = decode(key, key_format, "key_format", name="key")
    for name, b, others in (("kmin", kmin, (key,)), ("kmax", kmax, (key, kmin))):
        if not isinstance(b, np.ndarray) or b.dtype != np.float32:
            raise TypeError(f"{name} must be a float32 numpy array, got {getattr(b, 'dtype', type(b).__name__)}")
        f = b.flags
        if b.ndim != 3 or not (f.c_contiguous and f.writeable and f.aligned and b.dtype.isnative):
            raise ReferenceSelectionError(
                name, f"{name} must be a 3-D C-contiguous, writeable, aligned, native-order buffer, got {b.shape}"
            )
        if _overlaps(b, others):
            raise ReferenceSelectionError(name, f"{name} overlaps another argument's memory")
    if kmax.shape != kmin.shape:
        raise ReferenceSelectionError("kmax", f"kmax has shape {list(kmax.shape)} but kmin {list(kmin.shape)}")
    if k.shape != kmin.shape[1:]:
        raise ReferenceSelectionError("key", f"key must be {kmin.shape[1:]}, got {k.shape}")
    if p == 0:
        raise ReferenceSelectionError("page_size", "page_size must be at least 1")
    page, slot = divmod(t, p)
    if page >= len(kmin):
        raise ReferenceSelectionError("pos", f"pos = {t} is in page {page}, but the bounds hold {len(kmin)} pages")
    v = _canon(k, None if key_scale is None else np.array(key_scale, dtype=np.float32))
    if slot == 0:
        kmin[page], kmax[page] = v, v
    else:
        kmin[page] = np.fmin(kmin[page], v)
        kmax[page] = np.fmax(kmax[page], v)


def _round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 ``x`` rounded to the nearest ``fmt`` value (ties to even)."""
    if fmt == "float16":
        return x.astype(np.float16).astype(np.float32)
    if fmt == "bfloat16":
        b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), x, r)
    return x


def _format_of(q: Any, query_format: Optional[str]) -> str:
    name = np.asarray(q).dtype.name
    if query_format is not None:
        return query_format
    return name if name in ("float16", "bfloat16", "float8_e4m3fn") else "float32"


def group_mean(q: Any, n_kv_heads: int, query_format: Optional[str] = None) -> np.ndarray:
    """SGLang's query: each KV head's group of query heads summed in float32 in
    head order, divided by the group size, rounded to the query's dtype."""
    qd = decode(q, query_format, "query_format", name="q").astype(np.float32)
    hq, d = qd.shape
    g = hq // n_kv_heads
    grouped = qd.reshape(n_kv_heads, g, d)
    acc = np.zeros((n_kv_heads, d), np.float32)
    for r in range(g):
        acc = acc + grouped[:, r]
    return _round_to(acc / np.float32(g), _format_of(q, query_format))


def _bound_dots(q: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``sum_i max(q_i * max_i, q_i * min_i)`` in float64 (exact products):
    ``q`` ``[..., d]`` against bounds ``[n_pages, d]`` -> ``[..., n_pages]``."""
    q = q.astype(np.float64)[..., None, :]
    with np.errstate(invalid="ignore"):
        return np.maximum(q * hi.astype(np.float64), q * lo.astype(np.float64)).sum(axis=-1)


@_takes_out(np.float32)
def quest_scores(
    q: Any,
    kmin: Any,
    kmax: Any,
    *,
    variant: str = "kernel",
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """Every page's score (``kvselect.quest_scores``), in float64: ``[n_q_heads,
    n_pages]``, or ``[n_pages]`` for SGLang's."""
    v = _variant(variant)
    lo, hi = _bounds_pair(kmin, kmax)
    if lo.shape != hi.shape or lo.ndim != 3:
        raise ReferenceSelectionError("kmax", "kmin and kmax must be one [n_pages, n_kv_heads, d] shape")
    n_pages, h, d = lo.shape
    qd = decode(q, query_format, "query_format", name="q")
    if qd.ndim != 2 or qd.shape[1] != d or qd.shape[0] % h or not qd.shape[0]:
        raise ReferenceSelectionError("q", f"q must be [n_q_heads (a multiple of {h}), d={d}], got {qd.shape}")
    if v == "sglang":
        m = group_mean(q, h, query_format)
        return sum((_bound_dots(m[kv], lo[:, kv], hi[:, kv]) for kv in range(h)), np.zeros(n_pages))
    g = qd.shape[0] // h
    return np.stack([_bound_dots(qd[j].astype(np.float32), lo[:, j // g], hi[:, j // g]) for j in range(len(qd))])


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` best page ids: score descending, then id ascending, NaN last."""
    s = np.asarray(scores, np.float64)
    key = np.where(np.isnan(s), np.inf, -s)
    order = np.lexsort((np.arange(len(s)), key))
    return order[: max(k, 0)]


def width(variant: str, budget: int, num_recent_pages: int = 4) -> int:
    """The row width of a variant's page sets at ``budget`` pages."""
    if variant == "kernel":
        return budget
    if variant == "eval":
        return max(budget, 3)
    return max(budget - num_recent_pages, 1) + num_recent_pages


def select_pages(
    scores: np.ndarray, n_tokens: int, page_size: int, budget: int, variant: str, num_recent_pages: int = 4
) -> np.ndarray:
    """One query's page set from its pages' ``scores``, ascending."""
    n = -(-n_tokens // page_size)
    if variant == "kernel":
        if n <= budget:
            return np.arange(n)
        chosen = np.r_[_top(scores[: n - 1], budget - 1), n - 1]
    elif variant == "eval":
        token_budget = min(n_tokens, budget * page_size)
        chosen = _top(scores[:n], min(max(3, token_budget // page_size), n))
    else:
        r = num_recent_pages
        start = max(n - r, 0)
        top = _top(scores[:start], min(max(budget - r, 1), start)) if start else np.zeros(0, np.int64)
        chosen = np.r_[top, np.arange(start, n)]
    return np.sort(chosen)


@_takes_out(np.int32)
def quest_select(
    q: Any,
    kmin: Any,
    kmax: Any,
    seq_lens: Any,
    page_budget: int,
    page_size: int = 16,
    *,
    variant: str = "kernel",
    num_recent_pages: int = 4,
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """Each decoding query's pages (``kvselect.quest_select``)."""
    v = _variant(variant)
    b = _count("page_budget", page_budget)
    if b == 0:
        raise ReferenceSelectionError("page_budget", "page_budget must be at least 1 page")
    p, r = _count("page_size", page_size), _count("num_recent_pages", num_recent_pages)
    single = isinstance(seq_lens, (int, np.integer))
    lens = np.array([seq_lens]) if single else _index_array("seq_lens", seq_lens, 1, "selection", positions=True)
    if np.any(lens == 0):
        raise ReferenceSelectionError("seq_lens", "a decoding query has at least its own token")
    qa = np.asarray(q)
    qs = qa[None] if single else qa
    lo, hi = _bounds_pair(kmin, kmax)
    pages = -(-lens // p)
    if len(lo) != int(pages.sum()):
        raise ReferenceSelectionError("kmin", f"the bounds hold {len(lo)} pages, the sequences {int(pages.sum())}")
    rows = 1 if v == "sglang" else qs.shape[1]
    w = width(v, b, r)
    out = np.full((len(lens), rows, w), -1, np.int32)
    at = 0
    for s, (n, np_) in enumerate(zip(lens, pages)):
        sc = np.atleast_2d(
            quest_scores(qs[s], lo[at : at + np_], hi[at : at + np_], variant=v, query_format=query_format)
        )
        for j in range(rows):
            chosen = select_pages(sc[j], int(n), p, b, v, r)
            out[s, j, : len(chosen)] = chosen
        at += np_
    return out[0] if single else out
