"""jobpool.testing: run a user's kind inline, drain a queue, list what was enqueued."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import jobpool
from integration.helpers import add_tenant, scalar, wait_until
from jobpool import pauses, testing
from jobpool.db.connect import open_pool
from jobpool.db.store import QueueStore
from jobpool.job import Job

Conn = psycopg.AsyncConnection[dict[str, Any]]

INVOICES_DDL = "CREATE TABLE tm_invoice (job_id bigint PRIMARY KEY, total int NOT NULL)"


@jobpool.kind("tm_invoice")
async def invoice(job: Job, tx: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """Store the total of `payload.lines` in the job's transaction and return it."""
    total = sum(job.payload["lines"])
    await tx.execute("INSERT INTO tm_invoice (job_id, total) VALUES (%s, %s)", (job.id, total))
    return {"total": total}


@jobpool.kind("tm_flaky", max_attempts=2, backoff_base=3600, backoff_max=3600,
              backoff_jitter=0)
async def flaky(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row (rolled back), then fail as a provider that is down would."""
    await tx.execute("INSERT INTO tm_invoice (job_id, total) VALUES (%s, 0)", (job.id,))
    raise RuntimeError("provider down")


@jobpool.kind("tm_reject")
async def reject(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Write a row (rolled back), then refuse the payload for good."""
    await tx.execute("INSERT INTO tm_invoice (job_id, total) VALUES (%s, 0)", (job.id,))
    raise jobpool.PermanentError("payload.lines is empty")


@jobpool.kind("tm_chain")
async def chain(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Enqueue a `tm_invoice` follow-up in the job's transaction."""
    await jobpool.enqueue(tx, tenant_id=job.tenant_id, kind="tm_invoice",
                          payload={"lines": job.payload["lines"]})


async def _prepare(conn: Conn) -> None:
    await conn.execute(INVOICES_DDL)
    await testing.register_kinds(conn)


async def _enqueue(conn: Conn, tenant: uuid.UUID, kind: str, payload: Any,
                   **options: Any) -> int:
    return (await jobpool.enqueue(conn, tenant_id=tenant, kind=kind, payload=payload,
                                  **options)).id


async def test_run_job_runs_a_kind_in_its_transaction_and_marks_it_done(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await conn.execute(INVOICES_DDL)
    run = await testing.run_job(dsn, "tm_invoice", {"lines": [5, 7]}, tenant="acme")
    assert (run.status, run.attempts, run.result, run.last_error) == (
        "done", 1, {"total": 12}, None)
    assert (run.kind, run.tenant_id, run.payload) == ("tm_invoice", tenant, {"lines": [5, 7]})
    assert await scalar(conn, "SELECT total FROM tm_invoice WHERE job_id = %s", (run.id,)) == 12
    assert await scalar(conn, "SELECT actor_principal_id FROM mdm.aa_audit_log"
                        " WHERE job_id = %s AND action = 'job_done'", (run.id,)) == testing.ACTOR


async def test_run_job_reports_a_retry_as_pending_without_waiting_for_the_backoff(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The backoff is an hour: the call returns with the job pending, due in an hour."""
    await conn.execute(INVOICES_DDL)
    run = await testing.run_job(dsn, "tm_flaky", {}, tenant=tenant)
    assert (run.status, run.attempts, run.max_attempts) == ("pending", 1, 2)
    assert run.last_error == "RuntimeError: provider down"
    assert run.available_at > datetime.now(UTC) + timedelta(minutes=50)
    assert await scalar(conn, "SELECT count(*) FROM tm_invoice") == 0  # rolled back

    again = await testing.run_pending(dsn, run.id)
    assert (again.id, again.status, again.attempts) == (run.id, "dlq", 2)
    assert again.last_error == "RuntimeError: provider down"


async def test_run_job_sends_a_permanent_error_to_the_dlq_at_once(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await conn.execute(INVOICES_DDL)
    run = await testing.run_job(dsn, "tm_reject", {"lines": []}, tenant="acme")
    assert (run.status, run.attempts, run.max_attempts) == ("dlq", 1, 20)
    assert run.last_error == "PermanentError: payload.lines is empty"
    assert await scalar(conn, "SELECT count(*) FROM mdm.v_job_dlq WHERE id = %s", (run.id,)) == 1
    assert await scalar(conn, "SELECT count(*) FROM tm_invoice") == 0


async def test_run_job_runs_its_job_alone_and_leaves_the_follow_up_pending(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _prepare(conn)
    earlier = await _enqueue(conn, tenant, "tm_invoice", {"lines": [1]}, priority=0)
    run = await testing.run_job(dsn, "tm_chain", {"lines": [2, 3]}, tenant="acme")
    assert run.status == "done"
    pending = await testing.enqueued(conn, kind="tm_invoice", status="pending")
    assert [(job.id, job.payload) for job in pending] == [
        (earlier, {"lines": [1]}), (run.id + 1, {"lines": [2, 3]})]
    assert await scalar(conn, "SELECT count(*) FROM tm_invoice") == 0

    follow_up = await testing.run_pending(dsn, pending[1].id)
    assert (follow_up.status, follow_up.result) == ("done", {"total": 5})
    assert [job.status for job in await testing.enqueued(conn, kind="tm_invoice")] == [
        "pending", "done"]


@pytest.mark.parametrize(("tenant_key", "kind", "named"), [
    ("acme", "tm_invoice", "tenant acme, kind tm_invoice"),
    (None, "tm_invoice", "kind tm_invoice (every tenant)"),
    ("acme", None, "tenant acme (every kind)"),
])
async def test_run_pending_leaves_a_paused_job_as_a_worker_does_until_it_is_resumed(
    conn: Conn, dsn: str, tenant: uuid.UUID, tenant_key: str | None, kind: str | None,
    named: str,
) -> None:
    """Not due for an hour and paused: the call refuses, the job keeps its due time and its
    attempts; `drain` leaves it too. Once resumed it runs."""
    await _prepare(conn)
    due_at = datetime.now(UTC) + timedelta(hours=1)
    job_id = await _enqueue(conn, tenant, "tm_invoice", {"lines": [2]}, available_at=due_at)
    await pauses.pause(conn, tenant=tenant_key, kind=kind, actor="user:test")
    with pytest.raises(testing.JobPausedError,
                       match=rf"cannot run job {job_id}: it is paused \({re.escape(named)}\)"):
        await testing.run_pending(dsn, job_id)
    [job] = await testing.enqueued(conn, kind="tm_invoice")
    assert (job.status, job.attempts, job.available_at) == ("pending", 0, due_at)
    assert await testing.drain(dsn) == Counter()

    await pauses.resume(conn, tenant=tenant_key, kind=kind, actor="user:test")
    run = await testing.run_pending(dsn, job_id)
    assert (run.status, run.attempts, run.result) == ("done", 1, {"total": 2})


async def test_run_job_of_a_paused_pair_enqueues_the_job_and_leaves_it_pending(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _prepare(conn)
    await pauses.pause(conn, tenant="acme", kind="tm_invoice", actor="user:test")
    with pytest.raises(testing.JobPausedError, match="tenant acme, kind tm_invoice"):
        await testing.run_job(dsn, "tm_invoice", {"lines": [1]}, tenant="acme")
    [job] = await testing.enqueued(conn, kind="tm_invoice")
    assert (job.status, job.attempts) == ("pending", 0)
    assert await scalar(conn, "SELECT count(*) FROM tm_invoice") == 0


async def test_run_pending_runs_the_job_named_ahead_of_the_pairs_other_jobs(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Two jobs of the pair ahead of it (one before it in priority), one of another tenant
    first in priority: only the job named runs."""
    await _prepare(conn)
    globex = await add_tenant(conn, "globex")
    first = await _enqueue(conn, tenant, "tm_invoice", {"lines": [1]}, priority=0)
    second = await _enqueue(conn, tenant, "tm_invoice", {"lines": [2]})
    other = await _enqueue(conn, globex, "tm_invoice", {"lines": [3]}, priority=0)
    later = await _enqueue(conn, tenant, "tm_invoice", {"lines": [4]},
                           available_at=datetime.now(UTC) + timedelta(days=1))
    run = await testing.run_pending(dsn, later)
    assert (run.status, run.result) == ("done", {"total": 4})
    assert {job.id for job in await testing.enqueued(conn, status="pending")} == {
        first, second, other}


async def test_run_pending_runs_its_job_when_one_of_the_pair_is_enqueued_during_its_claim(
    conn: Conn, dsn: str, tenant: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of the pair enqueued (first in priority) after run_pending holds the pair's other
    jobs and before its claim: the enqueue waits for the claim, and only the job named runs."""
    await _prepare(conn)
    job_id = await _enqueue(conn, tenant, "tm_invoice", {"lines": [1]})
    claim = QueueStore.complete_and_claim
    intruders: list[asyncio.Task[int]] = []

    async def enqueue_first(self: QueueStore, *args: Any, **kwargs: Any) -> Any:
        if not intruders:  # between the hold and the claim
            async def intrude() -> int:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as side:
                    return await _enqueue(side, tenant, "tm_invoice", {"lines": [2]},
                                          priority=0)

            intruders.append(asyncio.create_task(intrude()))

            async def committed_or_waiting() -> bool:
                return intruders[0].done() or bool(await scalar(
                    conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                          " AND datname = current_database()"))

            await wait_until(committed_or_waiting, "the enqueue committed or waiting", 30)
        return await claim(self, *args, **kwargs)

    monkeypatch.setattr(QueueStore, "complete_and_claim", enqueue_first)
    run = await testing.run_pending(dsn, job_id)
    intruder = await intruders[0]
    assert (run.id, run.status, run.result) == (job_id, "done", {"total": 1})
    [left] = await testing.enqueued(conn, status="pending")
    assert (left.id, left.attempts) == (intruder, 0)


async def test_run_pending_runs_its_job_when_one_of_the_pair_turns_pending_during_its_claim(
    conn: Conn, dsn: str, tenant: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of the pair (first in priority) that another worker held while run_pending held
    the pair's pending jobs, and handed back before the claim: claimed instead, it is handed
    back unrun, its attempt not counted, and the job named runs."""
    await _prepare(conn)
    other = await _enqueue(conn, tenant, "tm_invoice", {"lines": [2]}, priority=0)
    job_id = await _enqueue(conn, tenant, "tm_invoice", {"lines": [1]})
    side = open_pool(dsn, size=1)
    await side.open()
    try:
        async with QueueStore(side, worker_id="elsewhere", actor="test") as elsewhere:
            [held] = await elsewhere.claim(kinds=["tm_invoice"], tenants=None, limit=1)
            assert held["id"] == other
            claim = QueueStore.complete_and_claim
            handed_back: list[bool] = []

            async def hand_back_first(self: QueueStore, *args: Any, **kwargs: Any) -> Any:
                if not handed_back:  # between the hold and the claim
                    handed_back.append(await elsewhere.release(other, held["attempts"]))
                return await claim(self, *args, **kwargs)

            monkeypatch.setattr(QueueStore, "complete_and_claim", hand_back_first)
            run = await testing.run_pending(dsn, job_id)
    finally:
        await side.close()
    assert handed_back == [True]
    assert (run.id, run.status, run.result) == (job_id, "done", {"total": 1})
    [left] = await testing.enqueued(conn, status="pending")
    assert (left.id, left.attempts) == (other, 0)
    assert await scalar(conn, "SELECT array_agg(job_id) FROM tm_invoice") == [job_id]


async def test_drain_runs_the_jobs_handlers_enqueue(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _prepare(conn)
    chained = await _enqueue(conn, tenant, "tm_chain", {"lines": [4, 4]})
    assert await testing.drain(dsn) == Counter({"done": 2})
    [follow_up] = await testing.enqueued(conn, kind="tm_invoice", tenant="acme")
    assert (follow_up.status, follow_up.result) == ("done", {"total": 8})
    assert [job.status for job in await testing.enqueued(conn, kind="tm_chain")] == ["done"]
    assert chained < follow_up.id
    assert await testing.drain(dsn) == Counter()


async def test_drain_never_waits_for_retries_or_delayed_jobs(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _prepare(conn)
    flaky_id = await _enqueue(conn, tenant, "tm_flaky", {})
    later = await _enqueue(conn, tenant, "tm_invoice", {"lines": [1]},
                           available_at=datetime.now(UTC) + timedelta(hours=1))
    await _enqueue(conn, tenant, "tm_reject", {})
    assert await testing.drain(dsn) == Counter({"retry": 1, "dlq": 1})
    jobs = {job.id: job for job in await testing.enqueued(conn, status="pending")}
    assert (jobs[flaky_id].attempts, jobs[later].attempts) == (1, 0)


async def test_drain_and_enqueued_take_tenant_filters(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _prepare(conn)
    globex = await add_tenant(conn, "globex")
    await add_tenant(conn, "initech")
    acme_job = await _enqueue(conn, tenant, "tm_invoice", {"lines": [1]})
    globex_job = await _enqueue(conn, globex, "tm_invoice", {"lines": [2]})
    await _enqueue(conn, globex, "tm_reject", {})

    assert await testing.drain(dsn, tenants=["globex"], kinds=["tm_invoice"]) == {"done": 1}
    assert [j.id for j in await testing.enqueued(conn, tenant="globex", status="done")] == [
        globex_job]
    assert [j.id for j in await testing.enqueued(conn, tenant=tenant, status="pending")] == [
        acme_job]
    assert await testing.drain(dsn, tenants=["initech"]) == {}
    assert await testing.drain(dsn, tenants=[tenant, str(globex).upper()]) == {"done": 1, "dlq": 1}
    assert {j.status for j in await testing.enqueued(conn, kind="tm_invoice")} == {"done"}


async def test_enqueued_sees_the_callers_uncommitted_jobs(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await _prepare(conn)
    async with conn.transaction(force_rollback=True):
        job_id = await _enqueue(conn, tenant, "tm_invoice", {"lines": [3]},
                                idempotency_key="order-1")
        [job] = await testing.enqueued(conn, kind="tm_invoice", tenant="acme")
        assert (job.id, job.status, job.idempotency_key) == (job_id, "pending", "order-1")
    assert await testing.enqueued(conn) == []


async def test_bad_arguments_name_the_problem(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await _prepare(conn)
    with pytest.raises(jobpool.UnknownKindError, match="'tm_missing'"):
        await testing.run_job(dsn, "tm_missing", {}, tenant="acme")
    with pytest.raises(jobpool.UnknownTenantError, match="'nobody'"):
        await testing.run_job(dsn, "tm_invoice", {"lines": []}, tenant="nobody")
    with pytest.raises(ValueError, match="payload"):
        await testing.run_job(dsn, "tm_invoice", {"lines": [float("nan")]}, tenant="acme")
    with pytest.raises(jobpool.JobNotFoundError, match="no job with id 424242"):
        await testing.run_pending(dsn, 424242)
    done = await testing.run_job(dsn, "tm_invoice", {"lines": [1]}, tenant="acme")
    with pytest.raises(jobpool.JobStateError, match=f"cannot run job {done.id}: it is done"):
        await testing.run_pending(dsn, done.id)
    with pytest.raises(jobpool.UnknownKindError, match="'tm_missing'"):
        await testing.drain(dsn, kinds=["tm_missing"])
    with pytest.raises(jobpool.UnknownTenantError, match="'nobody'"):
        await testing.drain(dsn, tenants=["acme", "nobody"])
    with pytest.raises(ValueError, match="tenants is empty"):
        await testing.drain(dsn, tenants=[])
    with pytest.raises(ValueError, match=r"status must be one of .* got 'finished'"):
        await testing.enqueued(conn, status="finished")
    with pytest.raises(jobpool.UnknownTenantError, match="'nobody'"):
        await testing.enqueued(conn, tenant="nobody")
    assert [job.status for job in await testing.enqueued(conn)] == ["done"]
