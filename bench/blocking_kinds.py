"""Job kinds of bench/blocking_handler.py (loaded by its workers with `--import
blocking_kinds`). Both lease for 6 s (their stale TTL caps the worker's lease)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from psycopg import AsyncConnection

import jobpool
from jobpool.db.connect import open_side_connection
from jobpool.job import Job

BLOCKING_DDL = """
CREATE TABLE IF NOT EXISTS bench_block_starts (
    job_id bigint NOT NULL, kind text NOT NULL, worker_pid int NOT NULL,
    started_at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS bench_block_ends (
    job_id bigint PRIMARY KEY, ended_at double precision NOT NULL);
"""
"""`bench_block_starts`: every start of a handler (wall clock, seconds; written on a side
connection, so a run whose result is later discarded still counts); `bench_block_ends`: the
end of each run whose outcome committed (in the job's transaction; the key makes a second
committed run fail loudly)."""

LEASE = 6.0
"""Seconds of the kinds' stale TTL, hence of each claim's lease."""


async def _mark_start(job: Job, tx: AsyncConnection[Any]) -> None:
    async with await open_side_connection(tx, application_name="bench block") as side:
        await side.execute("INSERT INTO bench_block_starts VALUES (%s, %s, %s, %s)",
                           (job.id, job.job_kind, os.getpid(), time.time()))


async def _mark_end(job: Job, tx: AsyncConnection[Any]) -> None:
    await tx.execute("INSERT INTO bench_block_ends VALUES (%s, %s)", (job.id, time.time()))


@jobpool.kind("bench_block", max_attempts=3, stale_ttl=LEASE, timeout=600.0)
async def block(job: Job, tx: AsyncConnection[Any]) -> None:
    """After `payload.after` seconds, block the event loop for `payload.seconds` (time.sleep
    in an async handler: the mistake this benchmark is about)."""
    await _mark_start(job, tx)
    await asyncio.sleep(float(job.payload["after"]))
    time.sleep(float(job.payload["seconds"]))
    await _mark_end(job, tx)


@jobpool.kind("bench_steady", max_attempts=3, stale_ttl=LEASE, timeout=600.0)
async def steady(job: Job, tx: AsyncConnection[Any]) -> None:
    """Wait `payload.seconds` without blocking (a well-behaved long job)."""
    await _mark_start(job, tx)
    await asyncio.sleep(float(job.payload["seconds"]))
    await _mark_end(job, tx)
