"""Rate limits against a real database and a real worker."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

import psycopg
import pytest

import jobpool
from jobpool.db.store import register_kinds
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.job import Job
from jobpool.registry import REGISTRY
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker
from jobpool.worker.token_store import TokenStore, load_provider_caps

Conn = psycopg.AsyncConnection[dict[str, Any]]
KIND = "test_rl_probe"
SENT: list[tuple[str, float]] = []


@jobpool.kind(KIND, max_attempts=3)
async def probe(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    SENT.append((str(job.tenant_id), time.monotonic()))
    await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def _clear_sent() -> None:
    SENT.clear()


async def add_tenant(conn: Conn, key: str, rate_limit: Any = None) -> uuid.UUID:
    metadata = {} if rate_limit is None else {"rate_limit": rate_limit}
    cur = await conn.execute(
        "INSERT INTO mdm.aa_tenant (key, metadata) VALUES (%s, %s::jsonb) RETURNING id",
        (key, json.dumps(metadata)))
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


async def enqueue(conn: Conn, batches: list[tuple[uuid.UUID, int]]) -> None:
    await register_kinds(conn, [REGISTRY.get(KIND)])
    jobs = [NewJob(tenant, KIND, {"n": n}) for tenant, count in batches for n in range(count)]
    await enqueue_many(conn, jobs, actor="test")


def worker_for(dsn: str, limiter: TokenStore | None = None, **settings: Any) -> Worker:
    config = WorkerConfig(kinds=(KIND,), slots=4, poll_interval=0.5, grace=5.0, **settings)
    return Worker(dsn, REGISTRY, config, actor="test", limiter=limiter)


async def run_for(worker: Worker, seconds: float) -> None:
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(seconds)
    worker.stop()
    await asyncio.wait_for(task, 30)


async def statuses(conn: Conn, tenant: uuid.UUID) -> dict[str, list[int]]:
    """Status -> list of attempts, for the tenant's jobs."""
    cur = await conn.execute(
        "SELECT status::text AS status, attempts FROM mdm.aa_job WHERE tenant_id = %s",
        (tenant,))
    found: dict[str, list[int]] = {}
    for row in await cur.fetchall():
        found.setdefault(row["status"], []).append(row["attempts"])
    return found


@pytest.mark.parametrize("prefetch", [0, 8])
async def test_a_throttled_tenant_waits_while_the_others_flow(dsn: str, conn: Conn,
                                                              prefetch: int) -> None:
    """Also with a prefetch buffer: a buffered job takes its token when it starts, so the
    limit and the requeues are those of a worker that claims only into free slots."""
    noisy = await add_tenant(conn, "noisy", {KIND: {"rps": 0.5, "burst": 1}})
    quiet = await add_tenant(conn, "quiet")
    await enqueue(conn, [(noisy, 5), (quiet, 50)])  # same transaction, noisy first in line
    worker = worker_for(dsn, prefetch=prefetch)

    await run_for(worker, 6.0)

    noisy_jobs = await statuses(conn, noisy)
    assert 2 <= len(noisy_jobs.get("done", [])) <= 4  # burst 1 + 0.5 rps x 6 s
    assert set(noisy_jobs) <= {"done", "pending"}  # none in the DLQ, none left running
    assert noisy_jobs["pending"] and set(noisy_jobs["pending"]) == {0}  # no attempt used up
    assert await statuses(conn, quiet) == {"done": [1] * 50}
    # requeues are a metric, not audit rows; the worker claims no more of the noisy pair than
    # it holds tokens for, so it seldom has one to requeue
    assert rate_limit_hits(worker, "noisy") <= 2
    cur = await conn.execute(
        "SELECT DISTINCT action::text AS action FROM mdm.aa_audit_log WHERE tenant_id = %s",
        (noisy,))
    assert {row["action"] for row in await cur.fetchall()} == {"job_enqueued", "job_done"}


def rate_limit_hits(worker: Worker, tenant: str, limit: str = "tenant") -> float:
    """Jobs of `tenant` the worker sent back to pending for want of a token."""
    return worker.metrics.registry.get_sample_value(
        "mdm_jobs_rate_limit_hits_total", {"tenant": tenant, "kind": KIND, "limit": limit}) or 0.0


async def test_a_limited_tenants_flood_is_not_claimed_to_be_requeued(dsn: str,
                                                                   conn: Conn) -> None:
    """A tenant at 1 job/s with 300 jobs queued ahead of another's: claims of up to 20 jobs
    (4 slots, a prefetch of 16) take one of the limited pair when its token is due, not
    half of each claim to send back to pending one by one."""
    flood = await add_tenant(conn, "flood", {KIND: {"rps": 1, "burst": 1}})
    other = await add_tenant(conn, "other")
    await enqueue(conn, [(flood, 300)])
    await enqueue(conn, [(other, 100)])
    worker = worker_for(dsn, prefetch=16)

    await run_for(worker, 4.0)

    flood_jobs = await statuses(conn, flood)
    assert 2 <= len(flood_jobs.get("done", [])) <= 6  # burst 1 + 1 rps x 4 s (+ the stop)
    assert await statuses(conn, other) == {"done": [1] * 100}
    assert rate_limit_hits(worker, "flood") <= 2  # a requeue is rare, not impossible
    cur = await conn.execute(
        "SELECT count(*) AS n FROM mdm.aa_job WHERE tenant_id = %s AND status = 'pending'"
        " AND available_at > now()", (flood,))
    row = await cur.fetchone()
    assert row is not None and row["n"] <= 2  # requeued jobs wait for their token


async def test_a_provider_cap_is_shared_by_every_tenant(dsn: str, conn: Conn) -> None:
    first = await add_tenant(conn, "first")
    second = await add_tenant(conn, "second")
    await enqueue(conn, [(first, 40), (second, 40)])
    caps = load_provider_caps(json.dumps(
        {"providers": {"ses": {"rps": 5, "burst": 5}}, "kinds": {KIND: "ses"}}))
    worker = worker_for(dsn, TokenStore(caps))

    await run_for(worker, 4.0)

    assert 10 <= len(SENT) <= 5 + 5 * 4
    assert {tenant for tenant, _ in SENT} == {str(first), str(second)}
    for tenant in (first, second):
        jobs = await statuses(conn, tenant)
        assert set(jobs) == {"done", "pending"}
        assert set(jobs["pending"]) == {0}
    # a claim takes no more of each tenant's pair than the provider's tokens: what one
    # tenant's jobs leave unused goes back to pending, not the rest of a claim of 20
    hits = sum(rate_limit_hits(worker, key, "provider") for key in ("first", "second"))
    assert 0 < hits <= 2 * len(SENT)


async def test_a_changed_limit_applies_without_a_restart(dsn: str, conn: Conn) -> None:
    tenant = await add_tenant(conn, "slow", {KIND: {"rps": 0.2, "burst": 1}})
    await enqueue(conn, [(tenant, 20)])
    worker = worker_for(dsn)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(1.5)
        assert len(SENT) == 1  # burst 1, the next token only after 5 s
        await conn.execute(
            "UPDATE mdm.aa_tenant SET metadata = jsonb_set(metadata, '{rate_limit}', %s::jsonb)"
            " WHERE id = %s", (json.dumps({KIND: {"rps": 50, "burst": 10}}), tenant))
        changed = time.monotonic()
        deadline = changed + 12.0  # refresh (2 s) + the longest parked requeue (5 s) + slack
        while len(SENT) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        # at the old 0.2 rps the other 19 jobs would need 95 s
        assert len(SENT) == 20
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert await statuses(conn, tenant) == {"done": [1] * 20}


async def test_an_invalid_limit_in_the_database_is_logged_and_ignored(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = await add_tenant(conn, "typo", {KIND: {"rps": "lots"}})
    await enqueue(conn, [(tenant, 8)])
    worker = Worker(dsn, REGISTRY, WorkerConfig(kinds=(KIND,), until_empty=True), actor="test")
    with caplog.at_level(logging.WARNING, logger="jobpool.ratelimit"):
        await asyncio.wait_for(worker.run(), 30)
    assert await statuses(conn, tenant) == {"done": [1] * 8}
    assert any(f"tenant typo: rate_limit.{KIND}.rps: must be a number" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("number", ["1e400", "1e5000"])
async def test_a_number_out_of_range_never_disables_the_other_limits(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture, number: str
) -> None:
    """1e400 is valid jsonb; Python reads it back as an int too large for a float (and 1e5000
    as one too long for int()). Only that entry is ignored, at start and at every refresh."""
    cur = await conn.execute(
        "INSERT INTO mdm.aa_tenant (key, metadata) VALUES ('huge', %s::jsonb) RETURNING id",
        (f'{{"rate_limit": {{"{KIND}": {{"rps": {number}}}, "*": {{"rps": 0.2}}}}}}',))
    huge = str((await cur.fetchone() or {})["id"])
    slow = await add_tenant(conn, "slow", {KIND: {"rps": 0.2, "burst": 1}})
    await enqueue(conn, [(slow, 10)])
    worker = worker_for(dsn)
    with caplog.at_level(logging.WARNING, logger="jobpool.ratelimit"):
        task = asyncio.create_task(worker.run())
        try:
            deadline = time.monotonic() + 20
            while not SENT and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            assert len(SENT) == 1  # slow's limit applies: burst 1, the next token after 5 s
            assert worker.limiter.tenants[huge].for_kind("other").rps == 0.2  # huge's "*" too
            await conn.execute(
                "UPDATE mdm.aa_tenant SET metadata = jsonb_set(metadata, '{rate_limit}', "
                "%s::jsonb) WHERE id = %s", (json.dumps({KIND: {"rps": 50, "burst": 10}}), slow))
            deadline = time.monotonic() + 20  # the refresh still runs, so the change applies
            while len(SENT) < 10 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert len(SENT) == 10
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)
    warnings = [r.getMessage() for r in caplog.records]
    assert any(f"tenant huge: rate_limit.{KIND}.rps: must be a number of tokens per second"
               in message for message in warnings), warnings


async def test_a_token_store_that_does_not_answer_holds_only_the_limited_jobs(
    dsn: str, conn: Conn
) -> None:
    """A transaction holding the bucket's row makes every lease wait: the worker gives up
    after lease_timeout, requeues the limited tenant's jobs (attempt not used) and keeps
    running the others; once the row is free the limited jobs run too."""
    limited = await add_tenant(conn, "limited", {KIND: {"rps": 100, "burst": 100}})
    free = await add_tenant(conn, "free")
    await enqueue(conn, [(limited, 20), (free, 40)])
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute(  # uncommitted: a lease's INSERT ... ON CONFLICT waits on it
            "INSERT INTO mdm.aa_rate_bucket (key, rps, burst, tokens, taken, updated_at)"
            " VALUES (%s, 100, 100, 100, 1, now())", (f"tenant/{limited}/{KIND}",))
        worker = worker_for(dsn, TokenStore(lease_timeout=0.3))
        task = asyncio.create_task(worker.run())
        try:
            async def hits() -> float:
                return worker.metrics.registry.get_sample_value(
                    "mdm_jobs_rate_limit_hits_total",
                    {"tenant": "limited", "kind": KIND, "limit": "tenant"}) or 0.0

            deadline = time.monotonic() + 30
            while ((await statuses(conn, free)).get("done") != [1] * 40 or await hits() < 2
                   ) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert await statuses(conn, free) == {"done": [1] * 40}
            assert await statuses(conn, limited) == {"pending": [0] * 20}
            assert await hits() >= 2
            await holder.commit()
            deadline = time.monotonic() + 30
            while ((await statuses(conn, limited)).get("done") != [1] * 20
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.1)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)
    assert await statuses(conn, limited) == {"done": [1] * 20}
    active = await conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active'"
        " AND datname = current_database() AND query LIKE '%%aa_rate_bucket%%'"
        " AND pid <> pg_backend_pid()")
    assert (await active.fetchone() or {})["n"] == 0  # the abandoned leases were cancelled
