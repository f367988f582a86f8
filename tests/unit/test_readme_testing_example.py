"""The "Testing your kinds" example of docs/writing-kinds.md is the suite's
test_testing_example.py, verbatim, so that the example shown is one that runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_documented_example_is_the_test_that_runs() -> None:
    page = (REPO / "docs" / "writing-kinds.md").read_text("utf-8")
    section = page.split("\n## Testing your kinds\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)
    example = (REPO / "tests" / "integration" / "test_testing_example.py").read_text("utf-8")
    assert blocks == [example]
