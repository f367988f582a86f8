"""Waits with a time limit: `asyncio.timeout`, never `asyncio.wait_for` (jobpool.event_loop
says why: on Python 3.11 `wait_for` can lose a cancellation)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "jobpool"


def test_no_module_of_jobpool_calls_asyncio_wait_for() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "wait_for"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []
