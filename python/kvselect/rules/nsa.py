"""NSA's block selection as fla computes it: the complete blocks' mean keys, each query
head's softmax over them summed over its KV head's group (InfLLM-v2's stage 1), block 0
and the query's last two blocks forced, the top ``block_counts``.

The rule (``kvselect.nsa_select``, docs/nsa.md; fla-org/flash-linear-attention
``fla/ops/nsa/parallel.py`` ``parallel_nsa_kernel_topk``). Its twin is
:mod:`kvselect.reference.nsa`, decided in exact arithmetic.
"""

from __future__ import annotations

from kvselect.rules._rule import Rule

RULE = Rule(
    name="nsa",
    title="NSA block selection (fla)",
    api=("nsa_block_scores", "nsa_select"),
    reference="kvselect.reference.nsa",
    guide="docs/nsa.md",
)
