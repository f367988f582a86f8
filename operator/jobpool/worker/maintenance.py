"""Queue maintenance, in one place: recovery of lapsed claims, retention, and their schedule.

Recovery (claims whose lease lapsed go back to pending, or to the DLQ when out of attempts)
runs every few seconds on every long-running worker's lease thread (`jobpool.worker.leases`),
one worker at a time (`recovery_turn`): it never waits in the queue behind the work it
maintains. The periodic steps (the worker's registry's: done-job retention and whatever other
kinds register with `jobpool.registry.cleanup_step`, the outbox's compaction) run at each
tick of the built-in schedule `cleanup_jobs` (every `cleanup_every` seconds, 5 minutes by
default), on the one worker that takes the tick (`jobpool.worker.scheduler`), each step in
its own transaction on a connection of its own: not through the queue, so that they never
wait behind the work they maintain. The `cleanup_jobs` kind runs recovery and every step at
once, for a job enqueued by hand. Its SQL is in `sql/maintenance.sql`. `jobpool recover`
runs the recovery at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection

from jobpool.core.schedules import BUILTIN_CLEANUP, cleanup_schedule
from jobpool.db.connect import connect
from jobpool.db.queries import Many, One, Row
from jobpool.db.store import OWN_ISOLATION, QueueStore
from jobpool.job import Job
from jobpool.registry import Step, cleanup_step, kind
from jobpool.settings import Settings
from jobpool.worker.scheduler import declarations_for, keep_scheduled

DELETE_EXPIRED_DONE_JOBS = One("delete_expired_done_jobs")
RECOVER_STALE_CLAIMS = Many("recover_stale_claims")

log = logging.getLogger(__name__)

DONE_RETENTION = 7 * 86_400.0
"""Seconds a done job is kept before cleanup deletes it."""
DELETE_BATCH = 5_000
MAX_BATCHES = 20
"""At most DELETE_BATCH x MAX_BATCHES rows per run; the next run takes the rest."""

Steps = Sequence[tuple[str, Step]]
"""Maintenance steps by name, as a registry holds them (`Registry.steps`)."""


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


# -- the cleanup_jobs kind ---------------------------------------------------------------


async def recover(tx: AsyncConnection[Any], *, actor: str) -> dict[str, int]:
    """Recover lapsed claims: pending again, or DLQ when out of attempts; attempts unchanged.
    `actor` is the audit principal of the DLQ moves."""
    rows = await recover_stale_claims(tx, actor=actor)
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
    """Recover lapsed claims and run every step of the worker's registry in the job's
    transaction; return their counters. Workers run the steps on the built-in schedule
    `cleanup_jobs`: the kind is for running them now through the queue."""
    result = await recover(tx, actor=job.context.actor)
    for _, step in job.context.registry.steps():
        result.update(await step(tx))
    return result


# -- the schedule ------------------------------------------------------------------------


async def run_due_steps(dsn: str, steps: Steps, *, transaction_pooler: bool) -> dict[str, int]:
    """Run `steps`, each in its own transaction on a connection of its own (a
    step may take seconds: not on a connection the worker's jobs wait for; nothing prepared
    on it with `transaction_pooler`, the worker's own setting). A step that fails is logged
    and the others run; the next period runs it again. Returns their counters."""
    result: dict[str, int] = {}
    async with await connect(dsn, transaction_pooler=transaction_pooler) as conn:
        await conn.set_isolation_level(OWN_ISOLATION)  # stated in each BEGIN
        for name, step in steps:
            try:
                async with conn.transaction():
                    result.update(await step(conn))
            except psycopg.Error as exc:
                if conn.closed:
                    raise
                log.error("maintenance step %s failed (%s); it runs again next period", name,
                          exc)
    log.info("maintenance: %s", ", ".join(f"{k} {v}" for k, v in result.items()))
    return result


async def keep_maintained(
    store: QueueStore, dsn: str, steps: Steps, *, settings: Settings, actor: str,
    every: float, online: asyncio.Event, rng: random.Random,
    healthy: Callable[[], None], database_error: Callable[[psycopg.Error], None],
) -> None:
    """Keep this worker's schedules going (`jobpool.worker.scheduler.keep_scheduled`): those of
    `settings.schedules` (`JOBPOOL_SCHEDULES`, for `settings.pool` in
    `settings.pool_namespace`), and the built-in
    `cleanup_jobs` every `every` seconds, whose tick runs the periodic `steps` on the worker
    that takes it (`run_due_steps`, on a connection of its own to `dsn`), never waiting in the
    queue; never returns. What it enqueues is audited as `actor`. `rng` is unused: the ticks
    are aligned on the schedule, not spread. Raises ScheduleError for a bad
    `JOBPOOL_SCHEDULES`."""
    del rng
    declarations = declarations_for(settings.pool, settings.pool_namespace,
                                    settings.schedules, [cleanup_schedule(every)])
    await keep_scheduled(store, declarations, actor=actor,
                         online=online, healthy=healthy, database_error=database_error,
                         actions={BUILTIN_CLEANUP: lambda: run_due_steps(
                             dsn, steps, transaction_pooler=store.transaction_pooler)})
