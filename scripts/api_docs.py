"""Write docs/api.md, the API reference, from the live kvselect module.

The docstrings are the one source: this script reads them (and the
signatures) from the imported package and writes them verbatim, grouped by
concept, with a table of contents. Nothing is typed by hand here but the
grouping of the names no rule owns and the section titles.

Usage (from the repository root, with kvselect importable)::

    python scripts/api_docs.py            # write docs/api.md
    python scripts/api_docs.py PATH       # write PATH instead
    python scripts/api_docs.py --check    # exit 1 if docs/api.md is not what it would write
    python scripts/api_docs.py --stdout   # print to standard output

What is documented:

- every name of ``kvselect.__all__`` (the native core), in the concept group
  of :data:`GROUPS` (a rule's group from its registry entry, ``kvselect.rules``); a name missing from them lands in a section
  "Not yet grouped" (``tests/python/test_api_docs.py`` refuses that);
- the public functions and classes of the pure-Python modules in
  :data:`MODULES`: the module's ``__all__`` if it has one, else every name
  not starting with ``_`` whose object is a function or class defined in that
  module (or a submodule of it), in source order;
- for a class, its public methods, static methods and properties defined on
  the class itself (not inherited).

The output is deterministic: fixed or source order, no timestamps, no
addresses, no paths of this machine. ``kvselect.__version__`` is named but its
value is not written, so a version bump does not make the file stale.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import kvselect
from kvselect.rules import RULES, SHARED_API

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "docs" / "api.md"
COMMAND = "python scripts/api_docs.py"

# kvselect's own names (all native, from kvselect._core), by concept: each
# rule's section is its registry entry's (kvselect.rules: title and api), in
# the rules' order (a rule without native names has none), then the names no
# one rule owns.
GROUPS: List[Tuple[str, List[str]]] = [(rule.title, list(rule.api)) for rule in RULES if rule.api] + [
    (title, list(names)) for title, names in SHARED_API
]

# The pure-Python modules whose public names are part of the documented API,
# with their section titles. (kvselect.reference is the NumPy twin of the
# native functions above, same signatures; kvselect.cli is documented by
# ``kvselect --help``.)
MODULES: List[Tuple[str, str]] = [
    ("kvselect.checking", "Checking a kernel: dumps and reports"),
    ("kvselect.testing", "Testing a kernel: assertions"),
    ("kvselect.testing.cases", "Testing a kernel: the inputs that break kernels"),
    ("kvselect.evaluate", "Evaluating policies"),
    ("kvselect.workloads", "Workloads"),
    ("kvselect.corpus", "A corpus of dumps, serially or on Dask"),
    ("kvselect.checking.files", "Where dumps live: local paths and fsspec URLs"),
    ("kvselect.dump_hf", "Dumping a Hugging Face model"),
    ("kvselect.rules", "The rules' registry"),
]

UNGROUPED = "Not yet grouped"

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _slug(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to '-'."""
    text = title.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _fenced(text: str) -> List[str]:
    """``text`` verbatim in a fenced block whose fence no line can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", *text.splitlines(), fence]


def _doc(obj: Any) -> Optional[str]:
    """The object's own docstring, indentation cleaned, or None.

    ``__doc__`` is read from the object itself, never inherited from a base
    class (a class without its own docstring has ``__doc__`` None in its own
    ``__dict__``)."""
    if inspect.isclass(obj):
        raw = obj.__dict__.get("__doc__")
    else:
        raw = getattr(obj, "__doc__", None)
    if not isinstance(raw, str) or not raw.strip():
        return None
    return inspect.cleandoc(raw)


class _Raw:
    """An annotation written as its source text (``from __future__ import
    annotations`` leaves strings, which ``inspect`` would print quoted)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _unquoted(sig: inspect.Signature) -> inspect.Signature:
    def raw(annotation: Any) -> Any:
        return _Raw(annotation) if isinstance(annotation, str) else annotation

    params = [p.replace(annotation=raw(p.annotation)) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=raw(sig.return_annotation))


def signature(obj: Any, name: str) -> Optional[str]:
    """``name(...)`` from ``inspect.signature``, else the native
    ``__text_signature__``, else None (an exception, a constant)."""
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return None
    try:
        sig = inspect.signature(obj)
        params = list(sig.parameters.values())
        if params and params[0].name in ("self", "cls"):
            sig = sig.replace(parameters=params[1:])  # a method, as the user calls it
        text = str(_unquoted(sig))
    except (TypeError, ValueError):
        raw = getattr(obj, "__text_signature__", None)
        if not raw:
            return None
        text = raw.replace("$self, ", "").replace("($self)", "()")
        text = text.replace("$cls, ", "").replace("($cls)", "()")
    return name + _ADDRESS.sub("", text)


def _members(cls: type) -> List[Tuple[str, str, Any]]:
    """(kind, name, object) of the public members defined on ``cls`` itself,
    sorted by name: methods, static and class methods, properties."""
    found = []
    for attr in sorted(cls.__dict__):
        if attr.startswith("_"):
            continue
        static = inspect.getattr_static(cls, attr)
        if isinstance(static, (staticmethod, classmethod)):
            kind = "static method" if isinstance(static, staticmethod) else "class method"
            found.append((kind, attr, getattr(cls, attr)))
        elif isinstance(static, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
            found.append(("property", attr, static))
        elif callable(static):
            found.append(("method", attr, getattr(cls, attr)))
    return found


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj):
        return "function"
    return "constant"


def _entry(qualname: str, obj: Any) -> List[str]:
    """The markdown of one public name (and, for a class, its members)."""
    kind = _kind(obj)
    lines = [f"### `{qualname}`", ""]
    if kind == "exception":
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        lines += [f"*exception* (subclass of `{bases}`)", ""]
    elif kind == "constant":
        if qualname.endswith("__version__"):
            lines += ["*constant*: the package version, a string.", ""]
        else:
            lines += [f"*constant* `{qualname} = {obj!r}`", ""]
    sig = signature(obj, qualname.rsplit(".", 1)[-1]) if kind in ("class", "function") else None
    if sig is not None:
        lines += ["```python", sig, "```", ""]
    doc = _doc(obj) if kind != "constant" else None
    if doc is not None:
        lines += [*_fenced(doc), ""]
    elif kind != "constant":
        lines += ["*(no docstring)*", ""]
    if kind == "class":
        for member_kind, attr, member in _members(obj):
            lines += [f"#### `{qualname}.{attr}` ({member_kind})", ""]
            if member_kind != "property":
                member_sig = signature(member, attr)
                if member_sig is not None:
                    lines += ["```python", member_sig, "```", ""]
            member_doc = _doc(member)
            lines += [*_fenced(member_doc), ""] if member_doc else ["*(no docstring)*", ""]
    return lines


def module_public_names(module: types.ModuleType) -> List[str]:
    """The module's ``__all__``, else its own public functions and classes in
    source order (objects defined in it or in a submodule of it)."""
    explicit = getattr(module, "__all__", None)
    if explicit is not None:
        return list(explicit)
    own = []
    for name, obj in vars(module).items():
        if name.startswith("_"):
            continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        home = getattr(obj, "__module__", "") or ""
        if home == module.__name__ or home.startswith(module.__name__ + "."):
            own.append(name)
    return own


def sections() -> List[Tuple[str, Optional[str], List[Tuple[str, Any]]]]:
    """(title, module docstring or None, [(qualified name, object)]) in
    output order."""
    out: List[Tuple[str, Optional[str], List[Tuple[str, Any]]]] = []
    grouped = set()
    for title, names in GROUPS:
        entries = [(f"kvselect.{n}", getattr(kvselect, n)) for n in names]
        grouped.update(names)
        out.append((title, None, entries))
    # A native name no rule and no shared group claims (kvselect.__all__ is the
    # registry's, so such a name is outside it) still lands in the file.
    native = sorted(n for n in dir(kvselect._core) if not n.startswith("_") and n not in kvselect.__all__)
    rest = [n for n in [*kvselect.__all__, *native] if n not in grouped]
    if rest:
        out.append((UNGROUPED, None, [(f"kvselect.{n}", getattr(kvselect, n)) for n in rest]))
    import importlib

    for module_name, title in MODULES:
        module = importlib.import_module(module_name)
        entries = [(f"{module_name}.{n}", getattr(module, n)) for n in module_public_names(module)]
        out.append((f"{title} (`{module_name}`)", _doc(module), entries))
    return out


def render() -> str:
    """The whole of docs/api.md, as this script writes it now."""
    parts = sections()
    lines = [
        "# kvselect API reference",
        "",
        f"Generated from the live module's docstrings by `{COMMAND}`; do not edit by hand",
        "(`tests/python/test_api_docs.py` fails when this file is not what the script writes).",
        "Every public name of `kvselect` and of its documented submodules, grouped by concept,",
        "each with its signature and its docstring verbatim.",
        "",
        "## Contents",
        "",
    ]
    for title, _, entries in parts:
        lines.append(f"- [{title}](#{_slug(title)})")
        for qualname, _obj in entries:
            lines.append(f"  - [`{qualname}`](#{_slug(qualname)})")
    lines += ["", "## The package (`kvselect`)", ""]
    package_doc = _doc(kvselect)
    if package_doc:
        lines += [*_fenced(package_doc), ""]
    for title, module_doc, entries in parts:
        lines += [f"## {title}", ""]
        if module_doc:
            lines += [*_fenced(module_doc), ""]
        for qualname, obj in entries:
            lines += _entry(qualname, obj)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", nargs="?", default=str(DEFAULT_OUTPUT), help="where to write (default docs/api.md)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if PATH is not what would be written")
    mode.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = parser.parse_args(argv)
    text = render()
    target = Path(args.path)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current != text:
            print(f"{target} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
