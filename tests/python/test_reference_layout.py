"""The layout of ``kvselect.reference``: one module per concept, each short,
imported bottom up (no cycle), none of them reaching for the native module."""

import ast
import pathlib

import kvselect.reference as ref

PACKAGE = pathlib.Path(ref.__file__).parent
# Bottom up: a module may import only modules before it.
ORDER = [
    "_args",
    "keys",
    "witness",
    "block_sparse",
    "attn",
    "sparse_attn",
    "indexer",
    "compressed",
    "quest",
    "infllm",
    "vslash",
    "moba",
    "nsa",
    "metrics",
    "check",
    "eviction",
]


def _sibling_imports(path: pathlib.Path) -> set:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 0 and (node.module or "").startswith("kvselect"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("kvselect"))
    return found


def test_the_package_holds_exactly_the_concept_modules():
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted(ORDER + ["__init__"])


def test_no_reference_module_is_over_a_thousand_lines():
    for path in PACKAGE.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 1000, path.name


def test_each_module_imports_only_modules_below_it_and_never_the_native_one():
    for i, name in enumerate(ORDER):
        imports = _sibling_imports(PACKAGE / f"{name}.py")
        assert imports <= set(ORDER[:i]), (name, imports - set(ORDER[:i]))


def test_every_name_the_package_exports_is_the_object_its_module_defines():
    import importlib

    for name in ORDER:
        module = importlib.import_module(f"kvselect.reference.{name}")
        for attr, value in vars(module).items():
            if hasattr(ref, attr) and getattr(value, "__module__", None) == module.__name__:
                assert getattr(ref, attr) is value, (name, attr)
    assert callable(ref.attention)  # the function, not the attn module
    assert all(hasattr(ref, n) for n in ref.__all__)
