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


def _native_public():
    """The native module's public names (what its bindings register), ``__version__`` included."""
    return sorted(n for n in dir(kvselect._core) if not n.startswith("_") or n == "__version__")


def test_every_native_name_is_a_rules_or_named_shared():
    owned = [n for r in rules.RULES for n in r.api]
    assert len(owned) == len(set(owned)), "a name is in two rules"
    assert not set(owned) & SHARED_API
    assert sorted(owned + sorted(SHARED_API)) == _native_public()
    # kvselect.__all__ is derived from the registry: the rules' names, then the shared ones.
    assert kvselect.__all__ == owned + [n for _, names in rules.SHARED_API for n in names]
    for name in kvselect.__all__:
        assert getattr(kvselect, name) is getattr(kvselect._core, name) or name in (
            "check_topk",
            "check_blocks",
            "check_witnesses",
        ), name
    # kvselect re-exports what the native module's __all__ lists as it is; the three
    # checkers it wraps (their reports as kvselect.checking.Report) are left out of it.
    wrapped = {"check_topk", "check_blocks", "check_witnesses"}
    assert sorted(n for n in kvselect._core.__all__ if not n.startswith("_") or n == "__version__") == sorted(
        set(_native_public()) - wrapped
    )
    for name in wrapped:
        assert getattr(kvselect, name).__wrapped__ is getattr(kvselect._core, name)


def test_every_reference_module_is_a_rules_twin_or_shared():
    modules = {m.name for m in pkgutil.iter_modules(reference.__path__)}
    twins = [r.reference for r in rules.RULES if r.reference is not None]
    assert len(twins) == len(set(twins))
    packaged = [t for t in twins if t.startswith("kvselect.reference.")]
    assert sorted(t.rpartition(".")[2] for t in packaged) == sorted(modules - SHARED_REFERENCE)
    for r in rules.RULES:
        # A twin outside kvselect.reference is written in its rule's own module.
        if r.reference is not None and r.reference not in packaged:
            assert r.reference == f"kvselect.rules.{r.name}", r.name
        # A rule with a twin names its public names, and only then.
        assert bool(r.twins) == (r.reference is not None), r.name
        if r.reference is None:
            continue
        twin = rules.resolve(r.reference)
        for name in r.twins:  # each exported by kvselect.reference, the twin module's object
            assert getattr(reference, name) is getattr(twin, name), (r.name, name)
        # The twin has a NumPy function for each of the rule's native functions.
        for name in r.api:
            native = getattr(kvselect, name)
            if callable(native) and not inspect.isclass(native) and name not in NO_TWIN:
                assert hasattr(twin, name) or hasattr(reference, name), (r.name, name)
    # kvselect.reference.__all__ is derived: its shared names, then every rule's twins.
    exported = [n for r in rules.RULES for n in r.twins]
    assert len(exported) == len(set(exported)), "a twin name in two rules"
    assert not set(exported) & set(reference.SHARED)
    assert reference.__all__ == list(reference.SHARED) + exported
    for name in reference.__all__:
        assert hasattr(reference, name), name


def _natives_reached(fn, seen=None):
    """The native objects (``kvselect``, ``kvselect._core`` or one of its functions)
    that ``fn`` names as a global (in its body or a closure inside it), directly
    or through the functions of its own module it calls."""
    seen = set() if seen is None else seen
    if id(fn) in seen or not inspect.isfunction(fn):
        return []
    seen.add(id(fn))
    names, codes = set(), [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if inspect.iscode(c)]
    found = []
    for name in sorted(names):
        value = fn.__globals__.get(name)
        if value is kvselect or value is kvselect._core or getattr(value, "__module__", None) == "kvselect._core":
            found.append(value)
        elif inspect.isfunction(value) and value.__module__ == fn.__module__:
            found += _natives_reached(value, seen)
    return found


def test_a_twin_written_in_its_rules_module_reaches_nothing_native():
    # The twin judges the native functions: written in its rule's module (which
    # imports kvselect for its policy and checker), it still calls none of them.
    assert _natives_reached(rules.resolve("kvselect.rules.moba.select"))  # the walk sees a policy's call
    for r in rules.RULES:  # (the twins in kvselect.reference too)
        for name in r.twins:
            assert not _natives_reached(getattr(rules.resolve(r.reference), name)), (r.name, name)


def _defined_in(module, prefix=""):
    """The public functions ``module`` defines itself (not imports), by name."""
    return {
        name
        for name, obj in vars(module).items()
        if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("_")
        if name.startswith(prefix)
    }


def test_every_assertion_and_cases_generator_is_a_rules():
    claimed = [a for r in rules.RULES for a in r.assertions]
    names = [a.rpartition(".")[2] for a in claimed]
    assert len(names) == len(set(names)), "an assertion in two rules"
    # kvselect.testing.__all__ is derived: every rule's assertions, then CheckFailure,
    # each the object its record names (written in kvselect.testing or in its rule's module).
    assert testing.__all__ == names + list(testing.SHARED)
    for dotted, name in zip(claimed, names):
        assert getattr(testing, name) is rules.resolve(dotted), dotted
        assert callable(getattr(testing, name)), dotted
    # Every assertion written in kvselect.testing belongs to a rule.
    assert _defined_in(testing, "assert_") <= set(names)
    generators = [r.cases for r in rules.RULES if r.cases is not None]
    functions = [f for r in rules.RULES for f in r.case_functions]
    case_names = [d.rpartition(".")[2] for d in generators + functions]
    assert len(case_names) == len(set(case_names)), "a case generator in two rules"
    assert all(n.startswith("all_") and n.endswith("_cases") for n in case_names[: len(generators)])
    derived = [
        d.rpartition(".")[2]
        for r in rules.RULES
        for d in ((r.cases,) if r.cases is not None else ()) + r.case_functions
    ]
    assert cases.__all__ == list(cases.SHARED) + derived
    for dotted in generators + functions:
        name = dotted.rpartition(".")[2]
        assert getattr(cases, name) is rules.resolve(dotted), dotted
        assert callable(getattr(cases, name)), dotted
    # Every public generator (a function returning a Case or a list of them) written
    # in a cases module belongs to a rule (or is shared).
    on_disk = set()
    for m in pkgutil.iter_modules(cases.__path__):
        module = importlib.import_module(f"kvselect.testing.cases.{m.name}")
        on_disk |= {
            n for n in _defined_in(module) if "Case" in str(inspect.signature(getattr(module, n)).return_annotation)
        }
    assert {"all_moba_cases", "moba_ties"} <= on_disk  # the scan sees them
    assert on_disk - set(cases.SHARED) <= set(case_names), sorted(on_disk - set(cases.SHARED) - set(case_names))


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


@pytest.mark.parametrize(
    "first",
    [
        "kvselect.rules",
        "kvselect.checking",
        "kvselect.evaluate",
        "kvselect.testing",
        "kvselect.testing.cases",
        "kvselect.reference",
    ],
)
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


def test_a_rule_that_keeps_every_piece_in_its_own_module_is_exported_by_every_package(monkeypatch):
    # A rule whose twin, assertion and cases are written in its one module (as a
    # new rule's are: kvselect/rules/<rule>.py) is exported by kvselect.reference,
    # kvselect.testing and kvselect.testing.cases from the registry alone: nothing
    # is added to those packages. Here the module is a stand-in in sys.modules.
    import sys
    import types

    home = types.ModuleType("kvselect_stand_in_rule")

    def stand_in_twin(x):
        return x

    def assert_stand_in(rows):
        return rows

    def all_stand_in_cases(seed=0):
        return []

    def stand_in_short(seed=0):
        return None

    for fn in (stand_in_twin, assert_stand_in, all_stand_in_cases, stand_in_short):
        setattr(home, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, home.__name__, home)
    stand_in = rules.Rule(
        "stand_in",
        "Stand-in",
        reference=home.__name__,
        twins=("stand_in_twin",),
        assertions=(f"{home.__name__}.assert_stand_in",),
        cases=f"{home.__name__}.all_stand_in_cases",
        case_functions=(f"{home.__name__}.stand_in_short",),
    )
    for package in (reference, testing, cases):  # not there before
        assert not hasattr(package, "stand_in_twin") and not hasattr(package, "assert_stand_in")
    monkeypatch.setattr(rules, "RULES", rules.RULES + (stand_in,))
    assert reference.stand_in_twin is stand_in_twin and reference.__all__[-1] == "stand_in_twin"
    assert testing.assert_stand_in is assert_stand_in and testing.__all__[-2:] == ["assert_stand_in", "CheckFailure"]
    assert cases.all_stand_in_cases is all_stand_in_cases and cases.stand_in_short is stand_in_short
    assert cases.__all__[-2:] == ["all_stand_in_cases", "stand_in_short"]
    from kvselect.testing import assert_stand_in as imported

    assert imported is assert_stand_in
    namespace = {}
    exec("from kvselect.testing.cases import *", namespace)
    assert namespace["stand_in_short"] is stand_in_short and namespace["Case"] is cases.Case
    assert "assert_stand_in" in dir(testing)
    # A name no rule exports is still an AttributeError, naming the package.
    with pytest.raises(AttributeError, match="'kvselect.testing' has no attribute 'assert_nothing'"):
        testing.assert_nothing  # noqa: B018
    # Two rules' pieces under one name are refused, naming both.
    twin = rules.Rule("stand_in_2", "Stand-in 2", reference="kvselect.reference.moba", twins=("stand_in_twin",))
    monkeypatch.setattr(rules, "RULES", rules.RULES + (twin,))
    with pytest.raises(ValueError, match="kvselect.reference.stand_in_twin: both kvselect_stand_in_rule"):
        reference.__all__  # noqa: B018
    monkeypatch.undo()
    assert not hasattr(testing, "assert_stand_in") and "assert_stand_in" not in testing.__all__
