"""Queue maintenance, in one place: recovery of lapsed claims, retention, and their schedule.

Nothing here waits in the queue behind the work it maintains. Recovery (claims whose lease
lapsed go back to pending, or to the DLQ when out of attempts) runs every few seconds on every
long-running worker's lease thread (`jobpool.worker.leases`), one worker at a time
(`recovery_turn`). Every `cleanup_every` seconds (5 minutes by default) one worker, whichever
first finds the period over (`take_maintenance_turn`: no leader), runs the periodic steps:
done-job retention and whatever other kinds register with `cleanup_step` (the outbox's
compaction), each in its own transaction on a connection of its own. The `cleanup_jobs`
kind runs recovery and every step at once, for a job enqueued by hand. Its SQL is in
`sql/maintenance.sql`. `jobpool recover` runs the recovery at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import AsyncConnection

from jobpool import settings
from jobpool.db.connect import connect
from jobpool.db.queries import Many, One, Row
from jobpool.db.store import QueueStore
from jobpool.job import Job
from jobpool.registry import kind

DELETE_EXPIRED_DONE_JOBS = One("delete_expired_done_jobs")
RECOVER_STALE_CLAIMS = Many("recover_stale_claims")
TAKE_MAINTENANCE_TURN = One("take_maintenance_turn")

log = logging.getLogger(__name__)

DONE_RETENTION = 7 * 86_400.0
"""Seconds a done job is kept before cleanup deletes it."""
DELETE_BATCH = 5_000
MAX_BATCHES = 20
"""At most DELETE_BATCH x MAX_BATCHES rows per run; the next run takes the rest."""

SCHEDULE_CHECK_MAX = 60.0
"""Cap on the seconds between a worker's checks whether the periodic steps are due."""

Step = Callable[[AsyncConnection[Any]], Awaitable[dict[str, int]]]
_STEPS: list[tuple[str, Step]] = []


def cleanup_step(name: str) -> Callable[[Step], Step]:
    """Register `async def step(tx) -> {counter: n}` to run every maintenance period."""

    def register(step: Step) -> Step:
        _STEPS.append((name, step))
        return step

    return register


# -- store calls -------------------------------------------------------------------------


async def recover_stale_claims(conn: AsyncConnection[Any], *, actor: str) -> list[Row]:
    """Take back the claims whose lease lapsed, in `conn`'s transaction; return their
    (id, job_kind, status, attempts). `actor` is the audit principal of the DLQ moves."""
    return await RECOVER_STALE_CLAIMS(conn, {"actor": actor})


async def delete_expired_done_jobs(
    conn: AsyncConnection[Any], *, retention: float, batch: int
) -> int:
    """Delete up to `batch` done jobs older than `retention` seconds; return how many."""
    row = await DELETE_EXPIRED_DONE_JOBS(conn, {"retention": retention, "batch": batch})
    return int(row["deleted"]) if row else 0


async def take_maintenance_turn(conn: AsyncConnection[Any], task: str, every: float) -> bool:
    """Whether this worker takes the turn at `task` (it last ran `every` seconds ago or more).
    Commit at once: the other workers skip the turn from then on."""
    return await TAKE_MAINTENANCE_TURN(conn, {"task": task, "every": every}) \
        is not None


# -- the cleanup_jobs kind ---------------------------------------------------------------


async def recover(tx: AsyncConnection[Any]) -> dict[str, int]:
    """Recover lapsed claims: pending again, or DLQ when out of attempts; attempts unchanged."""
    rows = await recover_stale_claims(tx, actor=settings.current().service_account)
    log_recovered(rows)
    return {"recovered": sum(r["status"] == "pending" for r in rows),
            "dead_lettered": sum(r["status"] == "dlq" for r in rows)}


def log_recovered(rows: list[Row]) -> None:
    """One warning per recovered claim (`recover_stale_claims` rows)."""
    for row in rows:
        log.warning("recovered the lapsed claim of job %d (%s) -> %s", row["id"],
                    row["job_kind"], row["status"])


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
    """Recover lapsed claims and run every registered step in the job's transaction; return
    their counters. Workers run all of this on their own schedule: the kind is for running it
    now through the queue."""
    result = await recover(tx)
    for _, step in _STEPS:
        result.update(await step(tx))
    return result


# -- the schedule ------------------------------------------------------------------------


async def run_due_steps(dsn: str) -> dict[str, int]:
    """Run every registered step, each in its own transaction on a connection of its own (a
    step may take seconds: not on a connection the worker's jobs wait for). A step that fails
    is logged and the others run; the next period runs it again. Returns their counters."""
    result: dict[str, int] = {}
    async with await connect(dsn) as conn:
        for name, step in _STEPS:
            try:
                async with conn.transaction():
                    result.update(await step(conn))
            except psycopg.Error as exc:
                if conn.closed:
                    raise
                log.error("maintenance step %s failed (%s); it runs again next period", name,
                          exc)
    return result


async def keep_maintained(
    store: QueueStore, dsn: str, *, every: float, online: asyncio.Event, rng: random.Random,
    healthy: Callable[[], None], database_error: Callable[[psycopg.Error], None],
) -> None:
    """Run the periodic steps whenever this worker takes the turn at them, while `online` is
    set; never returns.

    Checks every min(60 s, every / 2), spread by ±20 % so that workers do not ask in step; the
    turn goes to the first worker that finds the last run `every` seconds old. Each check that
    got an answer calls `healthy()`; a failed connection goes to `database_error` (which pauses
    the worker until the database answers again). The store's pool is read at each check,
    since the worker replaces it after an outage.
    """
    while True:
        await online.wait()
        try:
            async with store.pool.connection() as conn:
                turn = await take_maintenance_turn(conn, "cleanup", every)
            if turn:
                counters = await run_due_steps(dsn)
                log.info("maintenance: %s", ", ".join(f"{k} {v}" for k, v in counters.items()))
            healthy()
        except psycopg.OperationalError as exc:
            database_error(exc)
        await asyncio.sleep(min(SCHEDULE_CHECK_MAX, every / 2) * rng.uniform(0.8, 1.2))
