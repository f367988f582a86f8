"""cleanup_jobs: stale-claim recovery and done-job retention, every 5 minutes.

Spec "Stale-Claim-Recovery".

Other maintenance (outbox compaction) registers a step with `cleanup_step`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg import AsyncConnection

import jobpool
from jobpool import settings
from jobpool.db.store import delete_expired_done_jobs, recover_stale_claims
from jobpool.job import Job

log = logging.getLogger(__name__)

DONE_RETENTION = 7 * 86_400.0
"""Seconds a done job is kept before cleanup deletes it."""
DELETE_BATCH = 5_000
MAX_BATCHES = 20
"""At most DELETE_BATCH x MAX_BATCHES rows per run; the next run takes the rest."""

Step = Callable[[AsyncConnection[Any]], Awaitable[dict[str, int]]]
_STEPS: list[tuple[str, Step]] = []


def cleanup_step(name: str) -> Callable[[Step], Step]:
    """Register `async def step(tx) -> {counter: n}` to run in every cleanup job."""

    def register(step: Step) -> Step:
        _STEPS.append((name, step))
        return step

    return register


async def recover(tx: AsyncConnection[Any]) -> dict[str, int]:
    """Recover stale claims: pending again, or DLQ when out of attempts; attempts unchanged."""
    rows = await recover_stale_claims(tx, actor=settings.current().service_account)
    for row in rows:
        log.warning("recovered stale claim of job %d (%s) -> %s", row["id"], row["job_kind"],
                    row["status"])
    return {"recovered": sum(r["status"] == "pending" for r in rows),
            "dead_lettered": sum(r["status"] == "dlq" for r in rows)}


async def expire_done_jobs(tx: AsyncConnection[Any]) -> dict[str, int]:
    """Delete done jobs past the retention period, in batches."""
    total = 0
    for _ in range(MAX_BATCHES):
        deleted = await delete_expired_done_jobs(tx, retention=DONE_RETENTION, batch=DELETE_BATCH)
        total += deleted
        if deleted < DELETE_BATCH:
            break
    return {"done_deleted": total}


cleanup_step("recover")(recover)
cleanup_step("retention")(expire_done_jobs)


@jobpool.kind("cleanup_jobs", priority=100, max_attempts=3, stale_ttl=10 * 60, timeout=5 * 60,
              backoff_base=30, backoff_max=24 * 3600, backoff_jitter=0.1)
async def cleanup_jobs(job: Job, tx: AsyncConnection[Any]) -> dict[str, int]:
    """Run every registered cleanup step in the job's transaction; return their counters."""
    result: dict[str, int] = {}
    for _, step in _STEPS:
        result.update(await step(tx))
    return result
