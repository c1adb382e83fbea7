"""docs/testing-a-kernel.md shows the guide's pytest file as it is committed."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_guides_complete_pytest_file_is_the_committed_one():
    doc = (ROOT / "docs" / "testing-a-kernel.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert (ROOT / "tests" / "python" / "test_guide_kernel.py").read_text() in blocks
