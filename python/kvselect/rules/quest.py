"""Quest's query-aware page selection: each page's key bounds, the score
bound they put on a decoding query, and the pages it reads.

The rule (``kvselect.quest_select``, docs/quest.md): per page of 16 tokens and
KV head, the element-wise min and max of its keys; a query's page score
``sum_i max(q_i * kmax_i, q_i * kmin_i)``; the last page forced and the top
``budget - 1`` of the others, every page when they fit (Quest's kernels), with
Quest's evaluation script's and SGLang's variants.
"""

from __future__ import annotations

from kvselect.rules._rule import Rule

RULE = Rule(
    name="quest",
    title="Quest page selection",
    api=("quest_bounds", "quest_bounds_paged", "quest_update", "quest_scores", "quest_select"),
    reference="kvselect.reference.quest",
    guide="docs/quest.md",
)
