"""Steady state: a producer offering a share of a system's own drain capacity for minutes, with
a phase in which another session holds a snapshot open (a REPEATABLE READ transaction that has
read the job table), so that no row deleted or updated since can be vacuumed away.

Per minute: the rate offered and the rate started, enqueue-to-start p50/p99/p99.9, the job
table's size (table + indexes) and its dead tuples; over the run: the share of the offered
rate held, the p99 before and during the snapshot, the seconds after the snapshot's release
until the p99 is back (`recovery_s`), and the worker's and PostgreSQL's CPU per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg
from common import child_env, children_cpu, drop_database, load, server_cpu
from scenarios import fresh
from steady_figures import summary
from systems import System, now

TICK = 0.01
"""Seconds between the producer's enqueues (each enqueues what is due by then, in one call)."""
SAMPLE = 5.0
"""Seconds between samples of the job table's size and dead tuples."""


def steady(system: System, tpl: str, rate: float, minutes: float, hold_at: float,
           hold: float, concurrency: int, profile: str = "default",
           retention: float | None = None) -> dict[str, Any]:
    """Run one worker of `system` (`serve` at `concurrency`, `profile`) while a producer
    enqueues `rate` jobs/s of `bench_latency` for `minutes`; from minute `hold_at` for `hold`
    minutes another session holds a snapshot open. `retention` (seconds, jobpool only): every
    `SAMPLE` seconds delete its done jobs older than that, as its maintenance's retention step
    does (default 7 days, longer than any run). Returns the figures (see the module).

    A system that falls behind the offered rate is reported, not refused: `unstarted` counts
    the jobs not started within a minute of the producer's end, and `held` and the minutes'
    `started_per_s` say how far behind it fell. Raises RuntimeError if the worker exits early
    or started nothing."""
    if hold_at + hold > minutes:
        raise ValueError(f"the snapshot (from minute {hold_at:g}, for {hold:g}) must end "
                         f"within the run's {minutes:g} minutes")
    name, dsn = fresh(system, tpl, "steady")
    with tempfile.NamedTemporaryFile("r", suffix=".lat", delete=False) as handle:
        path = handle.name
    cpu_before, server_before = children_cpu(), server_cpu()
    worker = subprocess.Popen(
        system.worker(dsn, "serve", concurrency, "bench_noop", profile),
        env=child_env(BENCH_LATENCY_FILE=path), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        figures = asyncio.run(_run(system, dsn, path, worker, rate, minutes * 60,
                                   hold_at * 60, hold * 60, retention))
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            _, stderr = worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, stderr = worker.communicate()
        os.unlink(path)
        drop_database(name)
    worker_cpu, server_after = children_cpu() - cpu_before, server_cpu()
    started = figures["started"]
    if not started:
        raise RuntimeError(f"{system.name}: {figures['sent']} jobs enqueued at {rate:.0f}/s, "
                           f"none started (worker: {stderr[-2000:]})")
    if started < figures["sent"]:  # the rate was not held: the figures say by how much
        print(f"{system.name}: {figures['sent']} jobs enqueued at {rate:.0f}/s, only {started} "
              "started within a minute of the producer's end", file=sys.stderr)
    return {**figures, "unstarted": figures["sent"] - started, "system": system.name,
            "profile": profile, "concurrency": concurrency,
            "rate": rate, "minutes": minutes, "hold_at": hold_at, "hold": hold,
            "worker_cpu_us_per_job": worker_cpu / started * 1e6,
            "server_cpu_us_per_job": (server_after - server_before) / started * 1e6
            if server_after is not None and server_before is not None else float("nan"),
            "load": load()}


async def _run(system: System, dsn: str, path: str, worker: subprocess.Popen[str], rate: float,
               seconds: float, hold_at: float, hold: float,
               retention: float | None) -> dict[str, Any]:
    many, close = await system.producer(dsn)
    try:
        await asyncio.sleep(3.0)  # the worker starts and listens
        await many("bench_latency", [{"t0": now(), "warmup": True}] * 20)
        await asyncio.sleep(1.0)
        start = time.monotonic()
        sent: list[int] = []  # jobs enqueued in each second
        latencies: list[list[float]] = []  # enqueue-to-start (ms) of the jobs started each second
        tables: list[tuple[float, int, int]] = []  # (second, bytes, dead tuples)
        reader = _Lines(path)

        def read() -> None:
            second = int(time.monotonic() - start)
            while len(latencies) <= second:
                latencies.append([])
            latencies[second].extend(reader.new())

        async def produce() -> None:
            done = 0
            while (elapsed := time.monotonic() - start) < seconds:
                if sampler.done():
                    await sampler  # raises what ended it (the worker's exit)
                due = int(rate * elapsed) - done
                if due > 0:
                    await many("bench_latency", [{"t0": now()}] * due)
                    done += due
                    second = int(elapsed)
                    sent.extend([0] * (second + 1 - len(sent)))
                    sent[second] += due
                await asyncio.sleep(TICK)

        async def sample() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                last = -SAMPLE
                while True:
                    if worker.poll() is not None:
                        raise RuntimeError(f"{system.name}: the worker exited "
                                           f"{worker.returncode} during the run")
                    read()
                    elapsed = time.monotonic() - start
                    if elapsed - last >= SAMPLE:
                        last = elapsed
                        if retention is not None and system.name == "jobpool":
                            await _delete_done(dsn, retention)
                        tables.append((elapsed, *await _table(conn, system.job_table)))
                    await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample())
        holder = asyncio.create_task(_hold_snapshot(dsn, system.job_table, hold_at, hold))
        await produce()
        await holder
        deadline = time.monotonic() + 60
        while sum(map(len, latencies)) < sum(sent) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        read()
    finally:
        await close()
    return summary(latencies, sent, tables, seconds, hold_at, hold)


async def _hold_snapshot(dsn: str, table: str, at: float, hold: float) -> None:
    """From `at` seconds on, hold a REPEATABLE READ snapshot on `dsn` for `hold` seconds."""
    await asyncio.sleep(at)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await conn.execute(f"SELECT count(*) FROM {table}")  # the snapshot is taken here
        await asyncio.sleep(hold)
        await conn.rollback()


async def _delete_done(dsn: str, retention: float) -> None:
    """jobpool's retention step: delete its done jobs older than `retention` seconds."""
    from psycopg.rows import dict_row

    from jobpool.worker.maintenance import delete_expired_done_jobs

    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
        while True:
            async with conn.transaction():
                deleted = await delete_expired_done_jobs(conn, retention=retention, batch=5000)
            if deleted < 5000:
                return


async def _table(conn: psycopg.AsyncConnection[Any], table: str) -> tuple[int, int]:
    """(table + index bytes, dead tuples) of `table`."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(
        "SELECT pg_total_relation_size(%s::regclass), coalesce((SELECT n_dead_tup FROM "
        "pg_stat_user_tables WHERE relid = %s::regclass), 0)", (table, table))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


class _Lines:
    """The complete lines a worker appended to a latency file since the last call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[float]:
        """The new latencies, in milliseconds (a line not yet complete waits for the next)."""
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [float(line) * 1000 for line in complete.split() if line]
