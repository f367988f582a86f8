"""Job kinds used by the tests; worker subprocesses load them with `--import kinds_for_tests`."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from psycopg import AsyncConnection

import jobpool
from jobpool.job import Job


@jobpool.kind("test_record", max_attempts=3, stale_ttl=30.0)
async def record(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record this run in `test_runs` inside the job's transaction."""
    await tx.execute(
        "INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, %s)",
        (job.id, job.attempts, os.getpid()),
    )


@jobpool.kind("test_sleep", max_attempts=3, stale_ttl=3.0, backoff_base=1.0, backoff_max=1.0)
async def sleep(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Sleep `payload.seconds` (`payload.retry_seconds` after the first claim), then record."""
    first = job.attempts == 1 or "retry_seconds" not in job.payload
    await asyncio.sleep(float(job.payload["seconds" if first else "retry_seconds"]))
    await tx.execute(
        "INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, %s)",
        (job.id, job.attempts, os.getpid()),
    )
    return {"slept": job.payload.get("seconds", 1)}


@jobpool.kind("test_fail", max_attempts=2, backoff_base=2.0, backoff_max=2.0, backoff_jitter=0.0)
async def fail(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a row (which must roll back), then fail as `payload` says."""
    await tx.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, %s)",
                     (job.id, job.attempts, os.getpid()))
    if job.payload.get("permanent"):
        raise jobpool.PermanentError(job.payload.get("message", "permanent failure"))
    raise RuntimeError(job.payload.get("message", "transient failure"))


@jobpool.kind("test_env")
async def env(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Return the values of the environment variables `payload.names` in the worker process."""
    return {name: os.environ.get(name) for name in job.payload["names"]}


TEST_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS test_runs (
    job_id bigint NOT NULL, attempt int NOT NULL, worker_pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
