"""The DSA lightning indexer of a workload: derived from the attention heads
(a projection of the queries' group mean) when a dump has none."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from kvselect.workloads.model import WorkloadError, as_count
from kvselect.workloads.quantize import quantize_rows


def projection(d: int, d_index: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6B76_7365]))
    p = rng.standard_normal((d, d_index)) / math.sqrt(d_index)
    return p.astype(np.float32)


def group_mean(q: np.ndarray, n_kv_heads: int) -> np.ndarray:
    """The mean of each GQA group's query heads, ``[n_kv_heads, ...]``
    float32: the heads summed in order (``q[0] + q[1] + ...``), then divided
    by the group size, elementwise, so a row's mean is the same bits whether
    it is computed alone or with every other row."""
    n_heads = q.shape[0]
    g = n_heads // n_kv_heads
    grouped = np.asarray(q, dtype=np.float32).reshape(n_kv_heads, g, *q.shape[1:])
    out = grouped[:, 0].copy()
    for j in range(1, g):
        out += grouped[:, j]
    out /= np.float32(g)
    return out


#: Rows projected at a time by :func:`project` (bounds its float64 scratch).
_PROJECT_ROWS = 4096


def project(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``x @ p`` for ``x [..., d]`` and ``p [d, e]``, float32, the same bits
    on every machine and for every batch of rows.

    Each output is the float64 sum over ``j = 0, 1, ..., d - 1`` in that
    order of the exact products ``x[..., j] * p[j]`` (a float32 product is
    exact in float64), rounded once to float32. A BLAS ``@`` may order (and
    fuse) those sums differently by CPU, thread count or the number of rows
    in the call, which would make a row's derived index depend on where and
    with what it was computed.
    """
    x = np.asarray(x, dtype=np.float32)
    d, e = p.shape
    flat = x.reshape(-1, d)
    p64 = p.astype(np.float64)
    out = np.empty((len(flat), e), dtype=np.float32)
    for r0 in range(0, len(flat), _PROJECT_ROWS):
        rows = flat[r0 : r0 + _PROJECT_ROWS].astype(np.float64)
        acc = rows[:, 0:1] * p64[0]
        for j in range(1, d):
            acc += rows[:, j : j + 1] * p64[j]
        out[r0 : r0 + _PROJECT_ROWS] = acc
    return out.reshape(*x.shape[:-1], e)


def derive_head(
    q_group: np.ndarray, k: np.ndarray, d_index: Optional[int] = None, seed: int = 0
) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`derive_indexer` for one KV head: ``q_group`` ``[group, rows,
    d]`` (its query heads, at any subset of positions) and ``k`` ``[tokens,
    d]`` give ``index_q [rows, d_index]`` and ``index_k [tokens, d_index]``,
    bit for bit the rows :func:`derive_indexer` gives for them."""
    d = k.shape[-1]
    d_index = max(4, d // 4) if d_index is None else d_index
    p = projection(d, d_index, seed)
    return (quantize_rows(project(group_mean(q_group, 1)[0], p)), quantize_rows(project(k, p)))


def derive_indexer(
    q: np.ndarray,
    k: np.ndarray,
    n_kv_heads: int,
    d_index: Optional[int] = None,
    seed: int = 0,
) -> Tuple[np.ndarray, np.ndarray]:
    """The indexer used when a dump has no ``index_q``/``index_k``.

    Rule (fixed, so that results on a dump are reproducible everywhere):

    1. Average the query heads within each GQA group: ``q_bar[g] =
       mean(q[g * group : (g + 1) * group])`` with ``group = n_heads //
       n_kv_heads`` (one index head per KV head, as in DeepSeek-V3.2 and
       MiniMax-M3 where the indexer is shared by a KV head's queries).
    2. Project ``q_bar`` and ``k`` with the same random matrix ``P`` of shape
       ``[d, d_index]``, entries i.i.d. ``N(0, 1/d_index)``, drawn by
       ``numpy.random.default_rng(SeedSequence([seed, 0x6b767365]))``
       (``standard_normal((d, d_index)) / sqrt(d_index)``); ``d_index``
       defaults to ``max(4, d // 4)``. By Johnson–Lindenstrauss,
       ``(q P)·(k P)`` is an unbiased estimate of ``q·k`` whose error shrinks
       as ``d_index`` grows.
       Every product is summed in float64 in a fixed order and rounded once
       (:func:`project`), so the indexer is the same bits on every machine
       and whichever rows are computed together.
    3. Quantise every row of ``q_bar P`` and ``k P`` to 8 bits with
       :func:`quantize_rows` (per-row symmetric: ``s = max|row| / 127``,
       ``round(row / s) * s``).

    So the derived indexer is what a lightning indexer is: fewer heads, lower
    dimension, coarser numbers than the attention it predicts — an
    approximation whose top-k agrees with the true top-k partially. It is not
    a trained indexer; when you have one, dump ``index_q``/``index_k``.

    Parameters
    ----------
    q : array_like
        ``[n_heads, tokens, d]`` (any float dtype; computed in float32).
    k : array_like
        ``[n_kv_heads, tokens, d]`` (any float dtype; computed in float32).
    n_kv_heads : int
        KV heads; ``n_heads`` must be a multiple of it.
    d_index : int, optional
        Index dimension (default ``max(4, d // 4)``).
    seed : int
        The projection's seed (0 by default and in :func:`load_npz`).

    Returns
    -------
    index_q, index_k : numpy.ndarray
        Both float32 C-contiguous ``[n_kv_heads, tokens, d_index]``.

    Raises
    ------
    WorkloadError
        ``q`` or ``k`` not 3-D, ``k`` without ``n_kv_heads`` heads, ``n_heads``
        not a multiple of ``n_kv_heads``, ``k``'s tokens or ``d`` not ``q``'s,
        or ``n_kv_heads`` / ``d_index`` not a positive int.
    """
    q = np.asarray(q, dtype=np.float32)
    k = np.asarray(k, dtype=np.float32)
    n_kv_heads = as_count("n_kv_heads", n_kv_heads, minimum=1)
    if q.ndim != 3 or k.ndim != 3:
        raise WorkloadError(
            f"derive_indexer: expected q [n_heads, tokens, d] and k [n_kv_heads, tokens, d], "
            f"got q {q.shape} and k {k.shape}"
        )
    if k.shape[0] != n_kv_heads:
        raise WorkloadError(f"k: expected {n_kv_heads} KV heads (n_kv_heads), got shape {k.shape}")
    if q.shape[0] % n_kv_heads:
        raise WorkloadError(f"q: n_heads = {q.shape[0]} is not a multiple of n_kv_heads = {n_kv_heads}")
    if q.shape[1:] != k.shape[1:]:
        raise WorkloadError(
            f"k: expected [n_kv_heads, tokens, d] = [{n_kv_heads}, {q.shape[1]}, {q.shape[2]}] "
            f"to match q, got {k.shape}"
        )
    d = q.shape[2]
    d_index = max(4, d // 4) if d_index is None else as_count("d_index", d_index, minimum=1)
    p = projection(d, d_index, seed)
    index_q = quantize_rows(project(group_mean(q, n_kv_heads), p))
    index_k = quantize_rows(project(k, p))
    return index_q, index_k
