"""How long a stopped running job's handler takes to be interrupted, with the other slots busy.

    python3 bench/stop_latency.py [--stops 100] [--slots 4] [--tick-ms 20] [--poll-only]

One `jobpool run` worker serves `bench_stop_wait` (a handler that writes a row in its
transaction, then waits until cancelled) and `bench_stop_tick` (`--tick-ms` of work each, a
steady stream filling the other slots). `--stops` times, one wait job is enqueued; once its
handler waits, it is stopped (`jobpool.admin.stop`, the call `jobpool jobs stop` and the API
make) and the wall time from just before the call to the handler's CancelledError is taken.
Reported: p50, p99 and max of those, and checks: every stopped job `failed`, none of the
handlers' writes committed, no tick job failed. `--poll-only` runs the worker behind
`JOBPOOL_POOLER=transaction` without a LISTEN DSN (the stop arrives by lease renewal, every
third of `--lease-ttl`). Server: `JOBPOOL_BENCH_DSN`, a throw-away database of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _benchdb import bench_database  # noqa: E402
from common import child_env, migrate_with_kinds, percentile  # noqa: E402
from stop_kinds import STOP_DDL  # noqa: E402

import jobpool  # noqa: E402
from jobpool import admin  # noqa: E402

Conn = psycopg.AsyncConnection[dict[str, Any]]

TICKS = 20_000
"""Tick jobs enqueued at the start (in batches of 5,000): more than a run of 100 stops takes,
so the other slots stay busy."""


def start_worker(dsn: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    extra = {"JOBPOOL_DSN": dsn}
    if args.poll_only:
        extra["JOBPOOL_POOLER"] = "transaction"
    return subprocess.Popen(
        [sys.executable, "-m", "jobpool", "run", "--kinds", "bench_stop_wait,bench_stop_tick",
         "--slots", str(args.slots), "--import", "stop_kinds", "--log-level", "warning",
         "--metrics-port", "0", "--lease-ttl", str(args.lease_ttl)],
        env=child_env(**extra), stdout=subprocess.DEVNULL, text=True)


async def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return next(iter(row.values()))


async def one_stop(conn: Conn, tenant: Any) -> float:
    """Enqueue a wait job, stop it once its handler waits; seconds to its interruption."""
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="bench_stop_wait")).id
    while await scalar(conn, "SELECT count(*) FROM bench_stop_marks WHERE job_id = %s",
                       (job_id,)) == 0:
        await asyncio.sleep(0.01)
    before = time.time()
    await admin.stop(conn, job_id, actor="bench")
    while (at := await scalar(conn, "SELECT interrupted_at FROM bench_stop_marks"
                              " WHERE job_id = %s", (job_id,))) is None:
        await asyncio.sleep(0.005)
    return float(at) - before


async def measure(dsn: str, args: argparse.Namespace) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     row_factory=dict_row) as conn:
        await conn.execute(STOP_DDL)
        tenant = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('bench')"
                              " RETURNING id")
        for _ in range(TICKS // 5_000):
            await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "bench_stop_tick",
                                                             {"ms": args.tick_ms})] * 5_000)
        worker = start_worker(dsn, args)
        try:
            latencies = [await one_stop(conn, tenant) for _ in range(args.stops)]
        finally:
            worker.send_signal(signal.SIGTERM)
            await asyncio.to_thread(worker.wait, 60)
        checks = await (await conn.execute(
            "SELECT (SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'bench_stop_wait'"
            "         AND status <> 'failed') AS not_failed,"
            " (SELECT count(*) FROM bench_stop_writes) AS committed_writes,"
            " (SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'bench_stop_tick'"
            "         AND status = 'done') AS ticks_done,"
            " (SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'bench_stop_tick'"
            "         AND (status IN ('failed', 'dlq') OR attempts > 1)) AS ticks_disturbed"
        )).fetchone()
    assert checks is not None
    mode = "poll-only (lease renewal)" if args.poll_only else "LISTEN/NOTIFY"
    print(f"{args.stops} stops, {mode}, {args.slots} slots, ticks of {args.tick_ms:g} ms, lease "
          f"{args.lease_ttl:g} s (load {os.getloadavg()[0]:.1f})")
    print(f"stop to interrupted handler: p50 {percentile(latencies, 50) * 1000:.1f} ms, "
          f"p99 {percentile(latencies, 99) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    print(f"stopped jobs not failed {checks['not_failed']}, handler writes committed "
          f"{checks['committed_writes']}, tick jobs done {checks['ticks_done']}, tick jobs "
          f"failed or retried {checks['ticks_disturbed']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--stops", type=int, default=100)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--tick-ms", type=float, default=20.0)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--poll-only", action="store_true")
    args = parser.parse_args()
    with bench_database() as dsn:
        migrate_with_kinds(dsn, "stop_kinds")
        asyncio.run(measure(dsn, args))


if __name__ == "__main__":
    main()
