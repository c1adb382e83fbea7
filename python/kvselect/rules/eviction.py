"""The KV-eviction baselines researchers compare against: SnapKV, PyramidKV,
TOVA, H2O and its one-shot variant ObservedAttention, as ``kvselect eval``
policies of the boundary experiment.

An eviction policy decides once, at the boundary ``P``, which ``B`` of the
prefix positions ``0..P-1`` a KV head keeps (``B`` = the token budget ``k``,
per KV head, per layer); every query after the boundary reads those plus
the tokens that arrived after ``P`` (:mod:`kvselect.evaluate`, the boundary
experiment). The rules, their sources and their exact order are the
reference twin's (:mod:`kvselect.reference.eviction`); the selection runs in
the native core (``src/eviction/``: :func:`kvselect.snapkv_scores`,
:func:`kvselect.tova_scores`, :func:`kvselect.observed_attention_scores`,
:func:`kvselect.h2o_keep`, :func:`kvselect.keep_top`), in float64 with
``kvselect.attention_probabilities``' arithmetic (the dot product one chain
in dimension order, the C library's ``exp``, key-order sums), and the
differential tests hold it equal to the twin.

Why the numbers agree bit for bit: every reduction runs in the twin's order
(the window's queries, then the pooling's taps, then the group's heads, each
summed in index order from 0 and divided once), the dot products are exact
products chained in dimension order at every SIMD level, and the ``exp`` is
the one Python's ``math.exp`` calls. What would break it: a pairwise or
blocked reduction on either side, a vectorised ``exp``, or probabilities from
another softmax (the project's float32 ``exp`` would need the twin to treat
near-ties as tied: ``src/eviction/mod.rs`` states why it is not used).

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
    position, ascending (:func:`kvselect.keep_top`; a negative budget keeps none)."""
    return ks.keep_top(np.asarray(score, dtype=np.float64), max(0, int(budget)))


def snapkv_scores(q: np.ndarray, k: np.ndarray, scale: float, window: int) -> np.ndarray:
    """SnapKV's score ``[P]`` (:func:`kvselect.snapkv_scores`, kernel :data:`KERNEL`)."""
    return ks.snapkv_scores(q, k, window=window, kernel=KERNEL, scale=scale)


def tova_scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """TOVA's score ``[P]``: the last prefix query's attention averaged over the group."""
    return ks.tova_scores(q[-1], k, scale=scale)


def observed_scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """ObservedAttention's score ``[P]``: each key's attention summed over the
    prefix queries in order, over the ``P - j`` that see it, averaged over the group."""
    return ks.observed_attention_scores(q, k, scale=scale)


def h2o_keep(q: np.ndarray, k: np.ndarray, budget: int, scale: float, recent: int) -> np.ndarray:
    """H2O's greedy per-step eviction over the prefix, frozen at ``P``
    (:func:`kvselect.h2o_keep`)."""
    return ks.h2o_keep(q, k, budget, recent=recent, scale=scale)


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
    api=("snapkv_scores", "tova_scores", "observed_attention_scores", "h2o_keep", "keep_top"),
    reference="kvselect.reference.eviction",
    twins=(
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
    ),
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
