"""The layout of the Python bindings, ``src/python/`` (issue 37): no file over
600 lines, no cycle among its modules, and a folder's ``mod.rs`` only
registers the files beside it.

The rule ``src/python/mod.rs`` states: "No module imports one that imports
it." It holds while every dependency points one way: a folder's ``mod.rs``
names each of its files (it declares and registers them), so a file that
reaches back into its own ``mod.rs`` — or any module that uses one that uses
it — makes a cycle. This test reads the Rust source itself (the modules are
files; no Rust toolchain is needed, so it runs against the installed wheel
too) and models the graph precisely:

- **Nodes** are the module files: ``src/python/mod.rs`` is ``python``,
  ``src/python/args/mod.rs`` is ``python::args``, ``src/python/args/counts.rs``
  is ``python::args::counts``. An inline ``mod name { ... }`` (a test module)
  belongs to its file's node.
- **Edge A -> B** when A's code (comments, strings and character literals
  stripped) holds a path, in a ``use`` (braces expanded, ``as`` dropped) or
  anywhere else (``super::args::In``, ``paged::infllm_select_paged``), that
  resolves to B. A path is resolved from its head: ``crate::python`` is the
  root, ``self`` is A, each ``super`` one level up, and a name A declares with
  ``mod name;`` (or lists in ``bindings!(...)``) its child; then it is followed down as long as it names module
  files, and its target is the last module file it reaches (so
  ``crate::python::args::Obj`` is ``python::args`` and
  ``super::config::config`` is ``...::config``). A path with another head (a
  crate, a core module, an imported item) is not an edge, nor is a
  visibility restriction (``pub(in crate::python)``).
- **Edge A -> B** also when A declares ``mod B;`` (or ``bindings!(..., B, ...)``,
  the macro of ``src/python/mod.rs`` that writes ``mod B;``): a module depends on the
  children it declares, so a child that uses its parent is a cycle even
  where the parent never calls it by path.

What would break it: a file that uses an item of its folder's ``mod.rs``
(``use super::config;`` where ``config`` lives in ``mod.rs``), two siblings
that use each other, a module file the resolver cannot see (``#[path]``,
refused below), or a file grown past 600 lines."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINDINGS = ROOT / "src" / "python"
MAX_LINES = 600

pytestmark = pytest.mark.skipif(not BINDINGS.is_dir(), reason="no src/python beside the tests")


def _module_files() -> dict[tuple[str, ...], pathlib.Path]:
    """``{module path: file}`` of every ``.rs`` file under ``src/python``."""
    out = {}
    for path in sorted(BINDINGS.rglob("*.rs")):
        parts = ("python",) + path.relative_to(BINDINGS).with_suffix("").parts
        if parts[-1] == "mod":
            parts = parts[:-1]
        out[parts] = path
    return out


RAW_STRING = re.compile(r'b?r(#*)"')
CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'")


def _strip(text: str) -> str:
    """The code of a Rust file: comments (doc comments too) dropped, string
    and character literals emptied (``""``, ``' '``); lifetimes (``'py``)
    kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif (m := RAW_STRING.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (m := CHAR.match(text, i)):
            i = m.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _expand_use(tree: str) -> list[str]:
    """The full paths of a ``use`` tree: ``a::{b, c::{d as e, self}}`` is
    ``a::b``, ``a::c::d``, ``a::c::self``."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+[A-Za-z_]\w*", "", tree))
    head, brace, rest = tree.partition("{")
    if not brace:
        return [tree]
    assert rest.endswith("}"), tree
    inner, parts, depth, start = rest[:-1], [], 0, 0
    for k, ch in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[start:k])
            start = k + 1
    parts.append(inner[start:])
    return [p for part in parts if part for p in _expand_use(head + part)]


def _clean(path: str) -> list[str]:
    """A path's segments, without a glob or a trailing ``self``."""
    segs = path.split("::")
    while segs and segs[-1] in ("*", "self", ""):
        segs.pop()
    return segs


USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:[A-Za-z_]\w*::)+[A-Za-z_]\w*)")
MOD_DECL = re.compile(r"(?:pub(?:\([^)]*\))?\s+)?\bmod\s+([A-Za-z_]\w*)\s*;")
# ``pub(in crate::python)`` limits who may see an item; it uses nothing.
VISIBILITY = re.compile(r"\bpub\s*\(\s*in\s+[^)]*\)")
INLINE_MOD = re.compile(r"\bmod\s+([A-Za-z_]\w*)\s*\{")
# ``bindings!(a, b, c)`` (src/python/mod.rs) declares ``mod a; mod b; mod c;``.
BINDINGS_LIST = re.compile(r"\bbindings!\s*\(([^)]*)\)")


def _declared(code: str) -> list[str]:
    """The child modules ``code`` declares: ``mod name;`` and the names of a
    ``bindings!(...)`` list."""
    listed = [n.strip() for m in BINDINGS_LIST.finditer(code) for n in m.group(1).split(",")]
    return MOD_DECL.findall(code) + [n for n in listed if n]


def _split_inline(code: str) -> tuple[str, list[tuple[str, str]]]:
    """The code outside inline ``mod name { ... }`` blocks, and each block's
    ``(name, body)``."""
    bodies, outside, i = [], [], 0
    while m := INLINE_MOD.search(code, i):
        outside.append(code[i : m.start()])
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        bodies.append((m.group(1), code[m.end() : j - 1]))
        i = j
    outside.append(code[i:])
    return "".join(outside), bodies


def _targets(code: str, here: tuple[str, ...], modules) -> set[tuple[str, ...]]:
    """The modules the code of module ``here`` (a file's, or an inline
    module's inside it) names."""
    code = VISIBILITY.sub("pub", code)
    outside, inline = _split_inline(code)
    found = set()
    for name, body in inline:
        found |= _targets(body, here + (name,), modules)
    children = set(_declared(outside))
    paths = [_clean(p) for m in USE.finditer(outside) for p in _expand_use(m.group(1).removeprefix("::"))]
    bare = USE.sub(" ", outside)
    paths += [p.split("::") for p in PATH.findall(bare)]
    paths += [[c] for c in children]
    for segs in paths:
        if not segs:
            continue
        if segs[0] == "crate":
            if len(segs) < 2 or segs[1] != "python":
                continue
            base, rest = ["python"], segs[2:]
        elif segs[0] == "self":
            base, rest = list(here), segs[1:]
        elif segs[0] == "super":
            base, rest = list(here), segs
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        elif segs[0] in children:
            base, rest = list(here), segs
        else:
            continue
        for seg in rest:
            if tuple(base + [seg]) not in modules:
                break
            base.append(seg)
        while base and tuple(base) not in modules:
            base.pop()
        if base:
            found.add(tuple(base))
    return found


def _graph() -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    modules = _module_files()
    graph = {}
    for mod, path in modules.items():
        graph[mod] = _targets(_strip(path.read_text()), mod, modules) - {mod}
    return graph


def _cycles(graph) -> list[list[tuple[str, ...]]]:
    """One cycle through each back edge a depth-first search meets."""
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def _name(mod: tuple[str, ...]) -> str:
    return "::".join(mod)


def test_no_binding_file_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _module_files().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines (split by entry-point family): {long}"


def test_the_binding_modules_use_one_another_without_a_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles in src/python:\n" + "\n".join(" -> ".join(map(_name, c)) for c in cycles)


def test_a_folders_mod_rs_only_registers():
    """A folder's ``mod.rs`` declares its files, re-exports from them and
    defines ``register`` — no entry point, type, constant or helper of its own
    (``src/python/mod.rs`` defines the module's ``_core`` likewise)."""
    offenders = {}
    for mod, path in _module_files().items():
        if path.name != "mod.rs":
            continue
        code, _ = _split_inline(_strip(path.read_text()))
        items = re.findall(
            r"(?<![\w'])(fn|struct|enum|union|trait|impl|const|static|type|macro_rules!)(?!\w)\s*([A-Za-z_]\w*)?",
            code,
        )
        # src/python/mod.rs also defines the module's ``_core`` and the ``bindings!``
        # macro that declares and registers its binding modules.
        allowed = {("fn", "register")} | (
            {("fn", "_core"), ("macro_rules!", "bindings")} if mod == ("python",) else set()
        )
        extra = sorted({f"{k} {n}".strip() for k, n in items if (k, n) not in allowed})
        if extra:
            offenders[str(path.relative_to(ROOT))] = extra
    assert not offenders, f"a folder's mod.rs only registers; move these into a file beside it: {offenders}"


def test_every_module_file_is_a_node():
    """The resolver sees every module: no ``#[path]`` attribute, and every
    file is declared by its parent's ``mod name;``."""
    modules = _module_files()
    for mod, path in modules.items():
        assert "#[path" not in _strip(path.read_text()), f"{path}: #[path] hides a module from this test"
        if len(mod) > 1:
            parent = _strip(modules[mod[:-1]].read_text())
            assert mod[-1] in _declared(parent), f"{_name(mod)} is not declared by {_name(mod[:-1])}"


# The resolver itself, on the shapes the bindings use: a test that can pass
# only because it sees no edge at all would guard nothing.


def test_the_resolver_finds_the_edges_a_cycle_is_made_of():
    modules = {("python",): None, ("python", "a"): None, ("python", "a", "x"): None, ("python", "b"): None}
    parent = _strip("mod x;\nuse super::b::{self, Thing as T};\nfn f() { x::g(); crate::keys::h(); }")
    assert _targets(parent, ("python", "a"), modules) == {("python", "a", "x"), ("python", "b")}
    child = _strip(
        '//! [`super::b`]\nuse super::helper; // a fn in a/mod.rs\nconst S: &str = "crate::python::b";\n'
        "pub(in crate::python) fn f() -> char { '\"' }"
    )
    assert _targets(child, ("python", "a", "x"), modules) == {("python", "a")}
    graph = {("python", "a"): {("python", "a", "x")}, ("python", "a", "x"): {("python", "a")}}
    assert _cycles(graph) == [[("python", "a"), ("python", "a", "x"), ("python", "a")]]
    tests = _strip("#[cfg(test)]\nmod tests { use super::*; use crate::python::b::Y; }")
    assert _targets(tests, ("python", "a", "x"), modules) == {("python", "a", "x"), ("python", "b")}
