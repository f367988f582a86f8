"""Claim and lifecycle on real PostgreSQL: done, retry with backoff, DLQ, lost claims."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar, wait_until, worker
from jobpool.db.connect import open_pool
from jobpool.db.store import QueueStore
from jobpool.job import Job
from jobpool.worker.maintenance import recover_stale_claims

Conn = psycopg.AsyncConnection[dict[str, Any]]


@jobpool.kind("test_slow_fail", max_attempts=3, backoff_base=2.0, backoff_max=2.0,
              backoff_jitter=0.0)
async def slow_fail(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Start the transaction, work for 5 s, note the moment of failure, fail."""
    await tx.execute("SELECT 1")
    await asyncio.sleep(5)
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
        await side.execute("INSERT INTO test_failures (job_id) VALUES (%s)", (job.id,))
    raise RuntimeError("failed after a long transaction")


@jobpool.kind("test_steal")
async def steal(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row, then lose the claim to another worker before completing."""
    await tx.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, 0)",
                     (job.id, job.attempts))
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
        await side.execute("UPDATE mdm.aa_job SET claimed_by = 'other/1/x' WHERE id = %s",
                           (job.id,))


@jobpool.kind("test_timeout", timeout=0.5, backoff_base=60.0)
async def too_slow(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    await tx.execute("SELECT pg_sleep(5)")


@jobpool.kind("test_tiny_stale", stale_ttl=0.05)
async def tiny_stale(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Never enqueued: its 50 ms stale TTL caps the lease of a worker that serves it."""


async def _enqueue(conn: Conn, tenant: uuid.UUID, kind: str, payload: Any = None,
                   **kwargs: Any) -> int:
    result = await jobpool.enqueue(conn, tenant_id=tenant, kind=kind, payload=payload, **kwargs)
    return result.id


async def test_success_marks_done_with_audit_and_side_effects(conn: Conn, dsn: str,
                                                              tenant: uuid.UUID) -> None:
    await prepare(conn)
    ids = [await _enqueue(conn, tenant, "test_record") for _ in range(25)]
    await run_until_empty(dsn, "test_record", slots=4)
    rows = [await job(conn, i) for i in ids]
    assert {r["status"] for r in rows} == {"done"}
    assert all(r["attempts"] == 1 and r["completed_at"] and r["last_error"] is None for r in rows)
    assert {r["lease_expires_at"] for r in rows} == {None}  # a finished job holds no lease
    assert await scalar(conn, "SELECT count(DISTINCT job_id) FROM test_runs") == 25
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log WHERE action = 'job_done'"
                        " AND actor_principal_id = 'test-worker'") == 25
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log"
                        " WHERE action = 'job_enqueued'") == 25


async def test_transient_failure_rolls_back_and_retries_with_backoff(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_fail", {"message": "smtp down"})
    await run_until_empty(dsn, "test_fail")
    row = await job(conn, job_id)
    assert row["status"] == "pending"
    assert row["attempts"] == 1
    assert row["claimed_by"] is None and row["claimed_at"] is None
    assert row["last_error"] == "RuntimeError: smtp down"
    wait = await scalar(conn, "SELECT extract(epoch FROM available_at - now()) FROM mdm.aa_job"
                        " WHERE id = %s", (job_id,))
    assert 0 < wait <= 2.0
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 0  # rolled back


async def test_out_of_attempts_goes_to_the_dlq_once(conn: Conn, dsn: str,
                                                   tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_fail", {"message": "still down"})
    await run_until_empty(dsn, "test_fail")
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() WHERE id = %s", (job_id,))
    await run_until_empty(dsn, "test_fail")
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("dlq", 2)
    cur = await conn.execute("SELECT payload FROM mdm.aa_audit_log WHERE action = 'job_dlq'")
    audits = await cur.fetchall()
    assert len(audits) == 1
    assert audits[0]["payload"]["last_error"] == "RuntimeError: still down"
    assert await scalar(conn, "SELECT count(*) FROM mdm.v_job_dlq WHERE id = %s", (job_id,)) == 1


async def test_permanent_error_dead_letters_at_once(conn: Conn, dsn: str,
                                                   tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_fail", {"permanent": True, "message": "bad"},
                            max_attempts=10)
    await run_until_empty(dsn, "test_fail")
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("dlq", 1, "PermanentError: bad")
    assert (row["heartbeat_at"], row["lease_expires_at"]) == (None, None)


async def test_last_error_is_truncated(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_fail", {"message": "x" * 50_000})
    await run_until_empty(dsn, "test_fail")
    row = await job(conn, job_id)
    assert 100 < len(row["last_error"]) <= 4096
    assert row["last_error"].endswith("[truncated]")


async def test_backoff_counts_from_the_failure_not_the_transaction_start(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await conn.execute("CREATE TABLE test_failures (job_id bigint,"
                       " at timestamptz NOT NULL DEFAULT clock_timestamp())")
    job_id = await _enqueue(conn, tenant, "test_slow_fail")
    await run_until_empty(dsn, "test_slow_fail")
    row = await job(conn, job_id)
    failed_at = await scalar(conn, "SELECT at FROM test_failures WHERE job_id = %s", (job_id,))
    assert row["status"] == "pending"
    assert row["available_at"] >= failed_at + timedelta(seconds=2)


async def test_handler_timeout_is_a_transient_failure(conn: Conn, dsn: str,
                                                     tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_timeout")
    await run_until_empty(dsn, "test_timeout")
    row = await job(conn, job_id)
    assert row["status"] == "pending"
    assert "timeout of 0.5s" in row["last_error"]


async def test_a_worker_that_lost_its_claim_changes_nothing(conn: Conn, dsn: str,
                                                           tenant: uuid.UUID) -> None:
    """Claimed by A, recovered as stale, re-claimed by B: A's success and failure are no-ops."""
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_fail")
    pool = open_pool(dsn, size=2)
    await pool.open()
    try:
        a = QueueStore(pool, worker_id="host/1/a", actor="w")
        b = QueueStore(pool, worker_id="host/2/b", actor="w")
        [claimed] = await a.claim(kinds=["test_fail"], tenants=None, limit=1)
        await conn.execute("UPDATE mdm.aa_job SET claimed_at = now() - interval '1 day',"
                           " heartbeat_at = now() - interval '1 day',"
                           " lease_expires_at = now() - interval '1 hour' WHERE id = %s",
                           (job_id,))
        assert [r["status"] for r in await recover_stale_claims(conn, actor="w")] == ["pending"]
        [reclaimed] = await b.claim(kinds=["test_fail"], tenants=None, limit=1)
        assert reclaimed["attempts"] == 2
        before = await job(conn, job_id)

        async with pool.connection() as tx, tx.transaction():
            assert await a.complete(tx, job_id, claimed["attempts"], None) is False
        assert await a.retry(job_id, claimed["attempts"], delay=1, error="x") is False
        assert await a.dead_letter(job_id, claimed["attempts"], error="x") is False
        assert await a.release(job_id, claimed["attempts"]) is False
        assert await job(conn, job_id) == before

        assert await b.dead_letter(job_id, reclaimed["attempts"], error="real") is True
        assert await b.dead_letter(job_id, reclaimed["attempts"], error="again") is False
    finally:
        await a.close()
        await b.close()
        await pool.close()
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log WHERE action = 'job_dlq'"
                        " AND job_id = %s", (job_id,)) == 1


async def test_lost_claim_rolls_back_the_handlers_writes(conn: Conn, dsn: str,
                                                        tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = await _enqueue(conn, tenant, "test_steal")
    await run_until_empty(dsn, "test_steal")
    row = await job(conn, job_id)
    assert (row["status"], row["claimed_by"]) == ("running", "other/1/x")
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 0


async def test_claim_orders_by_priority_then_available_at(conn: Conn, dsn: str,
                                                         tenant: uuid.UUID) -> None:
    await prepare(conn)
    late = await _enqueue(conn, tenant, "test_record", priority=100)
    urgent = await _enqueue(conn, tenant, "test_record", priority=10)
    await _enqueue(conn, tenant, "test_record", priority=10,
                   available_at=(await scalar(conn, "SELECT now() + interval '1 hour'")))
    pool = open_pool(dsn, size=1)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="h/1/a", actor="w") as store:
            rows = await store.claim(kinds=["test_record"], tenants=None, limit=10)
    finally:
        await pool.close()
    assert [r["id"] for r in rows] == [urgent, late]


async def test_a_stale_ttl_shorter_than_a_renewal_leaves_live_claims_alone(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Two workers serving a kind whose stale TTL is 50 ms lease their claims for 0.5 s at
    least: neither takes back a job whose handler still runs, so each job runs once."""
    await prepare(conn)
    ids = [await _enqueue(conn, tenant, "test_sleep", {"seconds": 1.5}) for _ in range(4)]
    workers = [worker(dsn, ("test_tiny_stale", "test_sleep"), slots=2, until_empty=False)
               for _ in range(2)]  # long-running: each recovers lapsed claims
    running = [asyncio.create_task(w.run()) for w in workers]
    try:
        await wait_until(lambda: _all_done(conn, ids), "every job is done", 60)
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*running)
    assert [r["attempts"] for r in [await job(conn, i) for i in ids]] == [1] * 4
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 4


async def _all_done(conn: Conn, ids: list[int]) -> bool:
    return await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE id = ANY(%s)"
                              " AND status = 'done'", (ids,)) == len(ids)


async def test_claims_never_overlap(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 300)
    pool = open_pool(dsn, size=6)
    await pool.open()
    try:
        stores = [QueueStore(pool, worker_id=f"h/{i}/x", actor="w") for i in range(6)]

        async def drain(store: QueueStore) -> list[int]:
            ids: list[int] = []
            while rows := await store.claim(kinds=["test_record"], tenants=None, limit=7):
                ids += [r["id"] for r in rows]
            return ids

        claimed = [i for ids in await asyncio.gather(*map(drain, stores)) for i in ids]
    finally:
        for store in stores:
            await store.close()
        await pool.close()
    assert len(claimed) == len(set(claimed)) == 300


async def test_tenant_restriction(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    other = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('globex') RETURNING id")
    mine = await _enqueue(conn, tenant, "test_record")
    theirs = await _enqueue(conn, other, "test_record")
    await run_until_empty(dsn, "test_record", tenants=("globex",))
    assert (await job(conn, theirs))["status"] == "done"
    assert (await job(conn, mine))["status"] == "pending"


async def test_a_second_stop_hands_running_jobs_back_at_once(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The first stop gives running jobs the grace period; a second one (Ctrl-C twice) ends
    it: the job is handed back, its attempt not counted, long before the grace is over."""
    await prepare(conn)
    sleeper = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                    payload={"seconds": 600})
    w = worker(dsn, ("test_sleep",), until_empty=False, grace=600.0)
    running = asyncio.create_task(w.run())
    for _ in range(600):
        if (await job(conn, sleeper.id))["status"] == "running":
            break
        await asyncio.sleep(0.1)
    w.stop()
    await asyncio.sleep(0.5)
    assert not running.done()  # the grace period runs
    w.stop()
    await asyncio.wait_for(running, 30)
    row = await job(conn, sleeper.id)
    assert (row["status"], row["claimed_by"], row["attempts"]) == ("pending", None, 0)
