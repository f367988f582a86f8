"""Queue maintenance, in one place: the `cleanup_jobs` kind and the loop that schedules it.

Every `cleanup_every` seconds (5 minutes by default) one `cleanup_jobs` job runs, however
many workers serve the kind: each worker serving it keeps the current slot's job enqueued
(`keep_cleanup_scheduled`), and the slot's idempotency key lets only the first one in. The
job runs every registered step in its own transaction: stale-claim recovery (claims whose
lease expired go back to pending, or to the DLQ when out of attempts), done-job retention,
and whatever other kinds register with `cleanup_step` (the outbox's compaction). Its SQL is
in `sql/maintenance.sql`. `jobpool recover` runs the recovery step at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from jobpool import settings
from jobpool.db.store import QueueStore, Row, fetch_all, fetch_one
from jobpool.job import Job
from jobpool.registry import kind

log = logging.getLogger(__name__)

DONE_RETENTION = 7 * 86_400.0
"""Seconds a done job is kept before cleanup deletes it."""
DELETE_BATCH = 5_000
MAX_BATCHES = 20
"""At most DELETE_BATCH x MAX_BATCHES rows per run; the next run takes the rest."""

SCHEDULE_CHECK_MAX = 60.0
"""Cap on the seconds between a worker's checks that the current slot's job exists."""

Step = Callable[[AsyncConnection[Any]], Awaitable[dict[str, int]]]
_STEPS: list[tuple[str, Step]] = []


def cleanup_step(name: str) -> Callable[[Step], Step]:
    """Register `async def step(tx) -> {counter: n}` to run in every cleanup job."""

    def register(step: Step) -> Step:
        _STEPS.append((name, step))
        return step

    return register


# -- store calls -------------------------------------------------------------------------


async def recover_stale_claims(conn: AsyncConnection[Any], *, actor: str) -> list[Row]:
    """Take back the claims whose lease expired, in `conn`'s transaction; return their
    (id, job_kind, status, attempts). `actor` is the audit principal of the DLQ moves."""
    return await fetch_all(conn, "recover_stale_claims", {"actor": actor})


async def delete_expired_done_jobs(
    conn: AsyncConnection[Any], *, retention: float, batch: int
) -> int:
    """Delete up to `batch` done jobs older than `retention` seconds; return how many."""
    row = await fetch_one(conn, "delete_expired_done_jobs",
                          {"retention": retention, "batch": batch})
    return int(row["deleted"]) if row else 0


async def schedule_cleanup(pool: AsyncConnectionPool[Any], every: float) -> int | None:
    """Enqueue the cleanup job of the current `every`-second slot unless it exists; return
    its id if this call enqueued it."""
    async with pool.connection() as conn:
        row = await fetch_one(conn, "schedule_cleanup", {"every": every})
    return None if row is None else row["id"]


# -- the cleanup_jobs kind ---------------------------------------------------------------


@cleanup_step("recover")
async def recover(tx: AsyncConnection[Any]) -> dict[str, int]:
    """Recover stale claims: pending again, or DLQ when out of attempts; attempts unchanged."""
    rows = await recover_stale_claims(tx, actor=settings.current().service_account)
    for row in rows:
        log.warning("recovered stale claim of job %d (%s) -> %s", row["id"], row["job_kind"],
                    row["status"])
    return {"recovered": sum(r["status"] == "pending" for r in rows),
            "dead_lettered": sum(r["status"] == "dlq" for r in rows)}


@cleanup_step("retention")
async def expire_done_jobs(tx: AsyncConnection[Any]) -> dict[str, int]:
    """Delete done jobs past the retention period, in batches."""
    total = 0
    for _ in range(MAX_BATCHES):
        deleted = await delete_expired_done_jobs(tx, retention=DONE_RETENTION, batch=DELETE_BATCH)
        total += deleted
        if deleted < DELETE_BATCH:
            break
    return {"done_deleted": total}


@kind("cleanup_jobs", priority=100, max_attempts=3, stale_ttl=10 * 60, timeout=5 * 60,
      backoff_base=30, backoff_max=24 * 3600, backoff_jitter=0.1)
async def cleanup_jobs(job: Job, tx: AsyncConnection[Any]) -> dict[str, int]:
    """Run every registered cleanup step in the job's transaction; return their counters."""
    result: dict[str, int] = {}
    for _, step in _STEPS:
        result.update(await step(tx))
    return result


# -- the schedule ------------------------------------------------------------------------


async def keep_cleanup_scheduled(
    store: QueueStore, *, every: float, online: asyncio.Event, rng: random.Random,
    healthy: Callable[[], None], database_error: Callable[[psycopg.Error], None],
) -> None:
    """Make sure the current slot's `cleanup_jobs` job exists, while `online` is set; never
    returns.

    Checks every min(60 s, every / 2), spread by ±20 % so that workers do not ask in step.
    Each check that got an answer calls `healthy()`; a failed connection goes to
    `database_error` (which pauses the worker until the database answers again). The store's
    pool is read at each check, since the worker replaces it after an outage.
    """
    while True:
        await online.wait()
        try:
            job_id = await schedule_cleanup(store.pool, every)
            if job_id is not None:
                log.info("scheduled cleanup_jobs job %d", job_id)
            healthy()
        except psycopg.OperationalError as exc:
            database_error(exc)
        await asyncio.sleep(min(SCHEDULE_CHECK_MAX, every / 2) * rng.uniform(0.8, 1.2))
