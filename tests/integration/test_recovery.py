"""Recovery of lapsed claims, lease renewal, the maintenance schedule and done-job retention."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import psycopg
import pytest

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar, worker
from jobpool.db.connect import open_pool
from jobpool.db.store import Completion, QueueStore
from jobpool.worker.leases import LeaseKeeper
from jobpool.worker.maintenance import recover_stale_claims

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _running(conn: Conn, job_id: int, age: str, attempts: int = 1) -> None:
    await conn.execute(
        "UPDATE mdm.aa_job SET status = 'running', claimed_by = 'h/1/dead', attempts = %s,"
        " claimed_at = now() - %s::interval, heartbeat_at = now() - %s::interval WHERE id = %s",
        (attempts, age, age, job_id),
    )


async def test_recovery_follows_the_spec(conn: Conn, tenant: uuid.UUID) -> None:
    await prepare(conn)
    stale, fresh, exhausted = [
        (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id for _ in range(3)
    ]
    await _running(conn, stale, "1 hour")
    await _running(conn, fresh, "5 seconds")
    await _running(conn, exhausted, "1 hour", attempts=3)  # test_record: max_attempts 3

    rows = await recover_stale_claims(conn, actor="cleanup")
    assert {(r["id"], r["status"]) for r in rows} == {(stale, "pending"), (exhausted, "dlq")}

    recovered = await job(conn, stale)
    assert recovered["attempts"] == 1  # recovery is not an attempt
    assert recovered["claimed_by"] is None and recovered["claimed_at"] is None
    assert recovered["last_error"] == "[stale-claim recovered from h/1/dead]"
    assert (await job(conn, fresh))["status"] == "running"
    assert (await job(conn, exhausted))["status"] == "dlq"
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log WHERE action = 'job_dlq'"
                        " AND job_id = %s", (exhausted,)) == 1


async def test_a_recovered_job_keeps_its_place_in_the_queue(conn: Conn,
                                                           tenant: uuid.UUID) -> None:
    """Recovery is no fault of the job: it goes back ahead of jobs enqueued after it."""
    await prepare(conn)
    first, later = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
                    for _ in range(2)]
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() - interval '1 hour'"
                       " WHERE id = %s", (first,))
    placed = (await job(conn, first))["available_at"]
    await _running(conn, first, "1 hour")

    await recover_stale_claims(conn, actor="cleanup")

    assert (await job(conn, first))["available_at"] == placed
    pool = open_pool(str(conn.info.dsn), size=1)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="h/1/next", actor="w") as store:
            claimed = await store.claim(kinds=["test_record"], tenants=None, limit=1)
    finally:
        await pool.close()
    assert [row["id"] for row in claimed] == [first]
    assert (await job(conn, later))["status"] == "pending"


async def test_a_live_long_job_keeps_its_claim(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    """test_sleep has a 3 s stale TTL; a 6 s job survives recovery because its lease is renewed."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                    payload={"seconds": 6})).id
    running = asyncio.create_task(run_until_empty(dsn, "test_sleep"))
    recovered: list[Any] = []
    for _ in range(14):
        await asyncio.sleep(0.5)
        recovered += await recover_stale_claims(conn, actor="cleanup")
    await running
    assert recovered == []
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 1)


@jobpool.kind("test_references_its_job", max_attempts=1, stale_ttl=3.0)
async def references_its_job(job: jobpool.Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Insert a row referencing the job's own row (its foreign key check holds FOR KEY SHARE
    on it until the job's transaction ends), then work `payload.seconds`."""
    await tx.execute("INSERT INTO test_job_refs (job_id) VALUES (%s)", (job.id,))
    await asyncio.sleep(job.payload["seconds"])


async def test_a_handler_referencing_its_job_row_blocks_no_lease_renewal(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The renewal locked every held row FOR UPDATE in one statement: it waited for the
    handler's key-share lock on its own row, renewed no lease at all, and the worker's other
    jobs were recovered and run a second time while they still ran here."""
    await prepare(conn)
    await conn.execute("CREATE TABLE test_job_refs (job_id bigint REFERENCES mdm.aa_job (id))")
    holder = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_references_its_job",
                                    payload={"seconds": 4})).id
    other = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                   payload={"seconds": 4})).id
    await conn.commit()
    running = asyncio.create_task(run_until_empty(
        dsn, "test_references_its_job", "test_sleep", slots=2, lease_ttl=1.5))
    recovered: list[Any] = []
    while not running.done():
        await asyncio.sleep(0.5)
        recovered += await recover_stale_claims(conn, actor="cleanup")
        await conn.commit()
    await running
    assert recovered == []
    for job_id in (holder, other):
        row = await job(conn, job_id)
        assert (row["status"], row["attempts"]) == ("done", 1), row


async def test_a_job_whose_worker_always_dies_ends_in_the_dlq(conn: Conn,
                                                              tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    pool = open_pool(str(conn.info.dsn), size=1)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="h/9/crashy", actor="w") as store:
            for _ in range(10):
                if not await store.claim(kinds=["test_record"], tenants=None, limit=1):
                    break
                await conn.execute("UPDATE mdm.aa_job SET claimed_at = now() - interval '1 hour',"
                                   " lease_expires_at = now() - interval '1 second'"
                                   " WHERE id = %s", (job_id,))
                await recover_stale_claims(conn, actor="cleanup")
    finally:
        await pool.close()
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("dlq", 3)


async def test_recovery_follows_the_lease_whatever_the_stale_ttl(conn: Conn,
                                                                tenant: uuid.UUID) -> None:
    """test_record's stale TTL is 30 s: a lease that lapsed is taken back before that, a lease
    that holds is kept however old the claim, and a lease left from an earlier claim counts
    for nothing (the claim lapses a stale TTL after its heartbeat)."""
    await prepare(conn)
    lapsed, held, left_over = [
        (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id for _ in range(3)
    ]
    await _running(conn, lapsed, "1 second")
    await _running(conn, held, "1 hour")
    await _running(conn, left_over, "5 seconds")
    for job_id, lease in ((lapsed, "now() - interval '0.5 seconds'"),
                          (held, "now() + interval '10 seconds'"),
                          (left_over, "claimed_at - interval '1 second'")):
        await conn.execute(f"UPDATE mdm.aa_job SET lease_expires_at = {lease} WHERE id = %s",
                           (job_id,))

    rows = await recover_stale_claims(conn, actor="cleanup")

    assert [(r["id"], r["status"]) for r in rows] == [(lapsed, "pending")]
    assert (await job(conn, lapsed))["lease_expires_at"] is None
    assert (await job(conn, held))["status"] == "running"
    assert (await job(conn, left_over))["status"] == "running"


async def test_cleanup_job_recovers_a_stale_cleanup_job_and_expires_done_jobs(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    system = "00000000-0000-0000-0000-000000000000"
    stale_cleanup = (await jobpool.enqueue(conn, tenant_id=system, kind="cleanup_jobs",
                                           idempotency_key="old-slot")).id
    await _running(conn, stale_cleanup, "1 hour")
    old, recent = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
                   for _ in range(2)]
    await conn.execute("UPDATE mdm.aa_job SET status = 'done', completed_at = now() - %s::interval"
                       " WHERE id = %s", ("8 days", old))
    await conn.execute("UPDATE mdm.aa_job SET status = 'done', completed_at = now() - %s::interval"
                       " WHERE id = %s", ("1 day", recent))
    current = (await jobpool.enqueue(conn, tenant_id=system, kind="cleanup_jobs",
                                     idempotency_key="new-slot")).id

    await run_until_empty(dsn, "cleanup_jobs")

    result = (await job(conn, current))["result"]
    assert {k: result[k] for k in ("recovered", "dead_lettered", "done_deleted")} == {
        "recovered": 1, "dead_lettered": 0, "done_deleted": 1}
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE id = %s", (old,)) == 0
    assert (await job(conn, recent))["status"] == "done"
    # the stale cleanup job was recovered and, being runnable, ran in the same drain
    assert (await job(conn, stale_cleanup))["status"] == "done"


async def test_a_running_worker_maintains_the_queue_behind_a_backlog_at_priority_0(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Recovery and retention do not wait in the queue: with the worker's only slot busy and
    a backlog at priority 0 waiting, a dead worker's claim is taken back and an expired done
    job deleted."""
    await prepare(conn)
    backlog = await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenant, "test_sleep", {"seconds": 60}, priority=0)] * 20)
    dead, expired = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
                     for _ in range(2)]
    await _running(conn, dead, "1 hour")
    await conn.execute("UPDATE mdm.aa_job SET status = 'done', completed_at = now() - %s::interval"
                       " WHERE id = %s", ("8 days", expired))
    w = worker(dsn, ("test_sleep",), slots=1, prefetch=0, grace=0.1, until_empty=False)
    task = asyncio.create_task(w.run())
    try:
        for _ in range(300):
            await asyncio.sleep(0.1)
            if (await job(conn, dead))["status"] == "pending" and not await scalar(
                    conn, "SELECT count(*) FROM mdm.aa_job WHERE id = %s", (expired,)):
                break
        pending = await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'pending'"
                               " AND id = ANY(%s)", ([j.id for j in backlog],))
    finally:
        w.stop()
        await task
    assert (await job(conn, dead))["status"] == "pending"
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE id = %s", (expired,)) == 0
    assert pending >= 19  # the backlog still waited: maintenance did not queue behind it


async def test_a_lease_not_renewed_is_lost_only_when_the_job_is_not_finishing(
    conn: Conn, dsn: str, tenant: uuid.UUID, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that finds a job done by its own worker's outcome write (the renewal read the
    held jobs just before) reports nothing; one that finds the claim taken back reports it."""
    await prepare(conn)
    finished, taken_back = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
                            for _ in range(2)]
    pool = open_pool(dsn, size=1)
    await pool.open()
    keeper = LeaseKeeper(dsn, worker_id="h/2/keeper", actor="w", lease=30.0, recover=False)
    try:
        async with QueueStore(pool, worker_id="h/2/keeper", actor="w") as store:
            claimed = await store.claim(kinds=["test_record"], tenants=None, limit=2)
            for row in claimed:
                keeper.hold(row["id"], "test_record", timeout=60)
            before = (await job(conn, taken_back))["lease_expires_at"]
            await asyncio.to_thread(keeper.renew)
            assert (await job(conn, taken_back))["lease_expires_at"] > before
            keeper.finishing(finished)
            assert await store.complete_alone(Completion(finished, 1, None))
            await conn.execute("UPDATE mdm.aa_job SET claimed_at = now() - interval '2s',"
                               " lease_expires_at = now() - interval '1s' WHERE id = %s",
                               (taken_back,))
            assert [r["id"] for r in await recover_stale_claims(conn, actor="w")] == [taken_back]
            with caplog.at_level(logging.WARNING, logger="jobpool.worker"):
                await asyncio.to_thread(keeper.renew)
                await asyncio.to_thread(keeper.renew)
    finally:
        keeper.stop()
        await pool.close()
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == [f"job {taken_back} (test_record): lease lost (recovered elsewhere); its "
                    "result will be discarded"]


async def test_a_row_locked_by_another_session_holds_up_no_other_lease(
    conn: Conn, dsn: str, tenant: uuid.UUID, caplog: pytest.LogCaptureFixture
) -> None:
    """One job's row locked elsewhere (a handler locking its own row, an admin's open
    transaction): the renewal used to wait for it until its statement timeout, renewing no
    lease at all, so every other job of the worker lapsed and ran a second time. Now the
    others are renewed, the locked one stays held (not reported lost) and is renewed once
    the lock is gone."""
    await prepare(conn)
    locked, free = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
                    for _ in range(2)]
    pool = open_pool(dsn, size=1)
    await pool.open()
    lost: list[int] = []
    keeper = LeaseKeeper(dsn, worker_id="h/3/keeper", actor="w", lease=30.0, recover=False,
                         lost=lambda job_id, _: lost.append(job_id))
    try:
        async with QueueStore(pool, worker_id="h/3/keeper", actor="w") as store, \
                await psycopg.AsyncConnection.connect(dsn) as other:
            for row in await store.claim(kinds=["test_record"], tenants=None, limit=2):
                keeper.hold(row["id"], "test_record", timeout=60)
            before = {i: (await job(conn, i))["lease_expires_at"] for i in (locked, free)}
            await other.execute("SELECT id FROM mdm.aa_job WHERE id = %s FOR UPDATE", (locked,))
            with caplog.at_level(logging.WARNING, logger="jobpool.worker"):
                await asyncio.to_thread(keeper.renew)  # once: a short transaction, no warning
                assert not [r for r in caplog.records if "holds a lock" in r.getMessage()]
                await asyncio.to_thread(keeper.renew)
                await asyncio.to_thread(keeper.renew)  # one warning while it stays locked
            assert (await job(conn, free))["lease_expires_at"] > before[free]
            assert (await job(conn, locked))["lease_expires_at"] == before[locked]
            await other.rollback()
            await asyncio.to_thread(keeper.renew)
            assert (await job(conn, locked))["lease_expires_at"] > before[locked]
    finally:
        keeper.stop()
        await pool.close()
    assert lost == []
    warned = [r.getMessage() for r in caplog.records if "holds a lock on its row" in r.getMessage()]
    assert warned == [f"job {locked} (test_record): another session holds a lock on its row, so "
                      "its lease is not renewed until that lock goes (a handler locking its own "
                      "job's row, or a long transaction); if it lapses meanwhile, stale-claim "
                      "recovery takes the claim back once the lock is gone"]
