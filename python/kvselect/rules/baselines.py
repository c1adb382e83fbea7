"""The baselines a selection is judged against: the null models, sink + window, the oracle.

The rules (``kvselect.Selector``, ``kvselect.oracle_topk``,
docs/attention.md): the witness spec's random and locality nulls (``k``
random earlier positions; the ``k`` most recent), StreamingLLM's sink +
window (the first ``sinks`` keys and the most recent ``k − sinks``) and the
oracle top-k (the ``k`` keys with the largest true attention weight summed
over the KV head's query group: unusable in production, the ceiling).
"""

from __future__ import annotations

import numpy as np

import kvselect as ks
from kvselect.rules._rule import EvalContext, Knob, Policy, Rule, Selection, timed


def random_null(ctx: EvalContext) -> Selection:
    """``k`` distinct random positions of each query's context (seeded)."""
    k = ctx.units
    return timed(lambda: ks.Selector.random(k, ctx.settings.seed).rows(ctx.pos, width=k))


def locality_null(ctx: EvalContext) -> Selection:
    """The ``k`` most recent positions."""
    k = ctx.units
    return timed(lambda: ks.Selector.local(k).rows(ctx.pos, width=k))


def sink_window(ctx: EvalContext) -> Selection:
    """The first ``sinks`` keys and the most recent ``k − sinks``."""
    k = ctx.units
    sinks = min(ctx.settings.sinks, k - 1)
    return timed(lambda: ks.Selector.sink_window(sinks, k - sinks).rows(ctx.pos, width=k))


def group_sum(probs: np.ndarray) -> np.ndarray:
    """The group's summed attention weight per key, in head order in float64:
    what the core's oracle selector ranks by (a KV head's selection serves its
    whole group, so the group's total recall is what it maximises)."""
    out = probs[:, 0].copy()
    for j in range(1, probs.shape[1]):
        out += probs[:, j]
    return out


def oracle(ctx: EvalContext) -> Selection:
    """The ``k`` keys with the largest attention weight summed over the group."""
    k = ctx.units
    return timed(lambda: ks.oracle_topk(group_sum(ctx.head.probs), ctx.pos, k, width=k))


RULE = Rule(
    name="baselines",
    title="Attention and selectors",
    api=("Selector", "oracle_topk", "dense_attention", "sparse_attention", "attention_probabilities"),
    reference="kvselect.reference.attn",
    twins=(
        "dense_rows",
        "local_rows",
        "sink_window_rows",
        "oracle_topk",
        "attention",
        "dense_attention",
        "sparse_attention",
    ),
    policies=(
        Policy("random null", random_null, "the spec's random null model (a row of the random selector)."),
        Policy("locality null", locality_null, "the spec's locality null model (a row of the local selector)."),
        Policy(
            "sink + window",
            sink_window,
            "StreamingLLM: the first ``sinks`` keys and the most recent ``k − sinks``.",
            knobs=(
                Knob(
                    "sinks",
                    "--sinks",
                    "sink + window: sink tokens (default: 4, or k - 1 when the budget is below 5)",
                    minimum=0,
                ),
            ),
        ),
        Policy(
            "oracle top-k",
            oracle,
            "the ``k`` keys with the largest true attention weight (averaged over the KV head's "
            "query-head group): unusable in production, the ceiling.",
        ),
    ),
    guide="docs/attention.md",
)
