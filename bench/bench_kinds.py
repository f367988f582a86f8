"""The benchmark's job kinds for jobpool (loaded by workers with `--import bench_kinds`)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

import jobpool
from jobpool.job import Job

LATENCY_FILE = "BENCH_LATENCY_FILE"
"""Environment variable naming the file that `bench_latency` appends its latencies to."""


@jobpool.kind("bench_noop", max_attempts=3)
async def noop(job: Job, tx: AsyncConnection[Any]) -> None:
    """Do nothing (writes nothing: the job's `done` is all its transaction holds)."""


@jobpool.kind("bench_latency", max_attempts=3)
async def latency(job: Job, tx: AsyncConnection[Any]) -> None:
    """Append `now - payload.t0` (seconds, enqueue to start) to the latency file."""
    record_latency(job.payload)


WRITES_DDL = ("CREATE TABLE IF NOT EXISTS bench_writes "
              "(job_id bigint PRIMARY KEY, payload jsonb NOT NULL)")
"""The table `bench_write` jobs insert into (every system's install creates it); the key makes
a second insert for one job fail instead of hiding among the rows counted after a drain."""


@jobpool.kind("bench_write", max_attempts=3)
async def write(job: Job, tx: AsyncConnection[Any]) -> None:
    """Insert one row into `bench_writes` in the job's transaction (committed with its done)."""
    await tx.execute("INSERT INTO bench_writes (job_id, payload) VALUES (%s, %s)",
                     (job.id, Jsonb(job.payload)))


def record_latency(payload: Any) -> None:
    """Append one enqueue-to-start latency (wall clock, same host) to `$BENCH_LATENCY_FILE`."""
    started = time.time()
    if payload.get("warmup"):
        return
    with open(os.environ[LATENCY_FILE], "a", encoding="utf-8") as out:
        out.write(f"{started - float(payload['t0']):.6f}\n")


STARTS_DDL = "CREATE TABLE IF NOT EXISTS bench_starts (kind text NOT NULL, at timestamptz NOT NULL)"
"""The table `bench_rl_*` jobs record their start in (rate_limits.py creates it)."""


async def record_start(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record the job's start on the server's clock, in the job's transaction."""
    await tx.execute("INSERT INTO bench_starts (kind, at) VALUES (%s, clock_timestamp())",
                     (job.job_kind,))


@jobpool.kind("bench_rl_a", max_attempts=3)
async def rate_limited_a(job: Job, tx: AsyncConnection[Any]) -> None:
    """A rate-limited job: record its start."""
    await record_start(job, tx)


@jobpool.kind("bench_rl_b", max_attempts=3)
async def rate_limited_b(job: Job, tx: AsyncConnection[Any]) -> None:
    """The same for a second lane sharing a provider cap with bench_rl_a."""
    await record_start(job, tx)


RUNS_DDL = ("CREATE TABLE IF NOT EXISTS bench_runs "
            "(job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL)")
"""The table `bench_sleep` jobs record each committed run in (kill_recovery.py creates it)."""


@jobpool.kind("bench_sleep", max_attempts=20)
async def sleep(job: Job, tx: AsyncConnection[Any]) -> None:
    """Sleep `payload.ms` milliseconds, then record the run in the job's transaction."""
    await asyncio.sleep(float(job.payload["ms"]) / 1000)
    await tx.execute("INSERT INTO bench_runs (job_id, attempt, pid) VALUES (%s, %s, %s)",
                     (job.id, job.attempts, os.getpid()))
