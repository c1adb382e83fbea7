"""Every Python block of README.md and docs/*.md runs as written, in order
within its file (one namespace per file, as a reader pastes them), from a
scratch working directory. A block whose first line is ``# needs: <what>``
says what it needs beyond kvselect's test dependencies: modules (``torch,
triton``) or things no import provides (``a downloaded model``). It runs where
every need is a module that imports, and is skipped otherwise; docs/api.md is
generated and its blocks are signatures, not programs."""

import importlib
import linecache
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "api.md")
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def blocks(path: pathlib.Path):
    return [m.group(1) for m in FENCE.finditer(path.read_text())]


def test_the_readme_and_the_guides_have_python_examples():
    counted = {p.name: len(blocks(p)) for p in FILES}
    assert counted["README.md"] >= 5
    for guide in ("checking-a-kernel.md", "evaluating-policies.md", "engine-caches.md", "indexer.md"):
        assert counted.get(guide, 0) >= 1, guide


NEEDS = re.compile(r"#\s*needs:\s*(.*)")
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def unmet_needs(code: str) -> list:
    """The needs of a block's ``# needs:`` line (its first line) that are not
    met here, in order: each need (the line split at commas and "and") is met
    when it is a module name that imports; anything else (a GPU, "the engine's
    kernel", a download) is never met. A block without the line needs nothing."""
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    m = NEEDS.fullmatch(first.strip())
    if m is None:
        return []
    unmet = []
    for need in (n.strip() for n in re.split(r",|\band\b", m.group(1))):
        if not need:
            continue
        if MODULE.fullmatch(need):
            try:
                importlib.import_module(need)
                continue
            except ImportError:
                pass
        unmet.append(need)
    return unmet


def run_blocks(name: str, codes: list, namespace: dict) -> tuple:
    """Run ``codes`` in order in ``namespace``, skipping each block with an
    unmet need; return (run, skipped) block indices. Each block's source is
    registered with linecache under its name (``README.md[block 3]``), as a
    file's would be, so that code that reads its own source works as in a
    file (``inspect.getsource``: ``@triton.jit`` reads its kernel's)."""
    run, skipped = [], []
    for i, code in enumerate(codes):
        if unmet_needs(code):
            skipped.append(i)
            continue
        filename = f"{name}[block {i}]"
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
        try:
            exec(compile(code, filename, "exec"), namespace)
        except Exception as e:  # the block's own failure, named by file and block
            pytest.fail(f"{name}, Python block {i} failed: {type(e).__name__}: {e}")
        run.append(i)
    return run, skipped


@pytest.mark.parametrize("path", [p for p in FILES if blocks(p)], ids=lambda p: p.name)
def test_every_python_block_runs_as_written(path, tmp_path, monkeypatch):
    pytest.importorskip("ml_dtypes")  # the examples show bfloat16 / fp8 keys as ml_dtypes arrays
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    run_blocks(path.name, blocks(path), namespace)


def test_a_need_is_met_only_by_a_module_that_imports():
    assert unmet_needs("# needs: numpy\nx = 1\n") == []
    assert unmet_needs("# needs: numpy, json and os.path\n") == []
    assert unmet_needs("x = 1  # needs: nothing, not the first line\n") == []
    assert unmet_needs("# needs: numpy, kvselect_no_such_module\n") == ["kvselect_no_such_module"]
    assert unmet_needs("# needs: torch, transformers and a downloaded model\n")[-1:] == ["a downloaded model"]
    assert unmet_needs("# needs: numpy and the engine's kernel\n") == ["the engine's kernel"]
    assert unmet_needs("# needs: a GPU\n") == ["a GPU"]


def test_blocks_whose_needs_import_run_and_only_the_others_are_skipped():
    codes = [
        "# needs: numpy\nimport numpy\nran = ['numpy']\n",
        "# needs: kvselect_no_such_module\nraise RuntimeError('must not run')\n",
        "# needs: a GPU\nraise RuntimeError('must not run')\n",
        "ran.append('plain')\n",
        "# needs: json, numpy\nimport inspect\n\ndef f():\n    return 1\n\nsource = inspect.getsource(f)\n",
    ]
    namespace: dict = {}
    assert run_blocks("example.md", codes, namespace) == ([0, 3, 4], [1, 2])
    assert namespace["ran"] == ["numpy", "plain"]
    assert namespace["source"] == "def f():\n    return 1\n"  # a block's source is found, as a file's


def test_a_block_that_fails_fails_the_test_naming_it():
    with pytest.raises(pytest.fail.Exception, match=r"example.md, Python block 1 failed: ZeroDivisionError"):
        run_blocks("example.md", ["x = 1\n", "# needs: numpy\n1 / 0\n"], {})


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_relative_link_names_a_file_and_heading_that_exist(path):
    text = path.read_text()
    for target, anchor in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        dest = (path.parent / target).resolve()
        assert dest.exists(), f"{path.name} links to {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
            assert anchor[1:] in headings, f"{path.name} links to {target}{anchor}: no such heading"
    for anchor in re.findall(r"\]\((#[^)\s]+)\)", text):
        headings = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
        assert anchor[1:] in headings, f"{path.name}: no heading for {anchor}"
