"""`jobpool jobs stop` on a running job: its handler is interrupted on the worker holding it.

Delivered by NOTIFY on the worker's LISTEN connection, or by the lease renewal without one
(poll-only); the handler's transaction rolls back; the worker's other slots go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import jobpool
from integration.entities_helpers import add_attribute, create_type, index_state
from integration.helpers import job, prepare, scalar, wait_until, worker
from jobpool import admin
from jobpool.errors import JobStateError
from jobpool.job import Job
from jobpool.kinds.indexes.index_plans import attribute_index_name
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]

RUNNING: set[int] = set()
"""Jobs whose handler has written its row and waits (uncommitted)."""
INTERRUPTED: set[int] = set()
"""Jobs whose handler got the CancelledError."""
CLEANED: set[int] = set()
"""Jobs whose handler finished cleaning up after the CancelledError."""
GATE = asyncio.Event()
"""Lets `test_stop_gated` handlers finish (set by the test; a new one per test, for its loop)."""

LONG_LEASE = 600.0
"""A lease whose renewal (every 200 s) cannot be what delivers the stop in these tests."""


async def _write_run(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    await tx.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, 0)",
                     (job.id, job.attempts))


async def _wait_until_cancelled(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row in the job's transaction, then wait for an event nobody sets; note the
    cancellation in INTERRUPTED and raise it."""
    await _write_run(job, tx)
    RUNNING.add(job.id)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        INTERRUPTED.add(job.id)
        raise


@jobpool.kind("test_stop_waits", stale_ttl=3600.0, timeout=3600.0)
async def waits(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row in the job's transaction, then wait for an event nobody sets."""
    await _wait_until_cancelled(job, tx)


@jobpool.kind("test_stop_cleans_up", stale_ttl=3600.0, timeout=3600.0)
async def cleans_up(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row, wait; when cancelled, clean up (a side connection's commit), re-raise."""
    try:
        await _wait_until_cancelled(job, tx)
    except asyncio.CancelledError:
        await asyncio.sleep(0.1)
        async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
            await side.execute("INSERT INTO test_failures (job_id) VALUES (%s)", (job.id,))
        CLEANED.add(job.id)
        raise


@jobpool.kind("test_stop_ignores", stale_ttl=3600.0, timeout=3600.0)
async def ignores(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row, wait; swallow the first cancellation and wait again."""
    with contextlib.suppress(asyncio.CancelledError):
        await _wait_until_cancelled(job, tx)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CLEANED.add(job.id)
        raise


@jobpool.kind("test_stop_gated", stale_ttl=3600.0, timeout=3600.0)
async def gated(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row, wait for GATE, finish."""
    await _write_run(job, tx)
    RUNNING.add(job.id)
    await GATE.wait()


async def _setup(conn: Conn) -> None:
    global GATE
    await prepare(conn)
    await conn.execute("CREATE TABLE IF NOT EXISTS test_failures (job_id bigint)")
    RUNNING.clear()
    INTERRUPTED.clear()
    CLEANED.clear()
    GATE = asyncio.Event()


async def _enqueue(conn: Conn, tenant: uuid.UUID, kind: str, payload: Any = None) -> int:
    return (await jobpool.enqueue(conn, tenant_id=tenant, kind=kind, payload=payload)).id


@dataclass(frozen=True)
class _Running:
    """A worker whose handlers have started: its run's task, the jobs by kind enqueued."""

    worker: Worker
    task: asyncio.Task[None]
    jobs: list[int]


async def _run(conn: Conn, dsn: str, tenant: uuid.UUID, kinds: Sequence[str], *,
               running: int | None = None, **config: Any) -> _Running:
    """Set up, enqueue a job of each of `kinds` (in order), start a worker serving them
    (`config`: its WorkerConfig); return once the handlers of the first `running` jobs (None:
    all) have written their row and wait."""
    await _setup(conn)
    jobs = [await _enqueue(conn, tenant, kind) for kind in kinds]
    w = worker(dsn, tuple(dict.fromkeys(kinds)), **config)
    task = await _started(w)
    started = set(jobs[:running])
    await wait_until(lambda: started <= RUNNING, "the handlers run", 30)
    return _Running(w, task, jobs)


async def _stop_the_first_of_two(conn: Conn, run: _Running) -> None:
    """Stop the waiting first job of `run` while the gated second one runs: the first is
    interrupted and its slot freed, the second finishes once let go."""
    stopped, other = run.jobs
    await admin.stop(conn, stopped, actor="alice@example.com")
    await wait_until(lambda: stopped in INTERRUPTED, "the stopped handler is interrupted", 30)
    await wait_until(lambda: stopped not in run.worker.producer.in_flight,
                     "the stopped job's slot is free", 30)
    assert other in run.worker.producer.in_flight and other not in INTERRUPTED
    GATE.set()
    await asyncio.wait_for(run.task, 30)

    await _assert_stopped_by(conn, stopped, "alice@example.com")
    assert (await job(conn, other))["status"] == "done"
    assert await _rows_of(conn, other) == 1
    assert _attempts(run.worker)[("test_stop_waits", "stopped")] == 1


async def _started(w: Worker) -> asyncio.Task[None]:
    """Run `w` (it exits once nothing is left to run: enqueue first) in a task; return once
    it listens (or has started, when poll-only)."""
    task = asyncio.create_task(w.run())
    await wait_until(lambda: w.listening or (w.listen_dsn is None and w.started),
                     "the worker is up", 30)
    return task


async def _rows_of(conn: Conn, job_id: int) -> int:
    return int(await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (job_id,)))


def _attempts(w: Worker) -> dict[tuple[str, str], float]:
    """`mdm_jobs_attempts_total` by (kind, outcome)."""
    return {(s.labels["kind"], s.labels["outcome"]): s.value
            for metric in w.metrics.attempts.collect() for s in metric.samples
            if s.name.endswith("_total")}


async def _assert_stopped_by(conn: Conn, job_id: int, actor: str) -> None:
    row = await job(conn, job_id)
    assert row["status"] == "failed" and row["claimed_by"] is None
    assert await _rows_of(conn, job_id) == 0  # the handler's write rolled back
    cur = await conn.execute("SELECT actor_principal_id FROM mdm.aa_audit_log"
                             " WHERE job_id = %s AND action = 'job_stop'", (job_id,))
    assert [r["actor_principal_id"] for r in await cur.fetchall()] == [actor]
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log WHERE job_id = %s"
                        " AND action IN ('job_done', 'job_retry', 'job_dlq')", (job_id,)) == 0


async def test_a_stop_interrupts_the_handler_and_the_other_slot_completes(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    run = await _run(conn, dsn, tenant, ("test_stop_waits", "test_stop_gated"), slots=2,
                     lease_ttl=LONG_LEASE)
    await _stop_the_first_of_two(conn, run)
    assert _attempts(run.worker)[("test_stop_gated", "done")] == 1


async def test_a_handler_that_catches_the_cancellation_cleans_up_within_the_grace(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    run = await _run(conn, dsn, tenant, ("test_stop_cleans_up",), slots=1,
                     lease_ttl=LONG_LEASE, stop_grace=30.0)
    [stopped] = run.jobs
    await admin.stop(conn, stopped, actor="alice@example.com")
    await asyncio.wait_for(run.task, 30)

    assert stopped in CLEANED
    assert await scalar(conn, "SELECT count(*) FROM test_failures WHERE job_id = %s",
                        (stopped,)) == 1  # its clean-up committed on its own connection
    await _assert_stopped_by(conn, stopped, "alice@example.com")


async def test_a_handler_that_ignores_the_cancellation_is_abandoned_after_the_grace(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    run = await _run(conn, dsn, tenant, ("test_stop_ignores", "test_record"), running=1,
                     slots=1, prefetch=0, lease_ttl=LONG_LEASE, stop_grace=0.5)
    stopped, after = run.jobs  # `after` waits for the one slot
    assert (await job(conn, after))["status"] == "pending"

    await admin.stop(conn, stopped, actor="alice@example.com")
    await asyncio.wait_for(run.task, 30)

    assert stopped in INTERRUPTED and stopped in CLEANED  # cancelled twice
    await _assert_stopped_by(conn, stopped, "alice@example.com")
    assert (await job(conn, after))["status"] == "done"
    slots = run.worker.slot_connections  # the abandoned task ended: nothing of it is kept
    assert (slots.abandoned, slots.orphans, slots.lent) == (set(), {}, 0)
    assert not run.worker.abandoning  # nor of the slot's own getting another connection


async def test_a_stop_delivered_twice_is_logged_once(
    conn: Conn, dsn: str, tenant: uuid.UUID, caplog: pytest.LogCaptureFixture
) -> None:
    """The notification cancels the handler; while it goes on past its cancellation, lease
    renewals (every half second here) find the claim gone too: one line says it stopped."""
    run = await _run(conn, dsn, tenant, ("test_stop_ignores",), running=1, slots=1,
                     prefetch=0, lease_ttl=1.5, stop_grace=2.0)
    [stopped] = run.jobs
    with caplog.at_level(logging.INFO, logger="jobpool.worker"):
        await admin.stop(conn, stopped, actor="alice@example.com")
        await asyncio.wait_for(run.task, 30)
    said = [r.getMessage() for r in caplog.records if f"job {stopped} " in r.getMessage()
            and "stopped" in r.getMessage()]
    assert said == [f"job {stopped} (test_stop_ignores) stopped: cancelling its handler (2s to "
                    "clean up)"], said
    await _assert_stopped_by(conn, stopped, "alice@example.com")


async def test_without_listen_the_lease_renewal_delivers_the_stop(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    run = await _run(conn, dsn, tenant, ("test_stop_waits", "test_stop_gated"), slots=2,
                     lease_ttl=3.0, pooler="transaction")  # no JOBPOOL_LISTEN_DSN: poll-only
    assert run.worker.listen_dsn is None
    await _stop_the_first_of_two(conn, run)


async def test_a_claim_taken_back_by_recovery_interrupts_the_handler_too(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Its work could not commit (the outcome write is compare-and-set on the claim), and the
    job runs elsewhere: the lease renewal that finds the claim gone cancels the handler."""
    run = await _run(conn, dsn, tenant, ("test_stop_waits",), slots=1, lease_ttl=3.0)
    [taken] = run.jobs
    await conn.execute("UPDATE mdm.aa_job SET claimed_by = 'other/1/x' WHERE id = %s", (taken,))
    await wait_until(lambda: taken in INTERRUPTED, "the handler is interrupted", 30)
    await asyncio.wait_for(run.task, 30)

    row = await job(conn, taken)
    assert (row["status"], row["claimed_by"]) == ("running", "other/1/x")  # left to its owner
    assert await _rows_of(conn, taken) == 0
    assert _attempts(run.worker)[("test_stop_waits", "lost_claim")] == 1


async def test_a_stopped_index_build_cancels_its_backend_and_drops_the_invalid_index(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _setup(conn)
    type_id = await create_type(conn, tenant, "customer")
    attr_id = await add_attribute(conn, type_id, attr_key="email", data_type="string")
    await conn.execute(
        "INSERT INTO mdm.ddm_entity (tenant_id, entity_type_id, external_key, attributes)"
        " SELECT %s, %s, 'c' || g, jsonb_build_object('email', 'user' || g || '@example.com')"
        "   FROM generate_series(1, 100) AS g", (tenant, type_id))
    name = attribute_index_name(str(tenant), "customer", "email")
    w = worker(dsn, ("index_sync",), slots=1, lease_ttl=LONG_LEASE)
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as blocker:
        # an old snapshot: CREATE INDEX CONCURRENTLY waits for it (lock_timeout 60 s)
        await blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await blocker.execute("SELECT count(*) FROM mdm.aa_tenant")
        await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET searchable = true"
                           " WHERE id = %s", (attr_id,))
        job_id = await scalar(conn, "SELECT id FROM mdm.aa_job WHERE job_kind = 'index_sync'")
        task = await _started(w)
        build: dict[str, Any] = {}

        async def building() -> bool:
            # the progress view's phase, not the statement's text: the statement is active
            # before its first transaction has committed the INVALID index's catalog entry
            cur = await conn.execute(
                "SELECT a.pid, p.phase FROM pg_stat_activity a"
                " JOIN pg_stat_progress_create_index p ON p.pid = a.pid"
                " WHERE a.application_name = %s", (f"jobpool index_sync job {job_id}",))
            row = await cur.fetchone()
            build.update(row or {})
            return row is not None and row["phase"] == "waiting for old snapshots"

        await wait_until(building, "the build waits for the old snapshot", 30)
        assert (await index_state(conn, name) or {}).get("valid") is False  # INVALID meanwhile

        await admin.stop(conn, job_id, actor="alice@example.com")

        async def dropping() -> bool:
            cur = await conn.execute("SELECT query FROM pg_stat_activity WHERE pid = %s"
                                     " AND state = 'active'", (build["pid"],))
            row = await cur.fetchone()
            return ((row is not None and row["query"].startswith("DROP INDEX CONCURRENTLY"))
                    or await index_state(conn, name) is None)

        # with the old snapshot still there, the build's backend is cancelled (its
        # connection lives on) and drops the INVALID index
        await wait_until(dropping, "the cancelled build's backend drops the INVALID index", 30)
        await blocker.rollback()
    await asyncio.wait_for(task, 30)

    assert await index_state(conn, name) is None
    row = await job(conn, job_id)
    assert row["status"] == "failed" and row["result"] is None
    assert await scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                        (build["pid"],)) == 0


async def test_two_stops_at_once_stop_the_job_once_and_the_second_is_refused_by_name(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _setup(conn)
    stopped = await _enqueue(conn, tenant, "test_stop_waits")
    w = worker(dsn, ("test_stop_waits",), slots=1, lease_ttl=LONG_LEASE)
    task = await _started(w)
    await wait_until(lambda: stopped in RUNNING, "the handler runs", 30)

    async def stop_as(actor: str) -> str:
        async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row,
                                                         autocommit=True) as own:
            try:
                await admin.stop(own, stopped, actor=actor)
            except JobStateError as exc:
                return str(exc)
            return "stopped"

    answers = sorted(await asyncio.gather(stop_as("alice"), stop_as("bob")))
    await asyncio.wait_for(task, 30)
    assert answers[1] == "stopped", answers
    assert answers[0].startswith(f"cannot stop job {stopped}: it is failed"), answers
    row = await job(conn, stopped)
    assert row["status"] == "failed" and row["claimed_by"] is None
    assert await _rows_of(conn, stopped) == 0
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log WHERE job_id = %s"
                        " AND action = 'job_stop'", (stopped,)) == 1
    assert _attempts(w)[("test_stop_waits", "stopped")] == 1
