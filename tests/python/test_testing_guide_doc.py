"""docs/testing-a-kernel.md shows the guide's pytest files as they are committed,
and ``kvselect.testing.cases`` is reachable as the guide writes it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def python_blocks(doc: str) -> list:
    return re.findall(r"^```python\n(.*?)^```", doc, flags=re.S | re.M)


@pytest.mark.parametrize("name", ["test_guide_kernel.py", "test_triton_example.py"])
def test_the_guides_complete_pytest_files_are_the_committed_ones(name):
    doc = (ROOT / "docs" / "testing-a-kernel.md").read_text()
    committed = (ROOT / "tests" / "python" / name).read_text()
    assert committed in python_blocks(doc), f"docs/testing-a-kernel.md does not show {name} as committed"
    assert f"`tests/python/{name}`" in doc, f"docs/testing-a-kernel.md does not name {name}"


def test_the_cases_are_an_attribute_after_import_kvselect_testing():
    # A fresh interpreter: in this one, other tests have imported the subpackage already.
    code = "import kvselect.testing\nprint(kvselect.testing.cases.all_topk_cases.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "all_topk_cases"
