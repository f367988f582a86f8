"""Batched completion of jobs whose handlers wrote nothing, and enqueue without NOTIFY."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar
from jobpool.db.store import Completion, QueueStore
from jobpool.job import Job
from jobpool.worker.config import WorkerConfig

Conn = psycopg.AsyncConnection[dict[str, Any]]


@jobpool.kind("test_noop_result")
async def noop_result(job: Job, tx: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """Send no statement; return a result to store."""
    return {"seen": job.payload.get("n")}


@jobpool.kind("test_nested_steal")
async def nested_steal(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write inside a transaction block opened first, then lose the claim."""
    async with tx.transaction():
        await tx.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, 0)",
                         (job.id, job.attempts))
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
        await side.execute("UPDATE mdm.aa_job SET claimed_by = 'other/1/x' WHERE id = %s",
                           (job.id,))


async def test_jobs_that_wrote_nothing_are_done_in_batches_with_audit_and_result(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    ids = [r.id for r in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_noop_result", {"n": n}) for n in range(40)])]
    await run_until_empty(dsn, "test_noop_result", slots=8)
    rows = [await job(conn, i) for i in ids]
    assert {r["status"] for r in rows} == {"done"}
    assert [r["result"] for r in rows] == [{"seen": n} for n in range(40)]
    assert all(r["completed_at"] and r["claimed_by"] and r["heartbeat_at"] is None
               and r["lease_expires_at"] is None for r in rows)
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log WHERE action = 'job_done'"
                        " AND actor_principal_id = 'test-worker'") == 40


async def test_batched_completion_refuses_lost_claims(
    conn: Conn, store: QueueStore, tenant: uuid.UUID
) -> None:
    ids = [r.id for r in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_noop_result")] * 3)]
    claimed = {row["id"]: row for row in await store.claim(
        kinds=["test_noop_result"], tenants=None, limit=3)}
    assert set(claimed) == set(ids)
    stolen, stale, kept = ids
    await conn.execute("UPDATE mdm.aa_job SET claimed_by = 'other/1/x' WHERE id = %s",
                       (stolen,))
    before = {i: await job(conn, i) for i in (stolen, stale)}
    held, more, busy = await store.complete_and_claim(
        [Completion(stolen, 1, None), Completion(stale, 2, None), Completion(kept, 1, None)],
        kinds=["test_noop_result"], tenants=None, limit=5)
    assert (held, more, busy) == ({kept}, [], set())
    assert {i: await job(conn, i) for i in (stolen, stale)} == before
    assert (await job(conn, kept))["status"] == "done"
    assert await scalar(conn, "SELECT array_agg(job_id) FROM mdm.aa_audit_log"
                        " WHERE action = 'job_done'") == [kept]


async def test_a_row_locked_elsewhere_is_passed_over_not_waited_for(
    conn: Conn, dsn: str, store: QueueStore, tenant: uuid.UUID
) -> None:
    """The batched `done` runs in the claim's transaction: waiting for one row another
    session holds (an admin's open transaction) would stop every claim of the worker. The
    row is reported busy, still claimed; the others are done and the claim goes on."""
    ids = [r.id for r in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_noop_result")] * 4)]
    first = await store.claim(kinds=["test_noop_result"], tenants=None, limit=3)
    locked, *rest = [row["id"] for row in first]
    async with await psycopg.AsyncConnection.connect(dsn) as admin:
        await admin.execute("SELECT 1 FROM mdm.aa_job WHERE id = %s FOR UPDATE", (locked,))
        held, more, busy = await asyncio.wait_for(store.complete_and_claim(
            [Completion(row["id"], row["attempts"], None) for row in first],
            kinds=["test_noop_result"], tenants=None, limit=5), 30)
    held_after, _, busy_after = await store.complete_and_claim(
        [Completion(locked, 1, None)], kinds=["test_noop_result"], tenants=None, limit=0)
    assert (held, busy) == (set(rest), {locked})
    assert [row["id"] for row in more] == [i for i in ids if i not in {locked, *rest}]
    assert (held_after, busy_after) == ({locked}, set())  # the lock gone, written
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'") == 3


async def test_a_transaction_block_opened_first_still_commits_with_done(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The handler's first `tx.transaction()` is a savepoint in the job's transaction, so its
    writes roll back with the job when the claim is lost."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_nested_steal")).id
    await run_until_empty(dsn, "test_nested_steal")
    row = await job(conn, job_id)
    assert (row["status"], row["claimed_by"]) == ("running", "other/1/x")
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 0


async def test_enqueue_without_notify_sends_none(conn: Conn, dsn: str,
                                                 tenant: uuid.UUID) -> None:
    await prepare(conn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN jobpool")
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", notify=False)
        quiet = [n async for n in listener.notifies(timeout=0.3)]
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        woken = [n.payload async for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert (quiet, woken) == ([], ["test_record"])
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 2


async def test_a_worker_finds_unnotified_jobs_by_polling(conn: Conn, dsn: str,
                                                         tenant: uuid.UUID) -> None:
    await prepare(conn)
    from integration.helpers import worker

    w = worker(dsn, ("test_record",), until_empty=False, poll_interval=0.2)
    running = asyncio.create_task(w.run())
    try:
        await asyncio.sleep(0.5)
        job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record",
                                        notify=False)).id
        for _ in range(50):
            if (await job(conn, job_id))["status"] == "done":
                break
            await asyncio.sleep(0.1)
        assert (await job(conn, job_id))["status"] == "done"
    finally:
        w.stop()
        await running


def test_completion_delay_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="completion_delay"):
        WorkerConfig(completion_delay=-1)
