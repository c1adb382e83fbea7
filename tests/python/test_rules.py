"""The rules' registry (kvselect.rules) is complete: every public piece of a
rule belongs to exactly one registered rule, and every list the package
derives from the registry holds every rule's pieces.

A rule left out of the registry, or a piece a rule does not declare (a
native function, a dump kind, an eval policy, a reference module, an
assertion, a cases generator, a guide), fails one of these tests by name.
"""

import importlib
import inspect
import pathlib
import pkgutil

import numpy as np
import pytest

import kvselect
import kvselect.checking as checking
import kvselect.evaluate as evaluate
import kvselect.reference as reference
import kvselect.rules as rules
import kvselect.testing as testing
import kvselect.testing.cases as cases

ROOT = pathlib.Path(__file__).parents[2]

SHARED_API = {name for _, names in rules.SHARED_API for name in names}

# kvselect.reference's modules that are shared machinery, not a rule's twin.
SHARED_REFERENCE = {"_args", "keys", "metrics", "check"}

# Native functions without a NumPy twin: the random null's rows are
# ChaCha8's stream, not a rule's (docs/witnesses.md).
NO_TWIN = {"random_null"}


def _rule_modules():
    return sorted(m.name for m in pkgutil.iter_modules(rules.__path__) if not m.name.startswith("_"))


def test_every_rule_module_is_registered_once():
    registered = [r.name for r in rules.RULES]
    assert len(registered) == len(set(registered))
    assert sorted(registered) == _rule_modules()
    for name in _rule_modules():
        assert importlib.import_module(f"kvselect.rules.{name}").RULE in rules.RULES, name


def test_every_native_name_is_a_rules_or_named_shared():
    owned = [n for r in rules.RULES for n in r.api]
    assert len(owned) == len(set(owned)), "a name is in two rules"
    assert not set(owned) & SHARED_API
    assert sorted(owned + sorted(SHARED_API)) == sorted(kvselect.__all__)


def test_every_reference_module_is_a_rules_twin_or_shared():
    modules = {m.name for m in pkgutil.iter_modules(reference.__path__)}
    twins = [r.reference for r in rules.RULES if r.reference is not None]
    assert len(twins) == len(set(twins))
    assert sorted(t.rpartition(".")[2] for t in twins) == sorted(modules - SHARED_REFERENCE)
    for r in rules.RULES:
        # The twin has a NumPy function for each of the rule's native functions.
        if r.reference is None:
            continue
        twin = rules.resolve(r.reference)
        for name in r.api:
            native = getattr(kvselect, name)
            if callable(native) and not inspect.isclass(native) and name not in NO_TWIN:
                assert hasattr(twin, name) or hasattr(reference, name), (r.name, name)


def test_every_assertion_and_cases_generator_is_a_rules():
    claimed = [a for r in rules.RULES for a in r.assertions]
    assert len(claimed) == len(set(claimed))
    public = [n for n in testing.__all__ if n.startswith("assert_")]
    assert sorted(claimed) == sorted(f"kvselect.testing.{n}" for n in public)
    generators = [r.cases for r in rules.RULES if r.cases is not None]
    assert sorted(generators) == sorted(
        f"kvselect.testing.cases.{n}" for n in cases.__all__ if n.startswith("all_") and n.endswith("_cases")
    )
    for dotted in claimed + generators:
        assert callable(rules.resolve(dotted)), dotted


def test_the_dump_kinds_are_the_rules_and_each_is_checked_by_its_rules_checker():
    kinds = [k.name for r in rules.RULES for k in r.dumps]
    assert len(kinds) == len(set(kinds))
    assert checking.CHECK_KINDS == tuple(kinds)
    assert checking.KINDS == tuple(kinds) + ("workload",)
    assert list(checking.TABLES) == list(checking.KINDS)
    text = (ROOT / "docs" / "dump-format.md").read_text(encoding="utf-8")
    for r in rules.RULES:
        for k in r.dumps:
            assert checking.TABLES[k.name] is k.table
            assert f'## kind = "{k.name}"' in text and k.note in text, k.name
            assert k.table["kind"][3] == f'"{k.name}"', k.name


def test_the_eval_policies_are_the_rules_with_their_flags():
    names = [p.name for r in rules.RULES for p in r.policies]
    assert len(names) == len(set(names))
    assert evaluate.POLICIES + evaluate.EVICTION_POLICIES == tuple(names)
    assert evaluate.EVICTION_POLICIES == tuple(p.name for p in rules.policies() if p.eviction)
    fields = [k.field for p in rules.policies() for k in p.knobs]
    assert len(fields) == len(set(fields)), "a setting declared by two policies"
    assert evaluate.DERIVED_FIELDS == tuple(fields)
    settings = evaluate.Settings()
    for field in fields:
        assert hasattr(settings, field), field
    from kvselect.cli import build_parser

    for k in rules.knobs():  # each setting has its flag on `kvselect eval`
        assert getattr(build_parser().parse_args(["eval", k.flag, "3"]), k.field) == 3, k.flag
    # The harness's docs name every policy.
    for name in names:
        assert f"``{name}``" in evaluate.__doc__, name


def test_every_rule_has_its_guide_and_api_section():
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for r in rules.RULES:
        assert r.guide is not None and (ROOT / r.guide).is_file(), r.name
        if r.api:
            assert f"## {r.title}\n" in api, r.title


@pytest.mark.parametrize("first", ["kvselect.rules", "kvselect.checking", "kvselect.evaluate", "kvselect.testing"])
def test_any_layer_imports_first(first):
    # The rules import checking's helpers and checking reads the rules on
    # first use: neither order may be a cycle.
    import subprocess
    import sys

    code = f"import {first}, kvselect.checking as c, kvselect.evaluate as e; print(len(c.KINDS), len(e.POLICIES))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(len(checking.KINDS)), str(len(evaluate.POLICIES))]


def test_a_budget_unit_charges_whole_units_against_the_token_budget():
    blocks = rules.policy("block-sparse").unit
    s = evaluate.Settings(budget=200, block_size=64, init_blocks=1, local_blocks=2)
    assert blocks.units(s) == 3 and blocks.note(s) is None
    assert blocks.note(evaluate.Settings(budget=63, block_size=64)) == "the budget (63) holds no block of 64 tokens"
    over = evaluate.Settings(budget=191, block_size=64, init_blocks=1, local_blocks=2)
    assert blocks.note(over) == ("its forced blocks alone (3 of 64 tokens) exceed the budget (191 tokens, 2 blocks)")
    assert rules.TOKENS.units(s) == 200 and rules.TOKENS.note(s) is None


def test_a_policy_whose_forced_part_exceeds_the_budget_is_na_with_the_reason_and_the_rest_run(monkeypatch):
    # A page policy (pages of 16 tokens, 3 forced) at k = 32: 2 pages, fewer
    # than its forced 3. It is reported n/a with that reason; every other
    # policy runs, and a budget that holds them runs it too.
    seen = []

    def first_pages(ctx):
        seen.append((ctx.settings.budget, ctx.units))
        pages = np.arange(ctx.units * 16, dtype=np.int32)
        rows = np.where(pages[None, :] <= ctx.pos[:, None], pages[None, :], -1).astype(np.int32)
        out = np.full((len(ctx.pos), ctx.settings.budget), -1, dtype=np.int32)
        out[:, : rows.shape[1]] = rows
        return rules.Selection(out, 0.0)

    pages = rules.BudgetUnit("page", size=lambda s: 16, forced=lambda s: 3)
    toy = rules.Rule("toy", "Toy", policies=(rules.Policy("first pages", first_pages, "the first pages", unit=pages),))
    monkeypatch.setattr(rules, "RULES", rules.RULES + (toy,))
    w = kvselect.workloads.synthetic(context=256, queries=4, n_kv_heads=1, n_heads=2)
    runs = [evaluate.derive_settings(k)[0] for k in (32, 64)]
    report = evaluate.evaluate(w, budgets=[32, 64], settings=runs)
    by = {(r.budget, r.policy): r for r in report.results}
    assert (
        by[(32, "first pages")].note == "its forced pages alone (3 of 16 tokens) exceed the budget (32 tokens, 2 pages)"
    )
    assert np.isnan(by[(32, "first pages")].recall_mean)
    assert by[(64, "first pages")].note is None and by[(64, "first pages")].slots_used > 0
    assert seen == [(64, 4)]
    assert all(r.note is None for (b, name), r in by.items() if name != "first pages")
