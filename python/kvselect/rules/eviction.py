"""The KV-eviction baselines researchers compare against: SnapKV, PyramidKV,
TOVA, H2O and its one-shot variant ObservedAttention, as ``kvselect eval``
policies of the boundary experiment.

An eviction policy decides once, at the boundary ``P``, which ``B`` of the
prefix positions ``0..P-1`` a KV head keeps (``B`` = the token budget ``k``,
per KV head, per layer); every query after the boundary reads those plus
the tokens that arrived after ``P`` (:mod:`kvselect.evaluate`, the boundary
experiment). The rules, their sources and their exact order are the
reference twin's (:mod:`kvselect.reference.eviction`): this module computes
the same numbers from the native float64 probabilities
(``kvselect.attention_probabilities``: the dot product one chain in
dimension order, the C library's ``exp``, key-order sums), vectorised over
keys and heads, and the differential tests hold the two equal.

Why the numbers agree bit for bit: every reduction here runs in the twin's
order (the window's queries, then the pooling's taps, then the group's
heads, each summed in index order and divided once), and elementwise float64
operations round the same however they are batched. What would break it: a
pairwise or blocked reduction (``np.sum``, ``np.mean``, a matmul) on either
side, or probabilities from another softmax.

Where the sources are silent or ambiguous (decided here, stated in
docs/evaluating-policies.md):

- ties: one total order, score descending, ties to the lower position
  (torch's ``topk`` leaves them unspecified); kvpress's padded window score
  (the tensor-wide maximum plus 1, at the pinned commit) ties the window's
  positions with each other, so fewer kept than the window keeps its lowest;
- the budget: ``B`` positions, never kvpress's ``int(L * (1 - ratio))``
  (which truncates: L = 100 at ratio 0.9 keeps 9); the kvpress comparison
  maps one to the other;
- TOVA averages the last query's attention over *all* heads of the layer;
  the eval's unit is one KV head, so it averages over that head's group (the
  same on a workload with one KV head per layer);
- H2O keeps one score per KV head: the group's heads' attention summed (the
  source is multi-head, one cache per head);
- PyramidKV's per-layer budgets come from kvpress's formula at the ratio
  ``1 - B / P``: a layer's rows may hold more than ``B`` prefix positions,
  the layers' mean is ``B`` (within kvpress's rounding); the uniform budget
  when kvpress's pyramid does not fit (its ``min_num`` below the window);
- SnapKV needs a prefix longer than its window (kvpress asserts it): at
  ``P <= window`` it is ``n/a``.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Union

import numpy as np

import kvselect as ks
from kvselect.rules._rule import EvalContext, Knob, Policy, Rule, Selection

#: SnapKV's pooling kernel (kvpress's default).
KERNEL = 5
#: PyramidKV's beta (kvpress's default).
BETA = 20


def keep_top(score: np.ndarray, budget: int) -> np.ndarray:
    """The first ``budget`` positions by score descending, ties to the lower
    position, ascending."""
    order = np.lexsort((np.arange(len(score)), -score))
    return np.sort(order[: max(0, int(budget))]).astype(np.int64)


def _rows(q: np.ndarray, k: np.ndarray, first: int, scale: float) -> np.ndarray:
    """``[P - first, group, P]``: the native causal probabilities of the
    prefix queries ``first..P-1``."""
    pos = np.arange(first, len(k), dtype=np.int64)
    return ks.attention_probabilities(q[first:], k.reshape(len(k), 1, -1), pos, scale=scale)


def _sum_axis0(x: np.ndarray) -> np.ndarray:
    """``x[0] + x[1] + ...`` in order (not pairwise)."""
    out = np.zeros(x.shape[1:])
    for row in x:
        out = out + row
    return out


def snapkv_scores(q: np.ndarray, k: np.ndarray, scale: float, window: int) -> np.ndarray:
    """SnapKV's score ``[P]`` (:func:`kvselect.reference.snapkv_scores`)."""
    p_len, group = len(k), q.shape[1]
    keys = p_len - window
    rows = _rows(q, k, p_len - window, scale)[:, :, :keys]
    per_head = _sum_axis0(rows) / window  # [group, keys]
    half = KERNEL // 2
    padded = np.concatenate([np.zeros((group, half)), per_head, np.zeros((group, half))], axis=1)
    pooled = _sum_axis0(np.stack([padded[:, t : t + keys] for t in range(KERNEL)])) / KERNEL
    score = _sum_axis0(pooled) / group
    top = float(np.max(score)) + 1 if keys else 1.0
    return np.concatenate([score, np.full(window, top)])


def tova_scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """TOVA's score ``[P]``: the last prefix query's attention averaged over the group."""
    p_len = len(k)
    row = _rows(q, k, p_len - 1, scale)[0, :, : p_len - 1]
    score = _sum_axis0(row) / q.shape[1]
    top = float(np.max(score)) + 1 if p_len > 1 else 1.0
    return np.concatenate([score, [top]])


def observed_scores(q: np.ndarray, k: np.ndarray, scale: float, chunk: int = 256) -> np.ndarray:
    """ObservedAttention's score ``[P]``: each key's attention summed over the
    prefix queries in order, over the ``P - j`` that see it, averaged over the group."""
    p_len, group = len(k), q.shape[1]
    acc = np.zeros((group, p_len))
    for start in range(0, p_len, chunk):
        stop = min(p_len, start + chunk)
        pos = np.arange(start, stop, dtype=np.int64)
        rows = ks.attention_probabilities(q[start:stop], k.reshape(p_len, 1, -1), pos, scale=scale)
        for r in rows:  # query order, as one sum over the prefix
            acc = acc + r
    acc = acc / np.arange(p_len, 0, -1, dtype=np.float64)
    return _sum_axis0(acc) / group


def h2o_keep(q: np.ndarray, k: np.ndarray, budget: int, scale: float, recent: int) -> np.ndarray:
    """H2O's greedy per-step eviction over the prefix, frozen at ``P``
    (:func:`kvselect.reference.h2o_keep`)."""
    p_len, group, d = q.shape
    cache = np.zeros(0, dtype=np.int64)
    score = np.zeros(0)
    k3 = k.reshape(p_len, 1, d)
    for t in range(p_len):
        cache = np.append(cache, t)
        score = np.append(score, 0.0)
        keys = np.ascontiguousarray(k3[cache])
        p = ks.attention_probabilities(q[t : t + 1], keys, np.array([len(cache) - 1]), scale=scale)[0]
        for h in range(group):
            score = score + p[h]
        if len(cache) > budget:
            old = len(cache) - recent
            # The last of the order (score descending, ties to the lower
            # position): the lowest score, the highest position among equals.
            cand = score[:old]
            low = np.flatnonzero(cand == cand.min())[-1]
            cache = np.delete(cache, low)
            score = np.delete(score, low)
    return cache


def _prefix(ctx: EvalContext) -> Optional[np.ndarray]:
    return getattr(ctx.head, "observe", None)


def _kept_rows(ctx: EvalContext, kept: np.ndarray) -> np.ndarray:
    out = np.full((len(ctx.pos), max(ctx.settings.budget, len(kept))), -1, dtype=np.int32)
    out[:, : len(kept)] = kept
    return out


#: ``(prefix queries [P, group, d], prefix keys [P, d], scale) -> kept positions``,
#: or why the policy cannot run on this head.
Keeper = Callable[[np.ndarray, np.ndarray, float], Union[np.ndarray, str]]


def _run(ctx: EvalContext, fn: Keeper) -> Union[Selection, str]:
    """``fn`` on the head's prefix, its kept positions as every query's row
    (charged the call's time), or its reason."""
    q = _prefix(ctx)
    if q is None:
        return "an eviction policy: it runs in the boundary experiment (--boundary)"
    k = ctx.head.k[: len(q)].reshape(len(q), -1)
    t0 = time.perf_counter()
    kept = fn(q, k, ctx.head.scale)
    if isinstance(kept, str):
        return kept
    return Selection(_kept_rows(ctx, kept), time.perf_counter() - t0)


def snapkv(ctx: EvalContext) -> Union[Selection, str]:
    """SnapKV: the top ``B`` by the window's pooled attention, the window first."""
    w = ctx.settings.snapkv_window

    def fn(q: np.ndarray, k: np.ndarray, scale: float) -> Union[np.ndarray, str]:
        if len(k) <= w:
            return f"the prefix (P = {len(k)}) does not exceed the SnapKV window ({w}; kvpress asserts it)"
        return keep_top(snapkv_scores(q, k, scale, w), ctx.units)

    return _run(ctx, fn)


def pyramid_budget(layer: int, n_layers: int, p_len: int, budget: int, window: int) -> int:
    """PyramidKV's budget at ``layer`` (:func:`kvselect.reference.pyramidkv_layer_budget`)
    for the uniform budget ``budget`` of a ``p_len`` prefix: kvpress's
    compression ratio ``1 - budget / p_len``, its arithmetic."""
    ratio = 1 - budget / p_len
    uniform = round(p_len * (1 - ratio))
    if n_layers == 1:
        return int(uniform)
    capacity = window + p_len * (1 - ratio)
    min_num = (capacity - window) / BETA
    max_num = (capacity - window) * 2 - min_num
    if max_num >= p_len - window:
        max_num = p_len - window
        min_num = (capacity - window) * 2 - max_num
    if not (p_len >= max_num >= min_num >= window):
        return int(uniform)
    return int(round(max_num - layer * (max_num - min_num) / (n_layers - 1)))


def pyramidkv(ctx: EvalContext) -> Union[Selection, str]:
    """PyramidKV: SnapKV's score at its layer's budget (their mean the
    uniform ``B``); one layer: SnapKV's rows."""
    layers, layer = getattr(ctx.head, "layers", 1), getattr(ctx.head, "layer", 0)
    w = ctx.settings.snapkv_window
    done = ctx.done.get("SnapKV")
    if layers == 1 and done is not None:
        return Selection(done.rows.copy(), done.seconds)

    def fn(q: np.ndarray, k: np.ndarray, scale: float) -> Union[np.ndarray, str]:
        if len(k) <= w:
            return f"the prefix (P = {len(k)}) does not exceed the SnapKV window ({w}; kvpress asserts it)"
        budget = pyramid_budget(layer, layers, len(k), min(ctx.units, len(k)), w)
        return keep_top(snapkv_scores(q, k, scale, w), budget)

    return _run(ctx, fn)


def tova(ctx: EvalContext) -> Union[Selection, str]:
    """TOVA: the top ``B`` by the last prefix query's attention, averaged over the group."""
    return _run(ctx, lambda q, k, scale: keep_top(tova_scores(q, k, scale), ctx.units))


def h2o(ctx: EvalContext) -> Union[Selection, str]:
    """H2O: greedy per-step eviction over the prefix (heavy hitters + recent), frozen at ``P``."""
    given = ctx.settings.h2o_recent
    recent = ctx.units // 2 if given is None else min(given, ctx.units)
    return _run(ctx, lambda q, k, scale: h2o_keep(q, k, ctx.units, scale, recent))


def observed_attention(ctx: EvalContext) -> Union[Selection, str]:
    """ObservedAttention: the top ``B`` by one-shot accumulated attention."""
    return _run(ctx, lambda q, k, scale: keep_top(observed_scores(q, k, scale), ctx.units))


RULE = Rule(
    name="eviction",
    title="KV-eviction baselines",
    reference="kvselect.reference.eviction",
    policies=(
        Policy(
            "SnapKV",
            snapkv,
            "kvpress's SnapKV: the last ``window`` prefix queries' attention averaged, pooled (kernel 5), "
            "averaged over the group; the top ``B``, the window first.",
            knobs=(Knob("snapkv_window", "--snapkv-window", "SnapKV: observation window in queries (default: 64)"),),
            eviction=True,
        ),
        Policy(
            "PyramidKV",
            pyramidkv,
            "kvpress's PyramidKV: SnapKV's score with per-layer budgets (a line from layer 0 down, "
            "their mean the uniform ``B``, beta 20); on a one-layer workload it is SnapKV (the same rows).",
            eviction=True,
        ),
        Policy(
            "TOVA",
            tova,
            "kvpress's TOVA: the last prefix query's attention averaged over the group; the top ``B``.",
            eviction=True,
        ),
        Policy(
            "H2O",
            h2o,
            "FMInference/H2O: greedy per-step eviction over the prefix (accumulated attention over the "
            "cache, ``h2o_recent`` newest kept, evicted scores dropped), frozen at the boundary.",
            knobs=(
                Knob(
                    "h2o_recent",
                    "--h2o-recent",
                    "H2O: recent positions kept out of the budget (default: k // 2)",
                    minimum=0,
                ),
            ),
            eviction=True,
        ),
        Policy(
            "ObservedAttention",
            observed_attention,
            "kvpress's ObservedAttention (H2O's one-shot variant): each key's attention over the prefix "
            "queries that see it, averaged over the group; the top ``B``.",
            eviction=True,
        ),
    ),
    guide="docs/evaluating-policies.md",
)
