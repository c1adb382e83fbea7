"""The layout of the Python package: ``ls python/kvselect`` shows the
concepts ``ls src/`` shows, no module is over a thousand lines, the
module-level imports form no cycle, and no module reaches for another
module's private names (a private module, ``_common.py``, ``_args.py``,
``_types.py``, is the place for what several modules share)."""

import ast
import pathlib

import kvselect

PACKAGE = pathlib.Path(kvselect.__file__).parent


def _modules():
    """``{dotted name: path}`` of every Python module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level_imports(module: str, path: pathlib.Path):
    """``(imported module, names)`` of the imports run when the module is
    imported (its top level; imports inside functions run later)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            yield _resolve(module, path, node), [a.name for a in node.names]


def test_the_package_shows_its_concepts_as_modules_and_folders():
    assert sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith((".", "__pycache__", "_core"))) == [
        "__init__.py",
        "__main__.py",
        "_exports.py",
        "checking",
        "cli",
        "corpus",
        "data",
        "dump_hf.py",
        "evaluate",
        "py.typed",
        "reference",
        "rules",
        "testing",
        "workloads",
    ]


def test_no_module_is_over_a_thousand_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 1000}
    assert long == {}


def test_the_module_level_imports_form_no_cycle():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target, names in _top_level_imports(name, path):
            if target in modules:
                deps.add(target)
            deps.update(f"{target}.{n}" for n in names if f"{target}.{n}" in modules)
        graph[name] = deps - {name}
    # A package's __init__ importing its own submodules is how a package is
    # built; a submodule importing its own package's __init__ back would close
    # a cycle, and is caught below like any other edge.
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node) :] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for dep in sorted(graph[node]):
            visit(dep)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    assert cycles == []


def test_no_module_imports_another_modules_private_names():
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                target = _resolve(name, path, node)
                if target.split(".")[-1].startswith("_"):
                    continue  # a private module: shared within its package
                found += [
                    f"{name}: {target}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert found == []
