"""Job kinds of bench/stop_latency.py (loaded by its worker with `--import stop_kinds`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from psycopg import AsyncConnection

import jobpool
from jobpool.job import Job

STOP_DDL = """
CREATE TABLE IF NOT EXISTS bench_stop_marks (
    job_id bigint PRIMARY KEY, started_at double precision, interrupted_at double precision);
CREATE TABLE IF NOT EXISTS bench_stop_writes (job_id bigint PRIMARY KEY);
"""
"""`bench_stop_marks`: when each stopped handler started waiting and when it was interrupted
(wall clock, seconds; written on a side connection, so they commit); `bench_stop_writes`: the
rows the handlers wrote in their own transaction (none may commit)."""


@jobpool.kind("bench_stop_wait", max_attempts=1, timeout=3600.0, stale_ttl=3600.0)
async def stop_wait(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a row in the job's transaction, mark the start, wait until cancelled; mark the
    moment of the cancellation."""
    await tx.execute("INSERT INTO bench_stop_writes (job_id) VALUES (%s)", (job.id,))
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
        await side.execute("INSERT INTO bench_stop_marks (job_id, started_at) VALUES (%s, %s)",
                           (job.id, time.time()))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            interrupted = time.time()
            await side.execute("UPDATE bench_stop_marks SET interrupted_at = %s"
                               " WHERE job_id = %s", (interrupted, job.id))
            raise


@jobpool.kind("bench_stop_tick", max_attempts=1, priority=200)
async def stop_tick(job: Job, tx: AsyncConnection[Any]) -> None:
    """Work `payload.ms` milliseconds: the other slots' jobs, which a stop must not disturb."""
    await asyncio.sleep(float(job.payload["ms"]) / 1000)
