"""kill -9 of a worker every few seconds during a drain: how long the dead worker's jobs wait.

    python3 bench/kill_recovery.py [--jobs 20000] [--workers 4] [--slots 8] [--ms 50]
                                   [--every 3] [--lease-ttl 30]

Long-running `jobpool run` workers (no `jobpool recover`: recovery is theirs) drain `--jobs`
`bench_sleep` jobs of `--ms` ms each; every `--every` seconds one of them, in turn, is killed
with SIGKILL and started again (once it has started up: a worker not yet registered among
the live workers is waited for). Right after each kill the jobs running under the dead
worker's claim are its stranded jobs; the script polls until each is claimed again or
finished, and reports the wait from the kill (max, p50). At the end: jobs not done (lost),
jobs whose committed run was recorded more than once (duplicated), and jobs that used more
than one attempt without having been stranded (a live job taken back). Kills stop once
nothing is pending, so the drain's tail is the last stranded jobs' wait. Server:
`JOBPOOL_BENCH_DSN`, a throw-away database of its own.
"""

from __future__ import annotations

import argparse
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
from bench_kinds import RUNS_DDL  # noqa: E402
from common import (  # noqa: E402
    migrate_with_kinds,
    percentile,
    start_sleep_worker,
    stop_workers,
)

import jobpool  # noqa: E402


def stranded_by(conn: psycopg.Connection[dict[str, Any]], pid: int) -> dict[int, str]:
    rows = conn.execute("SELECT id, claimed_by FROM mdm.aa_job WHERE status = 'running'"
                        " AND split_part(claimed_by, '/', 2) = %s", (str(pid),)).fetchall()
    return {row["id"]: row["claimed_by"] for row in rows}


def registered(conn: psycopg.Connection[dict[str, Any]], pid: int) -> bool:
    """Whether the worker of `pid` has started up (registered among the live workers): one
    killed before would strand nothing, and on a busy machine, where a Python process may
    take longer than `--every` to start, no worker would ever run."""
    return conn.execute("SELECT 1 FROM mdm.aa_worker WHERE pid = %s", (pid,)).fetchone() \
        is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--ms", type=float, default=50.0)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    args = parser.parse_args()
    with bench_database() as dsn:
        migrate_with_kinds(dsn, "bench_kinds")
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            conn.execute(RUNS_DDL)
            tenant = conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('bench')"
                                  " RETURNING id").fetchone()
            assert tenant is not None
            jobpool.enqueue_many_sync(conn, [jobpool.NewJob(tenant["id"], "bench_sleep",
                                                            {"ms": args.ms})] * args.jobs)
            report(conn, dsn, args)


def start_worker(dsn: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    return start_sleep_worker(dsn, args.slots, "--lease-ttl", str(args.lease_ttl))


def report(conn: psycopg.Connection[dict[str, Any]], dsn: str, args: argparse.Namespace) -> None:
    workers = [start_worker(dsn, args) for _ in range(args.workers)]
    waiting: dict[int, tuple[float, str]] = {}  # stranded job -> (kill time, dead claim)
    waits: list[float] = []
    stranded: set[int] = set()
    kills = 0
    started = next_kill = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            pending = conn.execute("SELECT count(*) AS n FROM mdm.aa_job"
                                   " WHERE status = 'pending'").fetchone()
            turn = kills % len(workers)
            if (now >= next_kill and pending and pending["n"] > 0
                    and registered(conn, workers[turn].pid)):
                victim = workers[turn]
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed_at = time.monotonic()
                for job_id, claim in stranded_by(conn, victim.pid).items():
                    waiting[job_id] = (killed_at, claim)
                    stranded.add(job_id)
                workers[turn] = start_worker(dsn, args)
                kills += 1
                next_kill = killed_at + args.every
            if waiting:
                rows = conn.execute("SELECT id, status::text AS status, claimed_by FROM mdm.aa_job"
                                    " WHERE id = ANY(%s)", (list(waiting),)).fetchall()
                for row in rows:
                    killed_at, claim = waiting[row["id"]]
                    # pending: recovered, not running yet; running under its dead claim: waiting
                    if row["status"] != "pending" and (row["status"] != "running"
                                                       or row["claimed_by"] != claim):
                        waits.append(time.monotonic() - killed_at)
                        del waiting[row["id"]]
            done = conn.execute("SELECT count(*) AS n FROM mdm.aa_job"
                                " WHERE status = 'done'").fetchone()
            if done and done["n"] == args.jobs and not waiting:
                break
            time.sleep(0.2)
    finally:
        stop_workers(workers)
    elapsed = time.monotonic() - started
    stats = conn.execute(
        "SELECT (SELECT count(*) FROM mdm.aa_job WHERE status <> 'done') AS lost,"
        " (SELECT count(*) FROM (SELECT job_id FROM bench_runs GROUP BY job_id"
        "  HAVING count(*) > 1) d) AS duplicated").fetchone()
    retried = conn.execute("SELECT id FROM mdm.aa_job WHERE attempts > 1").fetchall()
    taken_back = [row["id"] for row in retried if row["id"] not in stranded]
    assert stats is not None
    print(f"{args.jobs} jobs of {args.ms:g} ms, {args.workers} workers x {args.slots} slots, "
          f"lease {args.lease_ttl:g} s, kill -9 every {args.every:g} s: {kills} kills, "
          f"{len(stranded)} stranded jobs, drained in {elapsed:.0f} s "
          f"(load {os.getloadavg()[0]:.1f})")
    print(f"stranded job running again after its worker died: max {max(waits, default=0):.1f} s,"
          f" p50 {percentile(waits, 50) if waits else 0:.1f} s")
    print(f"lost {stats['lost']}, duplicated {stats['duplicated']}, live jobs taken back "
          f"{len(taken_back)}")


if __name__ == "__main__":
    main()
