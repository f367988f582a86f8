"""Schedules under a race: worker processes and bare schedulers share a 1-second schedule.

Starts `--workers` `jobpool run` processes (each checks the schedules on its maintenance
timer and runs the jobs) and `--schedulers` processes that only enqueue due ticks, all given
the same 1-second schedule through JOBPOOL_SCHEDULES, lets them race for `--seconds`, stops
them, and counts: jobs per tick (idempotency key), ticks from the first to the last, ticks
left out. Exactly once means jobs == ticks == covered and no gap.

    python bench/schedule_race.py --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
from _benchdb import bench_database

SCHEDULE = [{"name": "race", "kind": "cleanup_jobs", "every": 1}]


def child_env(dsn: str) -> dict[str, str]:
    return {**os.environ, "JOBPOOL_DSN": dsn, "JOBPOOL_POOL": "race",
            "JOBPOOL_SCHEDULES": json.dumps(SCHEDULE), "JOBPOOL_LOG_LEVEL": "warning",
            "JOBPOOL_METRICS_PORT": "0"}


async def scheduler(dsn: str) -> None:
    """Enqueue due ticks until SIGTERM, as a worker's maintenance timer does."""
    from jobpool.core.schedules import cleanup_schedule
    from jobpool.db.connect import open_pool
    from jobpool.worker.scheduler import declarations_for, keep_scheduled

    pool = open_pool(dsn, size=1)
    await pool.open()
    online = asyncio.Event()
    online.set()
    store: Any = type("Store", (), {"pool": pool})()
    declared = declarations_for("race", None, json.dumps(SCHEDULE), [cleanup_schedule(300)])
    task = asyncio.create_task(keep_scheduled(store, declared, actor="bench-scheduler",
                                              online=online, healthy=lambda: None,
                                              database_error=lambda exc: None))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await pool.close()


def count(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT t), extract(epoch FROM max(t) - min(t))::int + 1,"
            " min(t), max(t) FROM (SELECT replace(idempotency_key, 'schedule:race:', '')"
            "::timestamptz AS t FROM mdm.aa_job WHERE idempotency_key LIKE 'schedule:race:%')"
            " AS k").fetchone()
        assert row is not None
        gaps = conn.execute(
            "SELECT count(*) FROM (SELECT t, lead(t) OVER (ORDER BY t) AS n FROM (SELECT"
            " replace(idempotency_key, 'schedule:race:', '')::timestamptz AS t FROM mdm.aa_job"
            " WHERE idempotency_key LIKE 'schedule:race:%') AS k) AS g"
            " WHERE n - t > interval '1 second'").fetchone()
        missed = conn.execute("SELECT missed_total FROM mdm.aa_schedule WHERE name = 'race'"
                              ).fetchone()
    return {"jobs": row[0], "ticks": row[1], "covered": row[2], "first": str(row[3]),
            "last": str(row[4]), "gaps": gaps[0] if gaps else None,
            "missed_total": missed[0] if missed else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--scheduler-of", metavar="DSN", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scheduler_of:
        asyncio.run(scheduler(args.scheduler_of))
        return
    with bench_database() as dsn:
        env = child_env(dsn)
        subprocess.run(["jobpool", "migrate"], env=env, check=True)
        children = [subprocess.Popen(["jobpool", "run", "--kinds", "cleanup_jobs",
                                      "--slots", "2"], env=env)
                    for _ in range(args.workers)]
        children += [subprocess.Popen([sys.executable, __file__, "--scheduler-of", dsn],
                                      env=env) for _ in range(args.schedulers)]
        started = time.monotonic()
        stuck = 0
        try:
            time.sleep(args.seconds)
        finally:
            for child in children:
                child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:  # reported, then killed: the count goes on
                    stuck += 1
                    child.kill()
                    child.wait()
        result = count(dsn)
        result.update(seconds=round(time.monotonic() - started), workers=args.workers,
                      not_stopped_within_60s_of_sigterm=stuck,
                      schedulers=args.schedulers,
                      exactly_once=result["jobs"] == result["ticks"] == result["covered"]
                      and result["gaps"] == 0)
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
