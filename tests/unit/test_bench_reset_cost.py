"""The session-reset benchmark's reading of the worker's reset and its DO block
(bench/reset_cost.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from reset_cost import do_block, split_reset


def test_the_reset_splits_into_what_undoes_and_the_check_of_prepared_statements() -> None:
    undo, check = split_reset()
    assert undo[0] == "RESET ALL" and "SELECT pg_advisory_unlock_all()" in undo
    assert "pg_prepared_statements" in check and not check.endswith(";")
    assert not any(";" in statement for statement in undo)


def test_the_do_block_runs_selects_as_perform_and_close_through_execute() -> None:
    block = do_block(["RESET ALL", "CLOSE ALL", "SELECT pg_advisory_unlock_all()"])
    assert block == ("DO $reset$BEGIN RESET ALL; EXECUTE 'CLOSE ALL'; "
                     "PERFORM pg_advisory_unlock_all(); END$reset$")
