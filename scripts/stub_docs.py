"""Write the docstrings of ``python/kvselect/_core.pyi`` from the live module.

The Rust ``///`` text of each binding is the one source of a native
function's docstring (it is what ``help()`` shows); the stub's docstrings
are generated from it, so an editor that reads the stub shows the same text
and the two cannot disagree. The stub's signatures and types stay written
by hand (``python -m mypy.stubtest kvselect._core`` checks them).

Usage (from the repository root, with kvselect built)::

    python scripts/stub_docs.py           # rewrite the stub's docstrings
    python scripts/stub_docs.py --check   # exit 1 if the stub is not what it would write

Every function, class and method of the stub whose runtime object has a
docstring gets that docstring, verbatim (``inspect.cleandoc``); one without a
runtime docstring keeps no docstring; dunder methods are left as they are
(their runtime docstrings are Python's generic ones). A stub definition without a docstring
whose runtime object has one is an error (add any docstring and rerun).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "python" / "kvselect" / "_core.pyi"


def _runtime_doc(obj: Any) -> Optional[str]:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc)


def _literal(doc: str, indent: str) -> str:
    """``doc`` as a triple-quoted literal at ``indent`` (raw when it holds a
    backslash, so the text reads back unchanged)."""
    prefix = "r" if "\\" in doc else ""
    lines = doc.split("\n")
    if len(lines) == 1:
        return f'{indent}{prefix}"""{doc}"""\n'
    body = "\n".join((indent + line) if line else "" for line in lines[1:])
    return f'{indent}{prefix}"""{lines[0]}\n{body}\n{indent}"""\n'


def _edits(tree: ast.Module, module: Any) -> Tuple[List[Tuple[int, int, str]], List[str]]:
    """``(first_line, last_line, replacement)`` edits (1-based, inclusive)
    and the errors."""
    edits: List[Tuple[int, int, str]] = []
    errors: List[str] = []

    def visit(body: List[ast.stmt], owner: Any, where: str) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("__"):
                continue  # dunders' runtime docstrings are Python's generic ones
            obj = getattr(owner, node.name, None)
            name = f"{where}{node.name}"
            if obj is None:
                continue  # not at run time (a stub-only alias): stubtest's concern
            doc = _runtime_doc(obj)
            first = node.body[0]
            has = (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            )
            indent = " " * (node.col_offset + 4)
            if has:
                assert first.end_lineno is not None
                text = "" if doc is None else _literal(doc, indent)
                if doc is None and len(node.body) == 1:
                    text = f"{indent}...\n"  # the body cannot be empty
                edits.append((first.lineno, first.end_lineno, text))
            elif doc is not None:
                errors.append(f"{name}: the stub has no docstring to replace (add one and rerun)")
            if isinstance(node, ast.ClassDef):
                visit(node.body, obj, f"{name}.")

    visit(tree.body, module, "")
    return edits, errors


def render(source: str, module: Any) -> Tuple[str, List[str]]:
    """The stub ``source`` with every docstring the live ``module``'s."""
    edits, errors = _edits(ast.parse(source), module)
    lines = source.splitlines(keepends=True)
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1 : last] = [text] if text else []
    return "".join(lines), errors


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the stub would change")
    args = parser.parse_args(argv)
    import kvselect._core as core

    source = STUB.read_text()
    new, errors = render(source, core)
    for e in errors:
        print(f"stub_docs: {e}", file=sys.stderr)
    if errors:
        return 2
    if args.check:
        if new != source:
            print(f"{STUB.relative_to(ROOT)} is stale: run python scripts/stub_docs.py", file=sys.stderr)
            return 1
        return 0
    STUB.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
