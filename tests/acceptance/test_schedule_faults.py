"""Schedules under faults: the database restarted while ticks are due, a scheduler killed -9,
schedulers whose clocks are a day behind and two hours ahead.

Real `jobpool run` processes share a 1-second schedule on a cluster of the test's own; after
the faults, every second from the first tick to the last has exactly one job, and no tick
was counted as missed (the faults are far shorter than the minute after which a tick is).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from integration.helpers import prepare, wait_until
from private_postgres import PrivateServer
from psycopg.rows import dict_row

from acceptance.cli import REPO, env, worker_args

Conn = psycopg.AsyncConnection[dict[str, Any]]
SCHEDULES = json.dumps([{"name": "every-second", "kind": "test_noop", "every": 1}])
KEY = "schedule:every-second:"
DEADLINE = 60.0


LIBFAKETIME = next((path for path in (Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
                                       Path("/usr/lib/faketime/libfaketime.so.1"))
                     if path.exists()), None)
"""Debian's faketime library, preloaded (its `faketime` command forks: a signal sent to it
would not reach the worker)."""


def scheduler(dsn: str, clock: str | None = None) -> subprocess.Popen[str]:
    """A long-running worker of the pool `faults`, which declares the schedule; `clock`: its
    clock's offset as faketime takes it (`-1d`), if any."""
    skew = {} if clock is None else {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": clock}
    return subprocess.Popen(
        [sys.executable, "-m", "jobpool", *worker_args("test_noop", poll_interval=0.5)],
        env=env(dsn, JOBPOOL_POOL="faults", JOBPOOL_SCHEDULES=SCHEDULES, **skew), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def ticks(dsn: str) -> dict[str, int]:
    """Jobs, distinct ticks and seconds covered by the schedule's jobs, and ticks missed."""
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row,
                                                     autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) AS jobs, count(DISTINCT t) AS ticks,"
            " coalesce(extract(epoch FROM max(t) - min(t))::int + 1, 0) AS covered,"
            " (SELECT missed_total FROM mdm.aa_schedule WHERE name = 'every-second') AS missed"
            " FROM (SELECT replace(idempotency_key, %s, '')::timestamptz AS t FROM mdm.aa_job"
            " WHERE idempotency_key LIKE %s) AS k", (KEY, KEY + "%"))
        row = await cur.fetchone()
    assert row is not None
    return {name: int(value or 0) for name, value in row.items()}


async def more_ticks_than(dsn: str, count: int) -> bool:
    try:
        return (await ticks(dsn))["ticks"] > count
    except psycopg.OperationalError:
        return False


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime is not installed (Debian: faketime)")
async def test_a_restart_a_killed_scheduler_and_skewed_clocks_leave_no_tick_out_or_twice(
    private_server: PrivateServer,
) -> None:
    dsn = private_server.dsn()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await prepare(conn)
    first, second = scheduler(dsn), scheduler(dsn)
    behind, ahead = scheduler(dsn, "-1d"), scheduler(dsn, "+2h")
    processes = (first, second, behind, ahead)

    async def more_ticks(what: str) -> None:
        before = (await ticks(dsn))["ticks"]
        await wait_until(lambda: more_ticks_than(dsn, before + 3), what, DEADLINE)

    errors: list[str] = []
    try:
        await wait_until(lambda: more_ticks_than(dsn, 3), "the first ticks", DEADLINE)
        await asyncio.to_thread(private_server.restart)
        await more_ticks("ticks after the restart")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=DEADLINE)
        await more_ticks("ticks after a scheduler was killed")
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=DEADLINE)
        await more_ticks("ticks from the schedulers with skewed clocks alone")
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            errors.append(process.communicate(timeout=DEADLINE)[1])
    assert [p.returncode for p in processes] == [-signal.SIGKILL, 0, 0, 0], errors
    seen = await ticks(dsn)
    assert seen["jobs"] == seen["ticks"] == seen["covered"], seen
    assert seen["missed"] == 0, seen
