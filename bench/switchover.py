"""A planned primary switchover during a drain: what it costs the jobs that were running.

    python3 bench/switchover.py [--jobs 20000] [--workers 2] [--slots 8] [--ms 20]
                                [--at 0.3] [--runs 3]

Each run starts a primary and a streaming standby of its own (two throw-away clusters with
the benchmarks' production defaults), enqueues `--jobs` `bench_sleep` jobs of `--ms` ms and
starts `--workers` long-running `jobpool run` workers whose DSN names both hosts with
`target_session_attrs=read-write`. Once `--at` of the jobs are done, the primary stops (fast:
its sessions end, its last WAL reaches the standby) and the standby is promoted. Reported per
run: the gap from the stop to the first job done on the new primary, the drain's time, jobs
not done (lost), jobs whose committed run was recorded twice (duplicated), jobs that used more
than one attempt (burned by the switchover), and the workers' CPU per job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))

from bench_kinds import RUNS_DDL  # noqa: E402
from common import (  # noqa: E402
    PRIVATE_SETTINGS,
    children_cpu,
    median,
    migrate_with_kinds,
    start_sleep_worker,
    stop_workers,
)
from private_postgres import PrivateServer, find_bin  # noqa: E402

import jobpool  # noqa: E402


def both_hosts(primary: PrivateServer, standby: PrivateServer) -> str:
    return (f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres "
            "dbname=postgres target_session_attrs=read-write")


def count(conn: psycopg.Connection[dict[str, Any]], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row["n"])


def one_run(bin_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    primary = PrivateServer(bin_dir, PRIVATE_SETTINGS)
    standby: PrivateServer | None = None
    try:
        primary.start()
        migrate_with_kinds(primary.dsn(), "bench_kinds")
        with psycopg.connect(primary.dsn(), autocommit=True, row_factory=dict_row) as conn:
            conn.execute(RUNS_DDL)
            tenant = conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('bench')"
                                  " RETURNING id").fetchone()
            assert tenant is not None
            jobpool.enqueue_many_sync(conn, [jobpool.NewJob(tenant["id"], "bench_sleep",
                                                            {"ms": args.ms})] * args.jobs)
        standby = primary.standby()
        standby.start()
        return drain(primary, standby, args)
    finally:
        if standby is not None:
            standby.remove()
        primary.remove()


def drain(primary: PrivateServer, standby: PrivateServer,
          args: argparse.Namespace) -> dict[str, float]:
    dsn = both_hosts(primary, standby)
    cpu_before = children_cpu()
    started = time.monotonic()
    workers = [start_sleep_worker(dsn, args.slots) for _ in range(args.workers)]
    try:
        with psycopg.connect(primary.dsn(), autocommit=True, row_factory=dict_row) as conn:
            while count(conn, "SELECT count(*) AS n FROM bench_runs") < args.jobs * args.at:
                time.sleep(0.1)
        stopped_at = time.monotonic()
        primary.stop()
        standby.promote()
        with psycopg.connect(standby.dsn(), autocommit=True, row_factory=dict_row) as conn:
            before = count(conn, "SELECT count(*) AS n FROM bench_runs")
            while count(conn, "SELECT count(*) AS n FROM bench_runs") == before:
                time.sleep(0.05)
            gap = time.monotonic() - stopped_at
            while count(conn, "SELECT count(*) AS n FROM mdm.aa_job"
                              " WHERE status = 'done'") < args.jobs:
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            facts = conn.execute(
                "SELECT (SELECT count(*) FROM mdm.aa_job WHERE status <> 'done') AS lost,"
                " (SELECT count(*) FROM (SELECT job_id FROM bench_runs GROUP BY job_id"
                "  HAVING count(*) > 1) d) AS duplicated,"
                " (SELECT count(*) FROM mdm.aa_job WHERE attempts > 1) AS burned").fetchone()
            assert facts is not None
    finally:
        stop_workers(workers)
    cpu = children_cpu() - cpu_before
    return {"gap": gap, "elapsed": elapsed, "lost": facts["lost"],
            "duplicated": facts["duplicated"], "burned": facts["burned"],
            "cpu_ms_per_job": 1000 * cpu / args.jobs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--at", type=float, default=0.3, help="share done before the stop")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    bin_dir = find_bin()
    if bin_dir is None:
        raise SystemExit("bench: no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) "
                         "found: install them (Debian: postgresql) or set JOBPOOL_TEST_PG_BIN")
    runs = []
    for n in range(args.runs):
        run = one_run(bin_dir, args)
        runs.append(run)
        print(f"run {n + 1}: first job done {run['gap']:.2f} s after the primary stopped, "
              f"drained in {run['elapsed']:.0f} s; lost {run['lost']:.0f}, duplicated "
              f"{run['duplicated']:.0f}, attempts burned {run['burned']:.0f}; workers' CPU "
              f"{run['cpu_ms_per_job']:.2f} ms/job (load {os.getloadavg()[0]:.1f})", flush=True)
    gaps = [run["gap"] for run in runs]
    totals = {key: sum(run[key] for run in runs) for key in ("lost", "duplicated", "burned")}
    print(f"{args.jobs} jobs of {args.ms:g} ms, {args.workers} workers x {args.slots} slots, "
          f"switchover at {args.at:.0%}: gap median {median(gaps):.2f} s "
          f"(min {min(gaps):.2f}, max {max(gaps):.2f}) over {len(runs)} runs; lost "
          f"{totals['lost']:.0f}, duplicated {totals['duplicated']:.0f}, attempts burned "
          f"{totals['burned']:.0f}")


if __name__ == "__main__":
    main()
