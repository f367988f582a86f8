"""The writing-job cost benchmark's reading of what a worker sends (bench/writing_job_cost.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from table import print_variants
from writing_job_cost import SETUP, WORKER, done_text

from jobpool.db.store import QueueStore
from jobpool.sql import migrations

COMPARE_AND_SET = """WHERE id = p_id AND status = 'running' AND claimed_by = p_worker_id
       AND attempts = p_attempts"""


def test_the_done_is_the_one_a_worker_sends() -> None:
    """The `done`, `worker` and `lock-done` variants price the worker's own statement."""
    store = QueueStore(cast(Any, None), worker_id=WORKER, actor="bench")
    assert done_text(41) == store.done_statement(41, 1, None)


def test_the_lock_done_keeps_the_done_s_compare_and_set_and_audit_row() -> None:
    """`lock-done` differs from `mdm.aa_job_done` by its row lock alone: the same condition
    on the job's row, the same audit row."""
    function = next(text for _, name, text in migrations()
                    if name == "done_and_reset_functions")
    done = function[function.index("FUNCTION mdm.aa_job_done"):
                    function.index("FUNCTION mdm.aa_reset_session")]
    lock_done = next(statement for statement in SETUP if "bench_lock_done" in statement)
    audit = done[done.index("INSERT INTO mdm.aa_audit_log"):done.index("RETURN true")]
    assert COMPARE_AND_SET in done and COMPARE_AND_SET in lock_done
    assert audit in lock_done
    assert "FOR NO KEY UPDATE" in lock_done and "UPDATE mdm.aa_job" not in lock_done


def test_the_variants_print_as_columns_of_medians_with_their_range(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each variant's line: per column the median of its rounds with their range, under the
    column's name."""
    print_variants(["server CPU µs", "jobs/s"], {
        "insert-alone": [(51.3, 12_868.0), (50.0, 11_796.0), (60.0, 14_042.0)],
        "worker": [(325.0, 2_934.0), (308.0, 2_881.0), (335.0, 3_185.0)]})
    header, first, second = capsys.readouterr().out.replace("\N{EN DASH}", "-").splitlines()
    assert header.split() == ["variant", "server", "CPU", "µs", "jobs/s"]
    assert first.split() == ["insert-alone", "51.3", "(50.0-60.0)", "12,868", "(11,796-14,042)"]
    assert second.split() == ["worker", "325", "(308-335)", "2,934", "(2,881-3,185)"]
    assert header.index("jobs/s") == first.index("12,868") == second.index("2,934")
