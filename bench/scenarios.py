"""The scenarios: drain (of no-op or writing jobs), latency, enqueue (single, batch,
concurrent with NOTIFY)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
import time
from typing import Any

from common import (
    PREFIX,
    child_env,
    children_cpu,
    drop_database,
    durability,
    load,
    percentile,
    recreate_database,
    run_children,
    server_cpu,
    transactions,
)
from systems import SYSTEMS, System, now


def template(system: System) -> str:
    """A migrated template database of `system` (created fresh once per run)."""
    name = f"{PREFIX}{system.name}_tpl"
    dsn = recreate_database(name)
    asyncio.run(system.install(dsn))
    return name


def fresh(system: System, tpl: str, label: str) -> tuple[str, str]:
    """A fresh copy of the template: (database name, DSN)."""
    name = f"{PREFIX}{system.name}_{label}"
    return name, recreate_database(name, tpl)


def enqueue_drain_jobs(system: System, dsn: str, kind: str, jobs: int) -> None:
    """Enqueue `jobs` jobs of `kind` for a drain: `bench_noop` with payload `{}`, `bench_write`
    with `{"n": i}` (its handler inserts one row into `bench_writes`), in batches of 5,000."""
    payloads = [{"n": i} for i in range(jobs)] if kind == "bench_write" else [{}] * jobs
    asyncio.run(system.enqueue(dsn, kind, payloads, 5000))


def drain(system: System, tpl: str, jobs: int, concurrency: int,
          processes: int = 1, kind: str = "bench_noop", profile: str = "default"
          ) -> dict[str, Any]:
    """Enqueue `jobs` jobs of `kind`, then time `processes` worker processes draining them,
    configured by `profile` (`System.worker`). The same processes run first on the empty
    queue, and their wall and CPU time there (start-up and exit: about a second for a Python
    worker, milliseconds for a Go one) is subtracted: the figures are the drain's own, the
    same for a system that starts fast and one that starts slowly (`startup_s` keeps it).

    `kind` is `bench_noop` (payload `{}`) or `bench_write` (payload `{"n": i}`; each job inserts
    one row into `bench_writes`). Raises RuntimeError if a `bench_write` drain leaves other
    than `jobs` rows: a drain whose handlers silently wrote nothing would measure nothing; if
    it leaves a job unfinished, or the system records other than `jobs` jobs finished
    (`System.done_sql`): a worker that exits before its last completions are written, or
    that drops jobs, cannot pass for a fast one.
    """
    name, dsn = fresh(system, tpl, "drain")
    argvs = system.workers(dsn, "drain", concurrency, processes, kind, profile)
    idle_seconds, idle_cpu, idle_server = _run_workers(argvs)  # start-up and exit alone
    enqueue_drain_jobs(system, dsn, kind, jobs)
    before = transactions(name)
    load_before = load()
    total_seconds, total_cpu, total_server = _run_workers(argvs)
    after = transactions(name)
    subtracted = total_seconds - idle_seconds > total_seconds / 10
    if not subtracted:  # a drain as short as a start-up: not subtracted, never inflated
        print(f"bench: {system.name}'s drain of {jobs} took {total_seconds:.2f} s, its empty "
              f"run {idle_seconds:.2f} s: start-up not subtracted (use more --jobs)", flush=True)
        idle_seconds, idle_cpu, idle_server = 0.0, 0.0, 0.0
    elapsed = total_seconds - idle_seconds
    worker_cpu = total_cpu - idle_cpu
    server = (total_server - idle_server
              if total_server is not None and idle_server is not None else None)
    left = count_rows(dsn, system.unfinished_sql)
    written = count_rows(dsn, "SELECT count(*) FROM bench_writes")
    finished = count_rows(dsn, system.done_sql) if system.done_sql else None
    sync = _setting(dsn, "synchronous_commit")
    drop_database(name)
    if durability() not in (None, sync):
        raise RuntimeError(f"{system.name}: its database committed with synchronous_commit "
                           f"{sync}, not the run's {durability()}")
    if finished is not None and finished != jobs:
        raise RuntimeError(f"{system.name}: a drain of {jobs} {kind} jobs at concurrency "
                           f"{concurrency} ({profile}) recorded {finished} finished")
    if kind == "bench_write" and written != jobs:
        raise RuntimeError(f"{system.name}: {jobs} bench_write jobs drained at concurrency "
                           f"{concurrency} ({profile}) inserted {written} rows")
    if left:
        raise RuntimeError(f"{system.name}: a drain of {jobs} {kind} jobs at concurrency "
                           f"{concurrency} ({profile}) left {left} unfinished")
    return {"system": system.name, "kind": kind, "concurrency": concurrency, "profile": profile,
            "processes": processes, "jobs": jobs,
            "seconds": elapsed, "startup_s": idle_seconds, "jobs_per_s": jobs / elapsed,
            "xacts_per_job": (after - before) / jobs, "left": left, "written": written,
            "finished": finished, "synchronous_commit": sync,
            "worker_cpu_us_per_job": worker_cpu / jobs * 1e6,
            "server_cpu_us_per_job": server / jobs * 1e6 if server is not None
            else float("nan"),
            "load": [load_before, load()]}


def _run_workers(argvs: list[list[str]]) -> tuple[float, float, float | None]:
    """Run a drain's worker processes to their end: (wall seconds, their CPU seconds, the
    server's CPU seconds or None)."""
    cpu_before, server_before = children_cpu(), server_cpu()
    seconds = run_children(argvs, child_env(), timeout=3600)
    server_after = server_cpu()
    server = (server_after - server_before
              if server_after is not None and server_before is not None else None)
    return seconds, children_cpu() - cpu_before, server


def count_rows(dsn: str, query: str) -> int:
    """The count a `SELECT count(*) ...` query returns on `dsn`."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else -1


def _setting(dsn: str, name: str) -> str:
    """The value of setting `name` a new connection to `dsn` gets."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else "?"


def latency(system: System, tpl: str, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue one job at a time at `rate`/s to idle default workers; enqueue-to-start."""
    name, dsn = fresh(system, tpl, "latency")
    with tempfile.NamedTemporaryFile("r", suffix=".lat", delete=False) as handle:
        path = handle.name
    worker = subprocess.Popen(
        system.worker(dsn, "serve", system.default_concurrency),
        env=child_env(BENCH_LATENCY_FILE=path), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        asyncio.run(_paced(system, dsn, rate, seconds))
        time.sleep(2.0)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.communicate()
    with open(path, encoding="utf-8") as results:
        values = [float(line) * 1000 for line in results if line.strip()]
    os.unlink(path)
    drop_database(name)
    expected = int(rate * seconds)
    return {"system": system.name, "rate": rate, "jobs": expected, "started": len(values),
            "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
            "max_ms": max(values, default=0.0), "load": load()}


async def _paced(system: System, dsn: str, rate: float, seconds: float) -> None:
    one, close = await system.single(dsn)
    try:
        await asyncio.sleep(3.0)  # the worker starts and listens
        for _ in range(20):
            await one("bench_latency", {"t0": now(), "warmup": True})
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        start = time.monotonic()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await one("bench_latency", {"t0": now()})
    finally:
        await close()


def enqueue_single(system: System, tpl: str, jobs: int) -> dict[str, Any]:
    """One client enqueueing one job per transaction."""
    name, dsn = fresh(system, tpl, "enq1")

    async def go() -> float:
        one, close = await system.single(dsn)
        try:
            started = time.monotonic()
            for _ in range(jobs):
                await one("bench_noop", {})
            return time.monotonic() - started
        finally:
            await close()

    elapsed = asyncio.run(go())
    drop_database(name)
    return {"system": system.name, "jobs": jobs, "jobs_per_s": jobs / elapsed, "load": load()}


def enqueue_batch(system: System, tpl: str, jobs: int, batch: int) -> dict[str, Any]:
    """One client enqueueing `batch` jobs per call."""
    name, dsn = fresh(system, tpl, "enqb")
    started = time.monotonic()
    asyncio.run(system.enqueue(dsn, "bench_noop", [{}] * jobs, batch))
    elapsed = time.monotonic() - started
    drop_database(name)
    return {"system": system.name, "jobs": jobs, "batch": batch, "jobs_per_s": jobs / elapsed,
            "load": load()}


def enqueue_concurrent(tpl: str, clients: int, jobs: int, notify: bool) -> dict[str, Any]:
    """`clients` connections each enqueueing single jobs (jobpool), with or without NOTIFY."""
    import psycopg
    from psycopg.rows import dict_row
    from systems import BENCH_TENANT

    import jobpool

    system = SYSTEMS["jobpool"]
    name, dsn = fresh(system, tpl, "enqc")

    async def client(count: int) -> None:
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=dict_row) as conn:
            for _ in range(count):
                await jobpool.enqueue_many(conn, [jobpool.NewJob(BENCH_TENANT, "bench_noop")],
                                           notify=notify)

    async def go() -> float:
        started = time.monotonic()
        await asyncio.gather(*(client(jobs // clients) for _ in range(clients)))
        return time.monotonic() - started

    elapsed = asyncio.run(go())
    drop_database(name)
    return {"system": "jobpool", "clients": clients, "notify": notify,
            "jobs": jobs // clients * clients,
            "jobs_per_s": jobs // clients * clients / elapsed, "load": load()}
