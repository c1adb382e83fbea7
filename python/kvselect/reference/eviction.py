"""KV-cache eviction baselines, plain NumPy: which prefix positions a KV head
keeps after the boundary (SnapKV, PyramidKV's layer budget, TOVA, H2O,
ObservedAttention).

The rules, from the sources (read at the commits named; nothing copied):

- NVIDIA/kvpress ``kvpress/presses/snapkv_press.py``,
  ``pyramidkv_press.py``, ``tova_press.py``, ``observed_attention_press.py``,
  ``scorer_press.py`` at 8bb29b9c3078452a86d692f29123fa6c793e2b05;
- FMInference/H2O ``h2o_hf/utils_real_drop/modify_llama.py``
  (``H2OKVCache_LayerWise``) at ac75c2a8a9e76832b2a4139b9363373b56336bfb.

Every function takes one KV head's prefix: its query heads' queries ``q``
``[P, group, d]`` (positions ``0..P-1``) and its keys ``k`` ``[P, d]``, and
returns the kept positions, ascending, ``min(budget, P)`` of them.

**Kept**: the ``budget`` positions first in one total order, score
descending, ties to the lower position (:func:`keep_top`). torch's ``topk``
leaves ties unspecified; this order decides them.

**Softmax** (:func:`softmax_row`): kvselect's float64 probabilities, the
arithmetic of ``kvselect.attention_probabilities`` (``src/metrics.rs``):
``s_j = (sum_c q_c k_jc) * scale``, the dot product one chain in dimension
order from 0 (products of float32 are exact in float64), ``m = max s_j``,
``e_j = exp(s_j - m)`` (the C library's ``exp``, which Rust's ``f64::exp``
calls too), ``l = sum e_j`` in key order, ``p_j = e_j / l``. The eval's
policies run the native core (``src/eviction/``, the same arithmetic); this
twin redoes it, so the two agree bit for bit and the differential tests
compare kept sets exactly.
What would break it: a pairwise sum (NumPy's ``sum``), a matmul's blocked dot
product, NumPy's vectorised ``exp``. kvpress rounds its softmax to float32
(and then to the model's dtype); the kvpress comparison states that bound.

**Sums and means** run in index order and divide once: a mean over the
window's queries, over the GQA group's heads, the pooling's five taps.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

from ._args import ReferenceSelectionError

__all__ = [
    "softmax_row",
    "keep_top",
    "snapkv_scores",
    "snapkv_keep",
    "pyramidkv_layer_budget",
    "tova_scores",
    "tova_keep",
    "observed_attention_scores",
    "observed_attention_keep",
    "h2o_keep",
]


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def softmax_row(q: np.ndarray, keys: np.ndarray, scale: float) -> np.ndarray:
    """One query's float64 softmax over ``keys`` ``[n, d]``, in their order
    (kvselect's arithmetic, module doc)."""
    q64 = _f32(q).astype(np.float64)
    k64 = _f32(keys).astype(np.float64)
    acc = np.zeros(len(k64))
    for c in range(q64.shape[0]):  # one chain per key, dimension order
        acc = acc + q64[c] * k64[:, c]
    s = acc * float(scale)
    if len(s) == 0:
        return s
    m = float(np.max(s))
    e = np.array([math.exp(float(x) - m) for x in s])
    total = 0.0
    for x in e:  # key order, not pairwise
        total += float(x)
    return e / total


def _floats(x, name: str) -> np.ndarray:
    """``x`` as float32, its dtype one of numbers (as natively: complex, bool or
    object is a TypeError naming it)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold floats, got dtype {a.dtype}")
    return a.astype(np.float32)


def _prefix(q, k, q_name: str = "q", q_ndim: int = 3):
    """The queries and keys of one KV head's prefix, checked as natively: ``q``
    ``[P, group, d]`` (TOVA's ``q_last``: ``[group, d]``), ``k`` ``[P, d]``
    (TOVA's ``P`` is the keys' own), each refusal naming its argument."""
    qa, ka = _floats(q, q_name), _floats(k, "k")
    if qa.ndim != q_ndim:
        form = "[P, group, d]" if q_ndim == 3 else "[group, d]"
        raise ReferenceSelectionError(q_name, f"{q_name} must be {q_ndim}-D {form}, got {qa.ndim}-D")
    p = qa.shape[0] if q_ndim == 3 else (ka.shape[0] if ka.ndim else 0)
    if ka.ndim != 2 or ka.shape != (p, qa.shape[-1]):
        raise ReferenceSelectionError("k", f"k must be [P={p}, d={qa.shape[-1]}], got {list(ka.shape)}")
    return qa, ka


def keep_top(scores: Union[Sequence[float], np.ndarray], budget: int) -> np.ndarray:
    """The first ``budget`` positions by score descending, ties to the lower
    position, ascending (all of them when ``budget`` is at least their count)."""
    if not isinstance(scores, (list, tuple)):  # an array, however it comes (a memoryview, ...)
        a = np.asarray(scores)
        if a.dtype.kind not in "fiu":
            raise TypeError(f"scores must hold floats, got dtype {a.dtype}")
        if a.ndim != 1:
            raise ReferenceSelectionError("scores", f"scores must be 1-D [n], got {a.ndim}-D")
        scores = a
    order = sorted(range(len(scores)), key=lambda j: (-float(scores[j]), j))
    return np.array(sorted(order[: max(0, int(budget))]), dtype=np.int64)


def _causal_rows(q: np.ndarray, k: np.ndarray, scale: float, first: int) -> np.ndarray:
    """``[P - first, group, P]``: query ``i >= first`` over keys ``0..i``, 0 after."""
    n, group, _ = q.shape
    out = np.zeros((n - first, group, len(k)))
    for t, i in enumerate(range(first, n)):
        for h in range(group):
            out[t, h, : i + 1] = softmax_row(q[i, h], k[: i + 1], scale)
    return out


def snapkv_scores(q: np.ndarray, k: np.ndarray, scale: float, *, window: int = 64, kernel: int = 5) -> np.ndarray:
    """SnapKV's score of every prefix position ``[P]`` (kvpress ``SnapKVPress.score``).

    The last ``window`` queries' attention over the keys before the window,
    averaged over those queries, average-pooled (``kernel`` taps, zero padding
    of ``kernel // 2``, divided by ``kernel``: ``avg_pool1d``'s
    ``count_include_pad``), averaged over the group; the window's positions
    get one padded score, the maximum plus 1.
    """
    q, k = _prefix(q, k)
    p_len = len(k)
    if not 0 < window < p_len:
        raise ValueError(f"window must be in 1..P-1 (P = {p_len}: kvpress asserts the prefix exceeds it), got {window}")
    group = q.shape[1]
    keys = p_len - window
    rows = _causal_rows(q, k, scale, p_len - window)[:, :, :keys]  # [window, group, keys]
    per_head = np.zeros((group, keys))
    for t in range(window):
        per_head = per_head + rows[t]
    per_head = per_head / window
    half = kernel // 2
    padded = np.concatenate([np.zeros((group, half)), per_head, np.zeros((group, half))], axis=1)
    pooled = np.zeros((group, keys))
    for tap in range(kernel):
        pooled = pooled + padded[:, tap : tap + keys]
    pooled = pooled / kernel
    score = np.zeros(keys)
    for h in range(group):
        score = score + pooled[h]
    score = score / group
    top = float(np.max(score)) + 1 if keys else 1.0
    return np.concatenate([score, np.full(window, top)])


def snapkv_keep(
    q: np.ndarray, k: np.ndarray, budget: int, scale: float, *, window: int = 64, kernel: int = 5
) -> np.ndarray:
    """SnapKV's kept positions: :func:`keep_top` of :func:`snapkv_scores`
    (the window first, by its padded score; fewer kept than the window keeps
    its lowest positions)."""
    return keep_top(snapkv_scores(q, k, scale, window=window, kernel=kernel), budget)


def pyramidkv_layer_budget(
    layer: int, n_layers: int, q_len: int, compression_ratio: float, *, window: int = 64, beta: int = 20
) -> int:
    """PyramidKV's tokens kept at ``layer`` (kvpress ``get_layer_budget``): a
    linear pyramid from ``max_num`` (layer 0) down to ``min_num``, their mean
    the uniform budget; ``round(q_len * (1 - ratio))`` when the pyramid does
    not fit. One layer has no pyramid (kvpress divides by ``n_layers - 1``):
    the uniform budget, i.e. SnapKV."""
    if beta < 1:
        raise ValueError(f"beta must be at least 1, got {beta}")
    uniform = round(q_len * (1 - compression_ratio))
    if n_layers == 1:
        return int(uniform)
    capacity = window + q_len * (1 - compression_ratio)
    min_num = (capacity - window) / beta
    max_num = (capacity - window) * 2 - min_num
    if max_num >= q_len - window:
        max_num = q_len - window
        min_num = (capacity - window) * 2 - max_num
    if not (q_len >= max_num >= min_num >= window):
        return int(uniform)
    steps = (max_num - min_num) / (n_layers - 1)
    return int(round(max_num - layer * steps))


def tova_scores(q_last: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """TOVA's score ``[P]`` (kvpress ``TOVAPress.score``): the last query's
    attention ``q_last`` ``[heads, d]`` (position ``P - 1``) over the keys
    before it, averaged over the heads given; the last position padded with
    the maximum plus 1."""
    q_last, k = _prefix(q_last, k, "q_last", 2)
    p_len = len(k)
    heads = q_last.shape[0]
    score = np.zeros(p_len - 1)
    for h in range(heads):
        score = score + softmax_row(q_last[h], k, scale)[: p_len - 1]
    score = score / heads
    top = float(np.max(score)) + 1 if p_len > 1 else 1.0
    return np.concatenate([score, [top]])


def tova_keep(q: np.ndarray, k: np.ndarray, budget: int, scale: float) -> np.ndarray:
    """TOVA's kept positions: :func:`keep_top` of :func:`tova_scores` of the
    prefix's last query (``q[-1]``, the KV head's group)."""
    return keep_top(tova_scores(q[-1], k, scale), budget)


def observed_attention_scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """ObservedAttention's score ``[P]`` (kvpress ``ObservedAttentionPress``):
    every prefix query's causal attention summed per key (query order),
    divided by the queries that see the key (``P - j``), averaged over the
    group."""
    q, k = _prefix(q, k)
    p_len, group, _ = q.shape
    rows = _causal_rows(q, k, scale, 0)
    per_head = np.zeros((group, p_len))
    for i in range(p_len):
        per_head = per_head + rows[i]
    per_head = per_head / np.arange(p_len, 0, -1, dtype=np.float64)
    score = np.zeros(p_len)
    for h in range(group):
        score = score + per_head[h]
    return score / group


def observed_attention_keep(q: np.ndarray, k: np.ndarray, budget: int, scale: float) -> np.ndarray:
    """ObservedAttention's kept positions (one shot, no window kept)."""
    return keep_top(observed_attention_scores(q, k, scale), budget)


def h2o_keep(q: np.ndarray, k: np.ndarray, budget: int, scale: float, *, recent: int) -> np.ndarray:
    """H2O's cache after the prefix, evicting greedily token by token
    (``H2OKVCache_LayerWise``): token ``t`` joins the cache; its query's
    attention over the cache (softmax over the cached keys only) is added to
    each cached position's accumulated score, summed over the group's heads
    in order (``hh_score`` sums over queries; the GQA group's heads read one
    KV cache); when the cache exceeds ``budget``, the position last in the
    order (score descending, ties to the lower position) among all but the
    ``recent`` newest is evicted and its score dropped.

    ``budget - recent`` heavy hitters plus ``recent`` recent positions.
    """
    q, k = _prefix(q, k)
    p_len, group, _ = q.shape
    budget, recent = int(budget), int(recent)
    if not 0 <= recent <= budget:
        raise ValueError(f"recent must be in 0..budget ({budget}), got {recent}")
    cache: list = []
    score: dict = {}
    for t in range(p_len):
        cache.append(t)
        score[t] = 0.0
        keys = k[cache]
        for h in range(group):
            p = softmax_row(q[t, h], keys, scale)
            for j, pos in enumerate(cache):
                score[pos] += float(p[j])
        if len(cache) > budget:
            old = cache[: len(cache) - recent]
            victim = sorted(old, key=lambda j: (-score[j], j))[-1]
            cache.remove(victim)
            del score[victim]
    return np.array(cache, dtype=np.int64)
