"""Each native entry point's parameter list, spelled in two places, is one list.

The binding spells every entry point's parameters in its ``text_signature``
(what ``inspect.signature`` and ``help()`` read at runtime) and again in the
stub ``python/kvselect/_core.pyi`` (what type checkers and editors read).
Here both are read and compared parameter by parameter: names, order, kinds
(positional-only, positional-or-keyword, ``*args``, keyword-only,
``**kwargs``), and defaults (as Python values where both parse as literals:
``None``, numbers, strings, booleans; ``False`` is not ``0``).

What is compared: every callable the stub declares at module level, every
method and constructor (``__new__`` / ``__init__``, against the class's own
signature) of every class it declares, and, the other way, every public
native function and method the stub must then declare. Methods are compared
without their receiver (``self`` / ``cls``), whose spelling is the
language's, not the entry point's. Where the runtime has no signature
(``inspect`` cannot read one), the stub is not compared.

A second test checks the runtime spelling against the parser behind it
(pyo3's ``signature``): every name the runtime shows is accepted as the kind
it shows, the required ones are the ones a bare call reports missing, and
no more positional arguments are taken than it shows. (A parameter the
parser takes but the runtime does not show is not seen here.) A third passes
each shown default explicitly on a small valid call and asks for what
omitting it gives: where pyo3's ``signature`` says ``None`` and the body
fills in the real default, the ``text_signature`` spells that default, and
this holds it to it.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re

import numpy as np
import pytest

import kvselect._core as core

# The stub beside the imported module: python/kvselect/_core.pyi from a
# clone, the copy a wheel ships when the wheel is installed.
STUB = pathlib.Path(core.__file__).with_name("_core.pyi")

KIND = {
    inspect.Parameter.POSITIONAL_ONLY: "positional-only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional-or-keyword",
    inspect.Parameter.VAR_POSITIONAL: "*args",
    inspect.Parameter.KEYWORD_ONLY: "keyword-only",
    inspect.Parameter.VAR_KEYWORD: "**kwargs",
}

# No default at all (a required parameter), told apart from a default of None.
REQUIRED = "<required>"


class Default:
    """A default as written: its Python value when it is a literal, its spelling always."""

    def __init__(self, spelling, value=REQUIRED, literal=True):
        self.spelling = spelling
        self.value = value
        self.literal = literal

    def same(self, other):
        if self.literal and other.literal:
            # type too: False == 0 and 1 == 1.0, but they are different defaults.
            return type(self.value) is type(other.value) and self.value == other.value
        return self.spelling == other.spelling


def _stub_default(node):
    if node is None:
        return Default(REQUIRED)
    spelling = ast.unparse(node)
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return Default(spelling, literal=False)
    if value is Ellipsis:
        # `= ...` hides the default: never equal to a real one.
        return Default(spelling, literal=False)
    return Default(spelling, value)


def _runtime_default(param):
    if param.default is inspect.Parameter.empty:
        return Default(REQUIRED)
    value = param.default
    literal = value is None or type(value) in (bool, int, float, str, bytes)
    return Default(repr(value), value, literal)


def _stub_params(fn: ast.FunctionDef, drop_receiver: bool):
    """[(name, kind, Default)] of a stub `def`, in order."""
    a = fn.args
    positional = [(p, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs]
    positional += [(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, kind, _stub_default(d)) for (p, kind), d in zip(positional, defaults)]
    if a.vararg is not None:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, Default(REQUIRED)))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, inspect.Parameter.KEYWORD_ONLY, _stub_default(d)))
    if a.kwarg is not None:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, Default(REQUIRED)))
    if drop_receiver:
        assert out, f"{fn.name} has no receiver in the stub"
        out = out[1:]
    return out


def _runtime_params(sig: inspect.Signature, drop_receiver: bool):
    out = [(p.name, p.kind, _runtime_default(p)) for p in sig.parameters.values()]
    return out[1:] if drop_receiver else out


def _decorators(fn):
    return {ast.unparse(d) for d in fn.decorator_list}


def _stub_entries():
    """(label, runtime object, stub def, compare with the receiver dropped) for every stub callable."""
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    entries = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            entries.append((node.name, getattr(core, node.name, None), node, False))
        elif isinstance(node, ast.ClassDef):
            cls = getattr(core, node.name, None)
            for m in node.body:
                if not isinstance(m, ast.FunctionDef):
                    continue
                decorators = _decorators(m)
                if "property" in decorators or any(d.endswith(".setter") for d in decorators):
                    continue
                label = f"{node.name}.{m.name}"
                if m.name in ("__new__", "__init__"):
                    # The constructor's parameters are the class's signature.
                    entries.append((label, cls, m, True))
                elif cls is not None:
                    static = "staticmethod" in decorators
                    entries.append((label, getattr(cls, m.name, None), m, not static))
    return entries


def _runtime_signature(obj):
    try:
        return inspect.signature(obj)
    except (ValueError, TypeError):
        return None


def _differences(label, runtime, stub):
    """Every way the two parameter lists differ, one line each."""
    problems = []
    if [p[0] for p in runtime] != [p[0] for p in stub]:
        problems.append(
            f"{label}: parameter names or order differ:\n"
            f"    runtime: ({', '.join(p[0] for p in runtime)})\n"
            f"    stub:    ({', '.join(p[0] for p in stub)})"
        )
    stub_by_name = {p[0]: p for p in stub}
    for name, kind, default in runtime:
        if name not in stub_by_name:
            continue
        _, stub_kind, stub_default = stub_by_name[name]
        if kind != stub_kind:
            problems.append(f"{label}({name}): runtime has it {KIND[kind]}, the stub {KIND[stub_kind]}")
        if not default.same(stub_default):
            problems.append(
                f"{label}({name}): default differs: runtime spells it {default.spelling}, "
                f"the stub {stub_default.spelling}"
            )
    return problems


ENTRIES = _stub_entries()


def test_the_stub_declares_entry_points():
    # A parse that found nothing would make the comparison vacuous.
    assert len(ENTRIES) > 40, [e[0] for e in ENTRIES]
    labels = {e[0] for e in ENTRIES}
    for must in ("block_sparse_select", "indexer_topk_paged", "BlockSparseConfig.__new__", "Selector.rows"):
        assert must in labels


@pytest.mark.parametrize("label,obj,fn,drop_receiver", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_the_stub_spells_the_runtime_signature(label, obj, fn, drop_receiver):
    assert obj is not None, f"{label} is in _core.pyi but not in kvselect._core"
    sig = _runtime_signature(obj)
    if sig is None:
        if fn.name in ("__new__", "__init__"):
            pytest.fail(f"{label}: the stub declares a constructor but kvselect._core.{label} has no signature")
        pytest.skip(f"{label}: no runtime signature to compare")
    runtime = _runtime_params(sig, drop_receiver and fn.name not in ("__new__", "__init__"))
    stub = _stub_params(fn, drop_receiver)
    problems = _differences(label, runtime, stub)
    if problems:
        pytest.fail(
            "\n".join([f"{label}: _core.pyi and the runtime text_signature {sig} disagree:"] + problems),
            pytrace=False,
        )


def _native_callables():
    """label -> object for every public native function and method (with its own code, not inherited)."""
    found = {}
    for name, obj in vars(core).items():
        if name.startswith("_"):
            continue
        if inspect.isbuiltin(obj):
            found[name] = obj
        elif inspect.isclass(obj) and obj.__module__.startswith("kvselect"):
            if _runtime_signature(obj) is not None:
                found[f"{name}.__new__"] = obj
            for m, v in vars(obj).items():
                if m.startswith("_"):
                    continue
                if inspect.ismethoddescriptor(v) or isinstance(v, (staticmethod, classmethod)) or inspect.isbuiltin(v):
                    found[f"{name}.{m}"] = getattr(obj, m)
    return found


def test_every_native_entry_point_is_in_the_stub():
    declared = {e[0] for e in ENTRIES}
    declared |= {label.replace(".__init__", ".__new__") for label in declared}
    missing = sorted(set(_native_callables()) - declared)
    assert not missing, f"native callables with no declaration in _core.pyi: {missing}"


# ---------------------------------------------------------------------------
# The runtime spelling against the parser behind it
# ---------------------------------------------------------------------------


class _Unconvertible:
    """An argument no entry point converts: a call that gets past argument parsing fails converting it."""


PARSING = re.compile(
    r"unexpected keyword argument|positional-only|positional argument|missing \d+ required|"
    r"takes (no|at most|exactly|\d+) (positional )?argument|multiple values for argument"
)


# An instance of each class with methods, to call them bound.
INSTANCES = {
    "Selector": lambda: core.Selector.dense(),
    "GlobalSlots": lambda: core.GlobalSlots(np.zeros((1, 2), np.int32), np.zeros(1, np.int64), 16),
}


def _runtime_entries():
    entries = []
    for label, obj in sorted(_native_callables().items()):
        sig = _runtime_signature(obj)
        if sig is None:
            continue
        params = list(sig.parameters.values())
        if not label.endswith("__new__") and "." in label and params and params[0].name == "self":
            cls, method = label.split(".")
            if cls not in INSTANCES:
                pytest.fail(f"{label}: no instance of {cls} to call it on: add one to INSTANCES")
            obj = getattr(INSTANCES[cls](), method)
            sig = sig.replace(parameters=params[1:])
        entries.append((label, obj, sig))
    return entries


RUNTIME_ENTRIES = _runtime_entries()


def test_methods_are_checked_bound():
    labels = {e[0] for e in RUNTIME_ENTRIES}
    assert {"Selector.row", "Selector.rows", "GlobalSlots.positions", "BlockSparseConfig.__new__"} <= labels


@pytest.mark.parametrize("label,obj,sig", RUNTIME_ENTRIES, ids=[e[0] for e in RUNTIME_ENTRIES])
def test_the_runtime_signature_is_the_parser(label, obj, sig):
    params = list(sig.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        pytest.skip(f"{label} takes *args / **kwargs")
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    bad = _Unconvertible()

    def parse_error(*args, **kwargs):
        """The argument-parsing refusal of the call, or None when parsing passed."""
        try:
            obj(*args, **kwargs)
        except TypeError as e:
            return str(e) if PARSING.search(str(e)) else None
        except Exception:  # any later refusal means parsing passed
            return None
        return None

    # Every parameter shown, passed as the kind shown, is accepted.
    pos_args = [bad] * len([p for p in params if p.kind is p.POSITIONAL_ONLY])
    kw_args = {p.name: bad for p in keyword}
    e = parse_error(*pos_args, **kw_args)
    assert e is None, f"{label}{sig}: the parser refuses the names and kinds shown: {e}"
    # No more positional arguments than shown (so keyword-only is keyword-only).
    e = parse_error(*([bad] * (len(positional) + 1)))
    assert e is not None, f"{label}{sig}: the parser takes more than {len(positional)} positional arguments"
    # Required is required: a bare call names exactly the required ones.
    required = [p.name for p in params if p.default is p.empty]
    if required:
        e = parse_error()
        assert e is not None and "missing" in e, f"{label}{sig}: a bare call is not refused as missing {required}: {e}"
        named = re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", e.split("missing", 1)[1])
        shown_positional = [n for n in required if n in {p.name for p in positional}]
        # pyo3 reports the missing positional ones first (the keyword-only ones in a second refusal).
        expect = shown_positional or required
        assert named == expect, f"{label}{sig}: a bare call reports missing {named}, the signature shows {expect}"


# ---------------------------------------------------------------------------
# The defaults shown are what omitting the argument means
# ---------------------------------------------------------------------------
#
# Where the parser's default is None and the body fills in the real default
# (pyo3 `signature = (num_segments=None)` shown as `num_segments=0`), the
# shown value is a promise: passing it must give what omitting it gives. One
# small valid call per entry point whose shown defaults are not all None.


def _samples():
    rng = np.random.default_rng(37)
    q = rng.standard_normal((4, 2, 8)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    k = rng.standard_normal((20, 8)).astype(np.float32)
    pos = np.array([3, 7, 12, 19])
    pages = rng.standard_normal((3, 8, 8)).astype(np.float32)
    table = np.array([[2, 0, 1]], np.int32)
    seqs = [0, 0, 0, 0]
    block_pages = rng.standard_normal((1, 128, 8)).astype(np.float32)  # the page is the block: 128
    scores = core.indexer_scores(q, w, k, pos)
    qk = rng.standard_normal((40, 2, 8)).astype(np.float32)  # Quest: [tokens, n_kv_heads, d]
    qlo, qhi = core.quest_bounds(qk)
    qq = rng.standard_normal((4, 8)).astype(np.float32)
    qcache = rng.standard_normal((3, 16, 16)).astype(np.float32)
    return {
        "BlockSparseConfig.__new__": (core.BlockSparseConfig, ()),
        "indexer_topk": (core.indexer_topk, (q, w, k, pos, 5)),
        "indexer_topk_packed": (core.indexer_topk_packed, (q, w, k, [0, 20], seqs, pos, 5)),
        "indexer_topk_paged": (core.indexer_topk_paged, (q, w, pages, table, [20], seqs, pos, 5)),
        "indexer_scores": (core.indexer_scores, (q, w, k, pos)),
        "indexer_magnitudes": (core.indexer_magnitudes, (q, w, k, pos)),
        "block_sparse_select": (core.block_sparse_select, (q, k, pos)),
        "block_sparse_select_packed": (core.block_sparse_select_packed, (q, k, [0, 20], seqs, pos)),
        "block_sparse_select_paged": (core.block_sparse_select_paged, (q, block_pages, [[0]], [20], seqs, pos)),
        "block_scores": (core.block_scores, (q, k, pos)),
        "block_magnitudes": (core.block_magnitudes, (q, k, pos)),
        "check_topk": (core.check_topk, (scores, core.indexer_topk(q, w[::-1].copy(), k, pos, 5))),
        "positions_of_blocks": (core.positions_of_blocks, ([0, 2], 9, 20)),
        "expand_entries": (core.expand_entries, (np.array([[0, 1, -1]], np.int32), [9], 4)),
        "oracle_topk": (core.oracle_topk, (rng.random((2, 6)), [3, 5], 2)),
        "Selector.rows": (core.Selector.sink_window(1, 2).rows, ([3, 5],)),
        "quest_bounds": (core.quest_bounds, (qk,)),
        "quest_bounds_paged": (core.quest_bounds_paged, (qcache, table, [40], 2)),
        "quest_update": (core.quest_update, (qlo.copy(), qhi.copy(), qk[0], 32)),
        "quest_scores": (core.quest_scores, (qq, qlo, qhi)),
        "quest_select": (core.quest_select, (qq, qlo, qhi, 40, 2)),
        "infllm_block_scores": (core.infllm_block_scores, (qq[None], qk[:1], 40)),
        "infllm_select": (core.infllm_select, (qq[None], qk[:1], 40)),
        "infllm_block_scores_paged": (core.infllm_block_scores_paged, (qq[None], qcache, table, [40], 2)),
        "infllm_select_paged": (core.infllm_select_paged, (qq[None], qcache, table, [40], 2)),
        "vslash_select": (core.vslash_select, (rng.standard_normal((2, 40, 8)).astype(np.float32), qk, 30, 50)),
        "vslash_scores": (core.vslash_scores, (rng.standard_normal((2, 40, 8)).astype(np.float32), qk)),
        "vslash_layout_batch": (
            core.vslash_layout_batch,
            (np.array([[[3, 40]]], np.int32), np.array([[[0, 70]]], np.int32), [100], [120]),
        ),
        "moba_select": (core.moba_select, (rng.standard_normal((40, 4, 8)).astype(np.float32), qk, 3, 8)),
        "moba_select_paged": (
            core.moba_select_paged,
            (qq[None], qcache, np.array([[0, 1, 2]], np.int32), [40], 2, 3, 8),
        ),
        "nsa_block_scores": (core.nsa_block_scores, (qq[None], qk)),
        "nsa_select": (core.nsa_select, (qq[None], qk)),
        "nsa_compress_keys": (core.nsa_compress_keys, (qk,)),
        "nsa_block_scores_compressed": (core.nsa_block_scores_compressed, (qq[None], qk[:0], 40)),
        "nsa_select_compressed": (core.nsa_select_compressed, (qq[None], qk[:0], 40)),
        # 2,000 tokens: 31 compressed keys in blocks of 64, two pages of 16
        "nsa_block_scores_paged": (core.nsa_block_scores_paged, (qq[None], qcache, table, [2000], 2)),
        "nsa_select_paged": (core.nsa_select_paged, (qq[None], qcache, table, [2000], 2)),
        "snapkv_scores": (
            core.snapkv_scores,
            (rng.standard_normal((80, 2, 8)).astype(np.float32), rng.standard_normal((80, 8)).astype(np.float32)),
        ),
        "sparse_attention": (
            core.sparse_attention,
            (q, k[:, None, :], k[:, None, :4], pos, np.array([[[0, 2, 2, -1]]] * 4, np.int32)),
        ),
    }


SAMPLES = _samples()


def _same(a, b):
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    return a == b


def test_every_entry_point_with_a_real_default_has_a_sample():
    real = set()
    for label, _, sig in RUNTIME_ENTRIES:
        if any(p.default is not p.empty and p.default is not None for p in sig.parameters.values()):
            real.add(label)
    # Left: the block checker (its call needs a block-score matrix, rows and
    # visible counts built together) and the private DLPack probe.
    leave = {"check_blocks", "_dlpack_array"}
    missing = sorted(real - set(SAMPLES) - leave)
    assert not missing, f"entry points with a non-None default and no sample call: {missing}"


@pytest.mark.parametrize("label", sorted(SAMPLES))
def test_passing_the_shown_defaults_is_omitting_them(label):
    fn, args = SAMPLES[label]
    sig = _runtime_signature(fn)
    assert sig is not None, label
    shown = {p.name: p.default for p in sig.parameters.values() if p.default is not p.empty}
    omitted = fn(*args)
    for name, value in shown.items():
        passed = fn(*args, **{name: value})
        assert _same(passed, omitted), f"{label}: passing {name}={value!r} (the default shown) differs from omitting it"
