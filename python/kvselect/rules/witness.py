"""Segment witnesses (vLLM PR 47942): a learned top-k made to cover every segment.

The rule (``kvselect.scatter_topology_witnesses``, docs/witnesses.md): cut
``[0, L)`` into ``S_eff = min(S, L)`` segments; for each segment the learned
row misses, add its left edge. Its ``witnesses`` dump (an in-place scatter's
buffer before and after) is checked exactly: the rule has no scores, so no
tolerance. Its eval policies build on the indexer's learned top-k and are
declared with it (:mod:`kvselect.rules.indexer`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import _int, _need
from kvselect.rules._rule import DumpKind, Rule

TABLE = {
    "kind": ("str", "", "required", '"witnesses"'),
    "before": ("int", "[rows, topk]", "required", "the buffer before scatter_topology_witnesses_"),
    "after": ("int", "[rows, topk]", "required", "the buffer after it"),
    "context_lens": ("int", "[rows]", "required", "each row's positions"),
    "num_segments": ("int scalar", "", "required", "the call's num_segments"),
}


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``witnesses`` dump against the witness rule (exact: no tolerance applies)."""
    _need(d, "before", "after", "context_lens", "num_segments")
    report = ks.check_witnesses(d["before"], d["after"], d["context_lens"], _int(d, "num_segments"))
    return [("against the witness rule (exact)", report)]


def assert_case(case: Any, after: Any) -> Any:
    """A witness case's check of a kernel's buffer ``after`` the merge
    (:meth:`kvselect.testing.cases.Case.assert_rows`)."""
    from kvselect import testing

    i = case.inputs
    return testing.assert_witnesses(i["topk_indices"], after, i["context_lens"], i["num_segments"])


RULE = Rule(
    name="witness",
    title="Segment witnesses",
    api=(
        "topology_witness_indices",
        "apply_topology_witnesses",
        "scatter_topology_witnesses",
        "segment_of",
        "random_null",
        "locality_null",
        "MAX_TOPOLOGY_SEGMENTS",
    ),
    reference="kvselect.reference.witness",
    twins=(
        "MAX_TOPOLOGY_SEGMENTS",
        "segment_of",
        "topology_witness_indices",
        "apply_topology_witnesses",
        "scatter_topology_witnesses",
        "locality_null",
        "segment_coverage",
        "attention_mass_recall",
    ),
    assertions=("kvselect.testing.assert_witnesses",),
    cases="kvselect.testing.cases.all_witness_cases",
    case_functions=("kvselect.testing.cases.witness_rows",),
    dumps=(
        DumpKind(
            "witnesses",
            TABLE,
            "An in-place `scatter_topology_witnesses_` call, checked by `kvselect check`.",
            check,
            exact=True,
            row_keys=("before", "after", "context_lens"),
            rows=lambda d: len(d["before"]),
            assert_case=assert_case,
        ),
    ),
    guide="docs/witnesses.md",
)
