"""Which PostgreSQL binaries the suite's clusters run: the folder a run asks for, or none."""

from __future__ import annotations

from pathlib import Path

import pytest
from private_postgres import find_bin


def _install(folder: Path, *tools: str) -> Path:
    folder.mkdir(parents=True)
    for tool in tools:
        (folder / tool).write_text("#!/bin/sh\n")
    return folder


def test_the_folder_asked_for_is_the_one_used(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _install(tmp_path / "14" / "bin", "initdb", "pg_ctl", "postgres")
    monkeypatch.setenv("JOBPOOL_TEST_PG_BIN", str(asked))
    assert find_bin() == asked


def test_a_folder_asked_for_without_the_tools_gives_none_not_another_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Falling back to the machine's binaries would run the suite on another major version
    than the run asked for, and say nothing."""
    monkeypatch.setenv("JOBPOOL_TEST_PG_BIN", str(_install(tmp_path / "bin", "postgres")))
    assert find_bin() is None
