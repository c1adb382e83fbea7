"""Every Python block of README.md and docs/*.md runs as written, in order
within its file (one namespace per file, as a reader pastes them), from a
scratch working directory. A block whose first line is ``# needs: <what>``
(torch, a GPU, a model download) is skipped, and says so; docs/api.md is
generated and its blocks are signatures, not programs."""

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


@pytest.mark.parametrize("path", [p for p in FILES if blocks(p)], ids=lambda p: p.name)
def test_every_python_block_runs_as_written(path, tmp_path, monkeypatch):
    pytest.importorskip("ml_dtypes")  # the examples show bfloat16 / fp8 keys as ml_dtypes arrays
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for i, code in enumerate(blocks(path)):
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        if first.startswith("# needs:"):
            continue
        try:
            exec(compile(code, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as e:  # the block's own failure, named by file and block
            pytest.fail(f"{path.name}, Python block {i} failed: {type(e).__name__}: {e}")


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
