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
    n_heads = q.shape[0]
    g = n_heads // n_kv_heads
    out: np.ndarray = q.reshape(n_kv_heads, g, *q.shape[1:]).mean(axis=1, dtype=np.float32)
    return out


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
        raise WorkloadError(
            f"k: expected {n_kv_heads} KV heads (n_kv_heads), got shape {k.shape}"
        )
    if q.shape[0] % n_kv_heads:
        raise WorkloadError(
            f"q: n_heads = {q.shape[0]} is not a multiple of n_kv_heads = {n_kv_heads}"
        )
    if q.shape[1:] != k.shape[1:]:
        raise WorkloadError(
            f"k: expected [n_kv_heads, tokens, d] = [{n_kv_heads}, {q.shape[1]}, {q.shape[2]}] "
            f"to match q, got {k.shape}"
        )
    d = q.shape[2]
    d_index = max(4, d // 4) if d_index is None else as_count("d_index", d_index, minimum=1)
    p = projection(d, d_index, seed)
    index_q = quantize_rows(group_mean(q, n_kv_heads) @ p)
    index_k = quantize_rows(k @ p)
    return index_q, index_k
