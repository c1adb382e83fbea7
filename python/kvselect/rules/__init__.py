"""kvselect's rules, each registered once: the list every other list is derived from.

A rule is one module here holding a :class:`Rule` record: its native API
names, its reference twin, its ``kvselect.testing`` assertions and cases,
its dump kinds with their checkers, its ``kvselect eval`` policies with
their budget units and settings. :data:`RULES` lists them, and the package
derives from it what it would otherwise keep by hand:

- ``kvselect.checking``'s dump kinds (``KINDS``, ``CHECK_KINDS``,
  ``TABLES``), ``check_dump``'s checker for each and ``docs/dump-format.md``;
- ``kvselect.evaluate``'s policies (``POLICIES``), each one's budget
  charged in tokens (:class:`BudgetUnit`) and its ``n/a`` reason, and
  ``kvselect eval``'s setting flags (:class:`Knob`);
- the API reference's rule sections (``scripts/api_docs.py``);
- the public names (and ``__all__``) of ``kvselect`` (each rule's ``api``),
  ``kvselect.reference`` (its ``twins``), ``kvselect.testing`` (its
  ``assertions``) and ``kvselect.testing.cases`` (its ``cases`` and
  ``case_functions``), wherever the rule's code is written;
- the test suites' lists (``tests/python/test_rules.py`` fails when a public
  name, dump kind, policy, reference module or assertion belongs to no rule).

Adding a rule: ``docs/adding-a-rule.md``; it is registered by one line, its
module's name in :data:`ORDER`, whose order is the order of the derived lists
(the dump kinds, the eval table's rows).
"""

from __future__ import annotations

import importlib
from typing import Dict, Tuple

from kvselect.rules._rule import (
    TOKENS,
    BudgetUnit,
    DumpKind,
    EvalContext,
    Knob,
    Policy,
    Rule,
    Selection,
    resolve,
    timed,
)

ORDER: Tuple[str, ...] = (
    "indexer",
    "block_sparse",
    "witness",
    "compressed",
    "baselines",
    "quest",
    "infllm",
    "nsa",
    "moba",
    "vslash",
    "sparse_attention",
    "eviction",
)
"""The rule modules of this package by name, one line each, in the order of the
lists derived from them (a rule with a per-query eval policy before the first
with an eviction policy: ``docs/adding-a-rule.md``)."""

RULES: Tuple[Rule, ...] = tuple(importlib.import_module(f"kvselect.rules.{name}").RULE for name in ORDER)
"""Every rule, in the order of the lists derived from them."""

SHARED_API: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("Engine caches: global slot ids", ("GlobalSlots",)),
    (
        "Metrics",
        (
            "segment_coverage",
            "segment_coverage_rows",
            "attention_mass_recall",
            "attention_mass_recall_rows",
            "output_relative_error",
            "output_relative_error_rows",
            "slots_used_rows",
        ),
    ),
    (
        "Checkers: exact scores, their error scales, verdicts",
        (
            "indexer_scores",
            "indexer_magnitudes",
            "block_scores",
            "block_magnitudes",
            "check_topk",
            "check_blocks",
            "check_witnesses",
        ),
    ),
    ("Errors", ("KvselectError", "WitnessError", "SelectionError")),
    ("Threads, SIMD level, version", ("get_num_threads", "set_num_threads", "simd_level", "__version__")),
)
"""The native names no one rule owns (shared machinery), by concept: with
every rule's ``api`` they are ``kvselect.__all__``, each once (the API
reference's sections, in this order after the rules')."""

__all__ = [
    "RULES",
    "ORDER",
    "SHARED_API",
    "Rule",
    "DumpKind",
    "Policy",
    "BudgetUnit",
    "TOKENS",
    "Knob",
    "EvalContext",
    "Selection",
    "timed",
    "resolve",
    "dump_kinds",
    "policies",
    "policy",
    "knobs",
]


def dump_kinds() -> Dict[str, DumpKind]:
    """Every rule's dump kinds by name, in rule order."""
    return {kind.name: kind for rule in RULES for kind in rule.dumps}


def policies() -> Tuple[Policy, ...]:
    """Every rule's eval policies, in rule order (the eval table's rows)."""
    return tuple(p for rule in RULES for p in rule.policies)


def policy(name: str) -> Policy:
    """The policy named ``name``.

    Raises
    ------
    KeyError
        No rule declares a policy of that name.
    """
    for p in policies():
        if p.name == name:
            return p
    raise KeyError(name)


def knobs() -> Tuple[Knob, ...]:
    """Every policy's settings, in rule order, each once."""
    seen: Dict[str, Knob] = {}
    for p in policies():
        for k in p.knobs:
            seen.setdefault(k.field, k)
    return tuple(seen.values())
