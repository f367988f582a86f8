"""Worker processes as users run them: many at once, killed, and stopped with SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from typing import Any

import psycopg
import pytest
from integration.helpers import job, prepare, scalar

import jobpool
from acceptance.cli import jobpool as run_cli
from acceptance.cli import start, worker_args

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _wait_status(conn: Conn, job_id: int, status: str, seconds: float = 30) -> None:
    for _ in range(int(seconds * 10)):
        if (await job(conn, job_id))["status"] == status:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {status}: {await job(conn, job_id)}")


async def test_four_processes_of_eight_slots_drain_20000_jobs_exactly_once(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 20_000)
    started = time.monotonic()
    workers = [start(dsn, *worker_args("test_record", slots=8, until_empty=True))
               for _ in range(4)]
    for w in workers:
        _, err = await asyncio.to_thread(w.communicate, timeout=600)
        assert w.returncode == 0, err
    elapsed = time.monotonic() - started
    cur = await conn.execute("SELECT count(*) AS runs, count(DISTINCT job_id) AS ids,"
                             " max(attempt) AS attempts, count(DISTINCT worker_pid) AS pids"
                             " FROM test_runs")
    stats = await cur.fetchone()
    assert stats == {"runs": 20_000, "ids": 20_000, "attempts": 1, "pids": 4}
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'") == 20_000
    print(f"\n20,000 jobs, 4 processes x 8 slots: {elapsed:.1f}s, {20_000 / elapsed:,.0f} jobs/s")


async def test_kill_9_mid_job_then_recovery_runs_it_to_done(conn: Conn, dsn: str,
                                                           tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                    payload={"seconds": 60, "retry_seconds": 0})).id
    placed = (await job(conn, job_id))["available_at"]
    victim = start(dsn, *worker_args("test_sleep"))
    await _wait_status(conn, job_id, "running")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert (await job(conn, job_id))["attempts"] == 1

    await asyncio.sleep(4)  # test_sleep's stale TTL is 3 s
    out = run_cli(dsn, "recover").stdout
    assert f"job {job_id} (test_sleep): stale claim recovered -> pending" in out
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("pending", 1)  # recovery is not an attempt
    assert row["available_at"] == placed  # nor a reason to queue it behind newer jobs
    assert re.search(r"\[stale-claim recovered from [^ ]+/\d+/[-0-9a-f]+\]$", row["last_error"])

    run_cli(dsn, *worker_args("test_sleep", until_empty=True))
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 2)
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (job_id,)) == 1


async def test_sigterm_hands_back_a_job_longer_than_the_grace_period(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                    payload={"seconds": 60, "retry_seconds": 0})).id
    placed = (await job(conn, job_id))["available_at"]
    quick = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    w = start(dsn, *worker_args("test_sleep", "test_record", grace=1))
    await _wait_status(conn, job_id, "running")
    await _wait_status(conn, quick, "done")
    w.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(w.communicate, timeout=30)
    assert w.returncode == 0, err
    assert "handed back" in err
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)
    assert row["available_at"] == placed  # handed back at its place in the queue

    run_cli(dsn, *worker_args("test_sleep", until_empty=True))
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 1)


@pytest.mark.parametrize("processes", [1, 2])
async def test_sighup_stops_a_worker_as_sigterm_does(
    conn: Conn, dsn: str, tenant: uuid.UUID, processes: int
) -> None:
    """A closing terminal or SSH session sends SIGHUP, whose default would end the worker as
    kill -9 does (its claims left to lapse, an attempt used): it stops as on SIGTERM, the
    job longer than the grace period handed back, also from a group of processes."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                    payload={"seconds": 60})).id
    w = start(dsn, *worker_args("test_sleep", grace=1, processes=processes))
    await _wait_status(conn, job_id, "running")
    w.send_signal(signal.SIGHUP)
    _, err = await asyncio.to_thread(w.communicate, timeout=30)
    assert w.returncode == 0, err
    assert "handed back" in err, err
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)


async def test_sigterm_lets_a_short_job_finish(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                    payload={"seconds": 2})).id
    w = start(dsn, *worker_args("test_sleep", grace=20))
    await _wait_status(conn, job_id, "running")
    w.send_signal(signal.SIGTERM)
    await asyncio.to_thread(w.communicate, timeout=30)
    assert w.returncode == 0
    assert (await job(conn, job_id))["status"] == "done"


async def test_sigterm_stops_a_worker_whose_handler_ignores_its_cancellation(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The handler catches every CancelledError: the worker used to wait for it as long as it
    ran (a minute here), a second SIGTERM notwithstanding. Now it waits the stop grace, hands
    the claim back and exits; the handler's write rolls back with its connection."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_ignores_cancel",
                                    payload={"seconds": 60})).id
    w = start(dsn, *worker_args("test_ignores_cancel", grace=1, stop_grace=1))
    await _wait_status(conn, job_id, "running")
    w.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(w.communicate, timeout=30)
    assert w.returncode == 0, err
    assert f"job {job_id} did not end within 6s of its cancellation" in err, err
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (job_id,)) == 0
