"""The session-reset benchmark's reading of the worker's reset and its DO block
(bench/reset_cost.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from reset_cost import do_block, split_reset

from jobpool.db.connect import RESET_SESSION
from jobpool.sql import migrations


def test_the_text_reset_undoes_what_the_workers_reset_undoes() -> None:
    """Its statements are those of `mdm.aa_reset_session` (and the role, reset before it is
    called): the text variants price the same work."""
    undo, check = split_reset()
    function = [text for _, _, text in migrations()
                if "FUNCTION mdm.aa_reset_session()" in text][-1]  # as the schema has it now
    body = function[function.index("FUNCTION mdm.aa_reset_session()"):]
    body = body[:body.index("$$;")]
    assert undo[0] == "SET SESSION AUTHORIZATION DEFAULT" and undo[0] in RESET_SESSION.text
    for statement in undo[1:]:
        assert statement.removeprefix("SELECT ").replace("pg_advisory", "pg_catalog."
                                                         "pg_advisory") in body, statement
    assert "pg_prepared_statements" in check and not check.endswith(";")
    assert not any(";" in statement for statement in undo)


def test_the_do_block_runs_selects_as_perform_and_close_through_execute() -> None:
    block = do_block(["RESET ALL", "CLOSE ALL", "SELECT pg_advisory_unlock_all()"])
    assert block == ("DO $reset$BEGIN RESET ALL; EXECUTE 'CLOSE ALL'; "
                     "PERFORM pg_advisory_unlock_all(); END$reset$")
