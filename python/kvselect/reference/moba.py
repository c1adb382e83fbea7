"""MoBA's block selection in plain NumPy, written from the source.

MoonshotAI/MoBA @61e456bc, ``moba/moba_efficient.py`` ``moba_attn_varlen`` (the
rule) and ``moba/moba_naive.py`` ``moba_attn_varlen_naive`` (the variant): keys cut
into blocks of ``block_size`` (``moba_chunk_size``) from each sequence's start; a
query at position ``p`` has current block ``c = p // block_size``; each completed past
block ``b < c`` is gated ``q . mean(K of b)`` per query head (``moba/wrapper.py``
repeats the KV heads to the query heads); the query reads its current block (forced,
causal) and the ``topk - 1`` past blocks of greatest gate, all when fewer. At ``topk =
1`` the efficient code attends fully causally (every block ``0..c``), the naive code
its own block alone. Queries fewer than keys sit at the last positions.

Gates here are float64: the mean is the float64 sum of the decoded float32 keys over
``block_size``, the gate a float64 dot product, so they err from the real gate by a
few float64 roundings only. Blocks are ranked by gate descending, then block id
ascending (NaN last), as everywhere in kvselect. :func:`gate_magnitudes` gives
``sum_i |q_i| * mean_t |k_ti|``, the magnitude the native float32 gate's error bound
scales with (docs/moba.md): two blocks whose gates differ by less than their bounds
are a tie the float32 core may break either way.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ._args import _I32_MAX, ReferenceSelectionError, _count, _int_list, _paged, _scales, _table_row, _takes_out
from .keys import decode

_VARIANTS = ("efficient", "naive")
U32 = 2.0**-24


def _variant(variant: str) -> str:
    if variant not in _VARIANTS:
        raise ReferenceSelectionError("variant", f"variant must be 'efficient' or 'naive', got {variant!r}")
    return variant


def _keys(k: Any, key_scale: Any, key_format: Optional[str]) -> np.ndarray:
    """The keys' values as float64: each the float32 ``k * scale`` of a scaled key."""
    v = decode(k, key_format, "key_format", name="k")
    if v.ndim != 3:
        raise ReferenceSelectionError("k", f"k must be 3-D [n_keys, n_kv_heads, d], got {v.ndim}-D")
    if key_scale is not None:
        s = _scales("key_scale", key_scale)
        if s.shape != (len(v),):
            raise ReferenceSelectionError("key_scale", f"key_scale must be [n_keys={len(v)}], got {s.shape}")
        v = (v.astype(np.float32) * s[:, None, None]).astype(np.float64)
    return v


def _queries(q: Any, query_format: Optional[str], d: int, h: int) -> np.ndarray:
    v = decode(q, query_format, "query_format", name="q")
    if v.ndim != 3 or v.shape[2] != d or v.shape[1] % h or v.shape[1] == 0:
        raise ReferenceSelectionError("q", f"q must be [n_queries, a multiple of {h} heads, d={d}], got {v.shape}")
    return v


def width(variant: str, topk: int, max_blocks: int) -> int:
    """Slots a row needs: ``topk``, or ``max_blocks`` for the efficient code at ``topk = 1``."""
    return max_blocks if (variant == "efficient" and topk == 1) else topk


def past_blocks_read(variant: str, topk: int, c: int) -> int:
    """Past blocks a query of current block ``c`` reads beside its own."""
    return c if (variant == "efficient" and topk == 1) else min(topk - 1, c)


def _seq_gates(q: np.ndarray, k: np.ndarray, block_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """One sequence's float64 gates and magnitudes ``[n_q, n_q_heads, n_blocks]``, NaN
    at every block not gated (the current and future ones)."""
    n_k, h, d = k.shape
    n_q, hq, _ = q.shape
    nb = -(-n_k // block_size)
    gates = np.full((n_q, hq, nb), np.nan)
    mags = np.full((n_q, hq, nb), np.nan)
    n_means = (n_k - 1) // block_size if n_k else 0
    if n_q == 0 or n_means == 0:
        return gates, mags
    blocks = k[: n_means * block_size].reshape(n_means, block_size, h, d)
    means = blocks.sum(axis=1) / block_size  # [n_means, h, d]
    abs_means = np.abs(blocks).sum(axis=1) / block_size
    group = hq // h
    kv = np.arange(hq) // group
    g_all = np.einsum("qhd,bhd->qhb", q, means[:, kv])
    m_all = np.einsum("qhd,bhd->qhb", np.abs(q), abs_means[:, kv])
    for i in range(n_q):
        c = (n_k - n_q + i) // block_size
        gates[i, :, :c] = g_all[i, :, :c]
        mags[i, :, :c] = m_all[i, :, :c]
    return gates, mags


def _order(gates: np.ndarray) -> np.ndarray:
    """Block ids by gate descending, then id ascending, NaN last."""
    key = np.where(np.isnan(gates), -np.inf, gates)
    ids = np.arange(len(gates))
    nan_last = np.isnan(gates)
    return np.lexsort((ids, -key, nan_last))


def _row(gates: np.ndarray, c: int, n_past: int, w: int) -> np.ndarray:
    row = np.full(w, -1, np.int32)
    if n_past >= c:
        chosen = list(range(c + 1))
    else:
        chosen = sorted(_order(gates[:c])[:n_past].tolist()) + [c]
    row[: len(chosen)] = chosen
    return row


@_takes_out(np.float32)
def moba_gates(
    q: Any,
    k: Any,
    block_size: int,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """The float64 gate of every past block of each query of one sequence
    ``[n_queries, n_q_heads, ceil(n_keys / block_size)]``, NaN where not gated."""
    bs = _count("block_size", block_size)
    if bs < 1:
        raise ReferenceSelectionError("block_size", "block_size must be at least 1")
    kv = _keys(k, key_scale, key_format)
    qv = _queries(q, query_format, kv.shape[2], kv.shape[1])
    if len(qv) > len(kv):
        raise ReferenceSelectionError("q", f"{len(qv)} queries over {len(kv)} keys")
    return _seq_gates(qv, kv, bs)[0]


def gate_magnitudes(
    q: Any, k: Any, block_size: int, *, key_scale: Any = None, key_format: Optional[str] = None
) -> np.ndarray:
    """``sum_i |q_i| * mean_t |k_ti|`` per query, head and past block (NaN elsewhere):
    the native gate errs by at most ``gamma(d + block_size + 4)`` times it (docs/moba.md)."""
    kv = _keys(k, key_scale, key_format)
    qv = _queries(q, None, kv.shape[2], kv.shape[1])
    return _seq_gates(qv, kv, int(block_size))[1]


def gate_error_bound(d: int, block_size: int) -> float:
    """The relative factor of the native gate's error bound, ``gamma(d + block_size + 4)``."""
    n = d + block_size + 4
    return n * U32 / (1 - n * U32)


def _bounds(cu: Any, n: int, argument: str) -> List[int]:
    c = _int_list(argument, cu)
    if not c or c[0] != 0 or c[-1] != n or any(b < a for a, b in zip(c, c[1:])):
        raise ReferenceSelectionError(argument, f"{argument} must rise from 0 to {n}, got {c}")
    return c


@_takes_out(np.int32)
def moba_select(
    q: Any,
    k: Any,
    topk: int,
    block_size: int,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    cu_seqlens: Any = None,
    cu_seqlens_q: Any = None,
    variant: str = "efficient",
    out: Any = None,
) -> np.ndarray:
    """MoBA's blocks per query and head ``[n_queries, n_q_heads, width]``, each row
    ascending then -1 (``kvselect.moba_select``)."""
    topk, bs = _count("topk", topk), _count("block_size", block_size)
    variant = _variant(variant)
    if topk < 1:
        raise ReferenceSelectionError("topk", "topk must be at least 1 block")
    if bs < 1:
        raise ReferenceSelectionError("block_size", "block_size must be at least 1")
    kv = _keys(k, key_scale, key_format)
    qv = _queries(q, query_format, kv.shape[2], kv.shape[1])
    cu = _bounds(cu_seqlens, len(kv), "cu_seqlens") if cu_seqlens is not None else [0, len(kv)]
    if cu_seqlens_q is not None:
        cq = _bounds(cu_seqlens_q, len(qv), "cu_seqlens_q")
    else:
        cq = cu if cu_seqlens is not None else [0, len(qv)]
    if len(cq) != len(cu) or any(cq[s + 1] - cq[s] > cu[s + 1] - cu[s] for s in range(len(cu) - 1)):
        raise ReferenceSelectionError("cu_seqlens_q", "each sequence's queries are the last of its keys")
    max_blocks = max((-(-(b - a) // bs) for a, b in zip(cu, cu[1:])), default=0)
    w = width(variant, topk, max_blocks)
    out = np.full((len(qv), qv.shape[1], w), -1, np.int32)
    for s in range(len(cu) - 1):
        ks, qs = kv[cu[s] : cu[s + 1]], qv[cq[s] : cq[s + 1]]
        gates = _seq_gates(qs, ks, bs)[0]
        for i in range(len(qs)):
            c = (len(ks) - len(qs) + i) // bs
            n_past = past_blocks_read(variant, topk, c)
            for h in range(qs.shape[1]):
                out[cq[s] + i, h] = _row(gates[i, h], c, n_past, w)
    return out


def _check_paged_rows(lens: List[int], table: np.ndarray, page: int, n_pages: int) -> None:
    """The lengths and block-table rows refused as ``moba_select_paged`` refuses them
    (the core's ``check_decode_lens`` and ``BlockTable::check``): a length of 0 or past
    an int32 position (``seq_lens``), a row shorter than its sequence's pages, an entry it reads that is
    negative or past the cache (``block_table``; NumPy would read a negative one from the
    end)."""
    for s, n in enumerate(lens):
        if n == 0 or n > _I32_MAX:
            raise ReferenceSelectionError(
                "seq_lens", f"seq_lens[{s}] = {n}: a decoding query's sequence holds 1 ..= {_I32_MAX} tokens"
            )
    for s, n in enumerate(lens):
        _table_row(table, s, -(-n // page), n_pages, f"seq_lens[{s}] = {n} tokens in pages of {page}")


@_takes_out(np.int32)
def moba_select_paged(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Sequence[int],
    n_kv_heads: int,
    topk: int,
    block_size: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    variant: str = "efficient",
    out: Any = None,
) -> np.ndarray:
    """``moba_select`` at decode over a paged cache: each sequence's keys gathered
    through its block-table row, its one query at its last position."""
    h = _count("n_kv_heads", n_kv_heads)
    lens = _int_list("seq_lens", seq_lens)
    cache, table = _paged(kv_cache, block_table, len(lens), h, page_layout)
    page = cache.shape[1]
    _check_paged_rows(lens, table, page, cache.shape[0])
    qv = np.asarray(q)
    outs = []
    for s, n in enumerate(lens):
        if page_layout == "fp8_scaled":
            # vLLM's fp8 page: the page's page x row key bytes, then its float32 scales.
            pages = [np.ascontiguousarray(cache[table[s, t // page]]).view(np.uint8).reshape(-1) for t in range(n)]
            row = cache.shape[2] - 4
            keys = np.stack([pg[(t % page) * row : (t % page + 1) * row] for t, pg in enumerate(pages)])
            sc = np.array([pg[page * row :].view("<f4")[t % page] for t, pg in enumerate(pages)], np.float32)
            kd = decode(keys, "float8_e4m3fn").reshape(n, h, -1)
            ks = (kd.astype(np.float32) * sc[:, None, None].astype(np.float32)).astype(np.float32)
        else:
            rows = [cache[table[s, t // page], t % page] for t in range(n)]
            ks = decode(np.stack(rows), key_format, "key_format", name="kv_cache").reshape(n, h, -1)
        outs.append(moba_select(qv[s : s + 1], ks, topk, block_size, query_format=query_format, variant=variant))
    max_blocks = max((-(-n // int(block_size)) for n in lens), default=0)
    w = width(_variant(variant), int(topk), max_blocks)
    out = np.full((len(lens), qv.shape[1], w), -1, np.int32)
    for s, o in enumerate(outs):
        out[s, :, : o.shape[2]] = o[0]
    return out
