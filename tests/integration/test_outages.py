"""Database outages and restarts: a worker settles its own leftovers as soon as the database
answers again, so no job waits for a stale TTL because of an outage."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from private_postgres import PrivateServer
from psycopg.rows import dict_row

import jobpool
from integration import helpers
from integration.helpers import prepare, scalar, worker
from jobpool.db.connect import open_pool
from jobpool.db.store import QueueStore
from jobpool.job import Job
from jobpool.worker import runtime
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]

DEADLINE = 60.0
"""Seconds a test waits for a state; far below any stale TTL of these kinds (1 h)."""


@jobpool.kind("test_outage_step", max_attempts=20, stale_ttl=3600.0, backoff_base=0.1,
              backoff_max=0.5, backoff_jitter=0.0)
async def outage_step(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Work a little, then record this run in the job's transaction."""
    await asyncio.sleep(0.02)
    await tx.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, 0)",
                     (job.id, job.attempts))


@jobpool.kind("test_kill_then_fail", max_attempts=3, stale_ttl=3600.0, backoff_base=0.1,
              backoff_max=0.1, backoff_jitter=0.0)
async def kill_then_fail(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """First attempt: end every other session of the database (the worker's pooled ones)
    except `payload.spare`, then fail, so the failure must be written on a dead connection."""
    if job.attempts > 1:
        return
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
        await side.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND backend_type = 'client backend'"
            " AND pid <> pg_backend_pid() AND pid <> ALL(%s::int[])",
            (job.payload["spare"],))
    raise RuntimeError("failed while the pool's connections died")


@jobpool.kind("test_retry_soon", max_attempts=3, stale_ttl=3600.0)
async def retry_soon(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    if job.attempts == 1:
        raise jobpool.RetryAfter(0.2, "try again in 0.2 s")


async def _interrupt(tx: psycopg.AsyncConnection[Any], step: str) -> None:
    """Do one step of `test_interrupted_in_steps` on the job's `tx`."""
    if step == "conflict":
        await tx.execute("DO $$ BEGIN RAISE EXCEPTION 'could not serialize access'"
                         " USING ERRCODE = 'serialization_failure'; END $$")
    elif step == "commit_conflict":
        await tx.execute("INSERT INTO test_commit_conflict VALUES (1)")
    elif step == "lost":
        await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    elif step == "permanent_from_conflict":
        try:
            await _interrupt(tx, "conflict")
        except psycopg.errors.SerializationFailure as exc:
            raise jobpool.PermanentError("this conflict is final") from exc


@jobpool.kind("test_interrupted_in_steps", max_attempts=1, stale_ttl=3600.0)
async def interrupted_in_steps(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Run n does `payload.steps[n - 1]` (`_interrupt`; past the list, nothing): each run is
    recorded on a connection of its own."""
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True,
                                                     row_factory=dict_row) as own:
        await own.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES "
                          "(%s, %s, 0)", (job.id, job.attempts))
        runs = await scalar(own, "SELECT count(*) FROM test_runs WHERE job_id = %s", (job.id,))
    steps = job.payload["steps"]
    await tx.execute("SELECT 1")  # the job's transaction is open
    if runs <= len(steps):
        await _interrupt(tx, steps[runs - 1])


async def wait_until(check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    await helpers.wait_until(check, what, DEADLINE)


async def statuses(conn: Conn) -> dict[str, int]:
    cur = await conn.execute("SELECT status::text AS status, count(*)::int AS n"
                             " FROM mdm.aa_job WHERE tenant_id <> %s GROUP BY 1",
                             ("00000000-0000-0000-0000-000000000000",))
    return {row["status"]: row["n"] for row in await cur.fetchall()}


async def all_done(conn: Conn, total: int) -> bool:
    return await statuses(conn) == {"done": total}


async def started(w: Worker) -> asyncio.Task[None]:
    task = asyncio.create_task(w.run())
    await wait_until(lambda: w.listening, "worker listening")
    # the listener's catch-up claim (woken as it starts listening) is over
    await wait_until(lambda: not w.wake.is_set() and not w.claiming.locked(), "worker idle")
    return task


async def stopped(w: Worker, task: asyncio.Task[None]) -> None:
    w.stop()
    await asyncio.wait_for(task, DEADLINE)


async def connect(dsn: str) -> Conn:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)


async def seed_outage_steps(dsn: str, total: int) -> None:
    """The test tables and `total` test_outage_step jobs of one tenant."""
    async with await connect(dsn) as setup:
        await prepare(setup)
        tenant = await scalar(setup, "INSERT INTO mdm.aa_tenant (key) VALUES ('acme')"
                              " RETURNING id")
        await jobpool.enqueue_many(setup, [jobpool.NewJob(tenant, "test_outage_step")] * total)


async def runs_at_least(dsn: str, n: int) -> bool:
    async with await connect(dsn) as conn:
        return int(await scalar(conn, "SELECT count(*) FROM test_runs")) >= n


async def drained(dsn: str, total: int) -> bool:
    async with await connect(dsn) as conn:
        return await all_done(conn, total)


async def test_a_claim_committed_unseen_is_handed_back_when_the_connection_returns(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Rows claimed under the worker's id that it never ran (the claim's commit reached the
    server, the answer did not) go back to pending, keeping their place and their attempt."""
    await prepare(conn)
    w = worker(dsn, ("test_record",), until_empty=False, poll_interval=3600.0)
    task = await started(w)
    try:
        ids = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record",
                                      notify=False)).id for _ in range(3)]
        before = await scalar(conn, "SELECT array_agg(available_at ORDER BY id) FROM mdm.aa_job")
        side = open_pool(dsn, size=1)
        await side.open()
        try:  # the claim the worker did not see, under its own id
            async with QueueStore(side, worker_id=w.worker_id, actor="test") as unseen:
                claimed = await unseen.claim(kinds=["test_record"], tenants=None, limit=3)
        finally:
            await side.close()
        assert sorted(row["id"] for row in claimed) == ids
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND pid <> pg_backend_pid()")

        await wait_until(lambda: all_done(conn, 3), "the unseen claims run to done")
    finally:
        await stopped(w, task)
    assert await scalar(conn, "SELECT array_agg(attempts) FROM mdm.aa_job") == [1, 1, 1]
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 3
    assert await scalar(conn, "SELECT array_agg(available_at ORDER BY id) FROM mdm.aa_job"
                        ) == before


async def test_a_failure_written_on_a_dead_connection_is_written_again(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The first write of the outcome meets a dead pooled connection: the worker writes it
    again on a fresh one, and the retry (due in 0.1 s) runs without waiting for a poll."""
    await prepare(conn)
    w = worker(dsn, ("test_kill_then_fail",), until_empty=False, poll_interval=3600.0)
    task = await started(w)
    try:
        job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_kill_then_fail",
                                        payload={"spare": [conn.info.backend_pid]})).id
        await wait_until(lambda: all_done(conn, 1), "the job failed once, then done")
    finally:
        await stopped(w, task)
    assert await scalar(conn, "SELECT attempts FROM mdm.aa_job WHERE id = %s", (job_id,)) == 2


async def test_a_retry_wakes_the_worker_when_it_falls_due(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    w = worker(dsn, ("test_retry_soon",), until_empty=False, poll_interval=3600.0)
    task = await started(w)
    try:
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_retry_soon")
        await wait_until(lambda: all_done(conn, 1), "the retry ran before the next poll")
    finally:
        await stopped(w, task)
    assert await scalar(conn, "SELECT attempts FROM mdm.aa_job") == 2


async def test_two_restarts_during_a_drain_lose_and_strand_nothing(
    private_server: PrivateServer,
) -> None:
    total, dsn = 400, private_server.dsn()
    await seed_outage_steps(dsn, total)
    w = worker(dsn, ("test_outage_step",), until_empty=False, slots=8, poll_interval=0.5)
    task = await started(w)
    try:
        for share in (0.2, 0.5):
            await wait_until(lambda share=share: runs_at_least(dsn, int(total * share)),
                             "progress")
            await asyncio.to_thread(private_server.restart)
        await wait_until(lambda: drained(dsn, total), "every job done after two restarts")
        await wait_until(lambda: w.not_ready() == [], "the worker ready again")
    finally:
        await stopped(w, task)
    async with await connect(dsn) as conn:
        assert await scalar(conn, "SELECT count(*) FROM test_runs") == total
        assert await scalar(conn, "SELECT count(DISTINCT job_id) FROM test_runs") == total


async def test_a_primary_switchover_during_a_drain_loses_duplicates_and_burns_nothing(
    private_server: PrivateServer,
) -> None:
    """A planned switchover: the primary stops (its last WAL reaches the standby first), the
    standby is promoted, and the worker, whose DSN names both hosts with
    target_session_attrs=read-write, carries on against the new primary. The jobs whose
    connection died mid-run are handed back: none uses an attempt for it."""
    total = 400
    await seed_outage_steps(private_server.dsn(), total)
    standby = private_server.standby()
    try:
        standby.start()
        both = (f"host=127.0.0.1,127.0.0.1 port={private_server.port},{standby.port}"
                " user=postgres dbname=postgres target_session_attrs=read-write")
        w = worker(both, ("test_outage_step",), until_empty=False, slots=8, poll_interval=0.5)
        task = await started(w)
        try:
            await wait_until(lambda: runs_at_least(both, total // 4), "progress")
            await asyncio.to_thread(private_server.stop)
            await asyncio.to_thread(standby.promote)
            async with await connect(both) as conn:  # the drain goes on on the new primary
                assert await scalar(conn, "SELECT count(*) FROM test_runs") < total
            await wait_until(lambda: drained(both, total), "every job done on the standby")
            await wait_until(lambda: w.not_ready() == [], "the worker ready again")
        finally:
            await stopped(w, task)
        async with await connect(both) as conn:
            assert await scalar(conn, "SELECT pg_is_in_recovery()") is False
            assert await scalar(conn, "SELECT count(*) FROM test_runs") == total
            assert await scalar(conn, "SELECT count(DISTINCT job_id) FROM test_runs") == total
            assert await scalar(conn, "SELECT max(attempts) FROM mdm.aa_job"
                                      " WHERE job_kind = 'test_outage_step'") == 1
    finally:
        standby.remove()


@jobpool.kind("test_outage_hold", max_attempts=3, stale_ttl=3600.0)
async def outage_hold(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Run until the worker cancels it."""
    await asyncio.sleep(3600)


async def test_an_idle_worker_stopped_during_an_outage_exits_at_once(
    private_server: PrivateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing claimed under its id can be in doubt (every claim answered, every outcome
    written, nothing running or buffered): it does not wait for the database to hand back
    nothing. The wait it skips is made longer than the test may take."""
    monkeypatch.setattr(runtime, "SHUTDOWN_SETTLE_TIMEOUT", 3600.0)
    dsn = private_server.dsn()
    await seed_outage_steps(dsn, 3)
    w = worker(dsn, ("test_outage_step",), until_empty=False, poll_interval=3600.0)
    task = await started(w)
    await wait_until(lambda: drained(dsn, 3), "the jobs done")
    # the done's commit is visible before the worker has read its answer
    await wait_until(lambda: not w.producer.in_flight and not w.leftovers.in_doubt,
                     "the worker has read every answer")
    await asyncio.to_thread(private_server.stop)
    await wait_until(lambda: not w.link.online.is_set(), "the worker sees the outage")
    assert not w.leftovers.in_doubt
    await stopped(w, task)


async def test_a_worker_stopped_during_an_outage_with_a_job_claimed_waits_to_hand_it_back(
    private_server: PrivateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its running job is cancelled at the end of the grace period and its own hand-back
    fails; the worker waits for the database and hands it back, the attempt not counted."""
    monkeypatch.setattr(runtime, "SHUTDOWN_SETTLE_TIMEOUT", 3600.0)
    dsn = private_server.dsn()
    async with await connect(dsn) as setup:
        await prepare(setup)
        tenant = await scalar(setup, "INSERT INTO mdm.aa_tenant (key) VALUES ('acme')"
                              " RETURNING id")
        job_id = (await jobpool.enqueue(setup, tenant_id=tenant, kind="test_outage_hold")).id
    w = worker(dsn, ("test_outage_hold",), until_empty=False, poll_interval=3600.0, grace=0.1)
    task = await started(w)
    await wait_until(lambda: job_id in w.producer.in_flight, "the job running")
    await asyncio.to_thread(private_server.stop)
    await wait_until(lambda: not w.link.online.is_set(), "the worker sees the outage")
    w.stop()
    await wait_until(lambda: not w.producer.in_flight, "the job cancelled")
    assert w.leftovers.in_doubt and not task.done()
    await asyncio.to_thread(private_server.start)
    await asyncio.wait_for(task, DEADLINE)
    async with await connect(dsn) as conn:
        row = await helpers.job(conn, job_id)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)


COMMIT_CONFLICT_DDL = """
CREATE TABLE IF NOT EXISTS test_commit_conflict (n int);
CREATE OR REPLACE FUNCTION test_commit_conflict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure';
END $$;
DROP TRIGGER IF EXISTS test_commit_conflict ON test_commit_conflict;
CREATE CONSTRAINT TRIGGER test_commit_conflict AFTER INSERT ON test_commit_conflict
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_commit_conflict();
"""


async def _status_is(conn: psycopg.AsyncConnection[Any], job_id: int,
                     statuses: tuple[str, ...]) -> bool:
    return (await helpers.job(conn, job_id))["status"] in statuses


@pytest.mark.parametrize(("steps", "outcome"), [
    # a hot row under SERIALIZABLE: more conflicts of the job's own transaction, at a
    # statement or at its COMMIT, than MAX_UNCOUNTED_HAND_BACKS, still not the job's attempt
    (["conflict"] * 6, ("done", 7)),
    (["commit_conflict"] * 6, ("done", 7)),
    # a restart after three conflicts is still a restart: each cause has its own count
    (["conflict"] * 3 + ["lost"], ("done", 5)),
    # the handler's PermanentError wins over the conflict it was raised from
    (["permanent_from_conflict"], ("dlq", 1)),
])
async def test_what_interrupts_a_job_is_counted_by_its_cause(
    conn: psycopg.AsyncConnection[Any], dsn: str, tenant: uuid.UUID, steps: list[str],
    outcome: tuple[str, int],
) -> None:
    """The job's kind allows one attempt: it ends done only if no interruption counted."""
    from jobpool.worker.executor import MAX_UNCOUNTED_CONFLICTS, MAX_UNCOUNTED_HAND_BACKS

    assert MAX_UNCOUNTED_HAND_BACKS < 6 < MAX_UNCOUNTED_CONFLICTS
    await prepare(conn)
    await conn.execute(COMMIT_CONFLICT_DDL)
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_interrupted_in_steps",
                                payload={"steps": steps})
    w = worker(dsn, ("test_interrupted_in_steps",), until_empty=False, slots=1,
               poll_interval=0.2)
    running = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: _status_is(conn, job.id, ("done", "dlq")), "job settled")
    finally:
        w.stop()
        await running
    runs = await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (job.id,))
    assert ((await helpers.job(conn, job.id))["status"], runs) == outcome


@pytest.mark.parametrize("do", ["end_own_session", "other_database_down", "own_conflict"])
async def test_a_handler_whose_own_error_looks_like_an_interruption_still_reaches_the_dlq(
    conn: psycopg.AsyncConnection[Any], dsn: str, tenant: uuid.UUID, do: str
) -> None:
    """A handler that ends its `tx`'s session on the server (`tx.close()` is refused), or raises
    a lost connection or a serialization failure of another database it uses, every time: its
    first hand-backs are uncounted, as after a restart, but then its attempts count and the
    job ends in the DLQ instead of running without end (`MAX_UNCOUNTED_HAND_BACKS`)."""
    from jobpool.worker.executor import MAX_UNCOUNTED_HAND_BACKS

    await prepare(conn)
    poisoned = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_poison",
                                     payload={"do": do})
    async def until_dead_lettered() -> dict[str, Any]:
        while (row := await helpers.job(conn, poisoned.id))["status"] in ("pending", "running"):
            await asyncio.sleep(0.1)
        return row

    w = worker(dsn, ("test_poison",), until_empty=False, slots=2)  # it waits out the backoffs
    running = asyncio.create_task(w.run())
    try:
        row = await asyncio.wait_for(until_dead_lettered(), 60)
    finally:
        w.stop()
        await running
    assert (row["status"], row["attempts"]) == ("dlq", 2)
    runs = await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                        (poisoned.id,))
    assert runs == 2 * (MAX_UNCOUNTED_HAND_BACKS + 1)
