"""`jobpool jobs stop` of a job that a `jobpool run` worker is running: the handler stops."""

from __future__ import annotations

import asyncio
import signal
import uuid
from typing import Any

import psycopg
from integration.helpers import job, prepare, scalar, wait_until

import jobpool
from acceptance.cli import jobpool as run_jobpool
from acceptance.cli import start, worker_args

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def test_jobs_stop_interrupts_the_handler_in_the_worker_process(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    stopped = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_wait_for_stop")).id
    # kinds of long stale TTLs: a lease of 30 s, renewed every 10 s, so the stop arrives by
    # NOTIFY, not by the renewal
    worker = start(dsn, *worker_args("test_wait_for_stop", "test_record", slots=1,
                                     log_level="info"))
    try:
        async def running() -> bool:
            return (await job(conn, stopped))["status"] == "running"

        await wait_until(running, "the job runs", 60)
        out = await asyncio.to_thread(run_jobpool, dsn, "jobs", "stop", str(stopped),
                                      "--actor", "alice")
        assert f"job {stopped} stopped" in out.stdout
        other = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id

        async def other_done() -> bool:
            return (await job(conn, other))["status"] == "done"

        await wait_until(other_done, "the next job runs in the freed slot", 60)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, err
    assert f"job {stopped} (test_wait_for_stop) stopped: cancelling its handler" in err
    assert f"job {stopped} (test_wait_for_stop): its handler ended" in err
    row = await job(conn, stopped)
    assert row["status"] == "failed" and row["claimed_by"] is None
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                        (stopped,)) == 0
    assert await scalar(conn, "SELECT actor_principal_id FROM mdm.aa_audit_log"
                        " WHERE job_id = %s AND action = 'job_stop'", (stopped,)) == "user:alice"
