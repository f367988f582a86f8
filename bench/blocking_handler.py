"""A handler that blocks its worker's event loop: it runs once, the other slots keep time.

    python3 bench/blocking_handler.py [--block 30] [--seconds 45] [--slots 4]

Two long-running `jobpool run` workers, `--slots` slots each, kinds leased for 6 s
(`blocking_kinds.py`). Worker A claims one `bench_block` job (after 1 s its async handler
calls `time.sleep(--block)`) and `--slots - 1` `bench_steady` jobs (`--seconds` of
asyncio.sleep); worker B then starts with steady jobs of its own and would take A's jobs if
their leases lapsed. Meanwhile `jobpool recover`'s recovery runs every second, and every
0.5 s the script reads A's leases and heartbeat and asks A's `/healthz`. Prints: the blocking
job's runs (handler starts) and attempts; each steady job's lateness (its committed end minus its
first start minus `--seconds`) and runs; how often A's leases and heartbeat were renewed
while its loop was blocked; whether A was listed live throughout; /healthz answers (and its
`blocked` text); claims the recovery took back. Server: `JOBPOOL_BENCH_DSN`, or a
private cluster (bench/common.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg.rows import dict_row

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _benchdb import bench_database  # noqa: E402
from blocking_kinds import BLOCKING_DDL  # noqa: E402
from common import child_env, free_port, migrate_with_kinds, percentile  # noqa: E402

import jobpool  # noqa: E402
from jobpool.db.connect import connect  # noqa: E402
from jobpool.db.live_workers import DEAD_AFTER  # noqa: E402
from jobpool.worker.maintenance import recover_stale_claims  # noqa: E402

Conn = psycopg.Connection[dict[str, Any]]


def start_worker(dsn: str, slots: int, port: int, log: IO[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "jobpool", "run", "--kinds", "bench_block,bench_steady",
         "--slots", str(slots), "--import", "blocking_kinds", "--log-level", "warning",
         "--metrics-port", str(port), "--grace", "5"],
        env=child_env(JOBPOOL_DSN=dsn), stdout=subprocess.DEVNULL, stderr=log, text=True)


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    """/healthz's status and body; (0, {...}) when it does not answer within 1 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        return 0, {"error": str(exc)}


class Recovering(threading.Thread):
    """What `jobpool recover` runs (`recover_stale_claims`, committed), every second until
    `stop()`, on a connection of its own in this thread (a process per run would start
    slower than once a second on a busy machine); counts its runs and the claims it took
    back."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.runs = self.recovered = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._recover())

    async def _recover(self) -> None:
        async with await connect(self.dsn) as conn:
            while not self.stopping.is_set():
                began = time.monotonic()
                rows = await recover_stale_claims(conn, actor="bench")
                await conn.commit()
                self.runs += 1
                self.recovered += len(rows)
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    def stop(self) -> None:
        self.stopping.set()
        self.join()


def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else next(iter(row.values()))


def wait_for(conn: Conn, query: str, params: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not scalar(conn, query, params):
        if time.monotonic() > deadline:
            raise SystemExit(f"never saw {what}")
        time.sleep(0.1)


def enqueue(conn: Conn, tenant: Any, kind: str, payload: dict[str, Any], n: int) -> list[int]:
    return [jobpool.enqueue_sync(conn, tenant_id=tenant, kind=kind, payload=payload).id
            for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block", type=float, default=30.0,
                        help="seconds the blocking handler holds the event loop")
    parser.add_argument("--seconds", type=float, default=45.0,
                        help="seconds each steady job takes")
    parser.add_argument("--slots", type=int, default=4)
    args = parser.parse_args()
    with bench_database() as dsn:
        migrate_with_kinds(dsn, "blocking_kinds")
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
            conn.execute(BLOCKING_DDL)
            tenant = scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('bench')"
                                  " RETURNING id")
            run(conn, dsn, tenant, args)


def run(conn: Conn, dsn: str, tenant: Any, args: argparse.Namespace) -> None:
    steady = {"seconds": args.seconds}
    mine = enqueue(conn, tenant, "bench_steady", steady, args.slots - 1)
    blocking = enqueue(conn, tenant, "bench_block", {"after": 1, "seconds": args.block}, 1)[0]
    port_a = free_port()
    with tempfile.TemporaryFile("w+") as log:
        workers = [start_worker(dsn, args.slots, port_a, log)]
        try:
            wait_for(conn, "SELECT count(*) = %s FROM mdm.aa_job WHERE status = 'running'",
                     (args.slots,), "worker A run all its slots")
            holder = scalar(conn, "SELECT claimed_by FROM mdm.aa_job WHERE id = %s",
                            (blocking,))
            workers.append(start_worker(dsn, args.slots, 0, log))
            theirs = enqueue(conn, tenant, "bench_steady", steady, args.slots)
            report(conn, dsn, args, holder=holder, port=port_a, blocking=blocking,
                   steady=mine + theirs)
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                worker.wait(timeout=60)
        log.seek(0)
        lines = log.read().splitlines()
    blocked = [line.split("WARNING", 1)[-1].strip()[:100] for line in lines
               if "event loop was blocked" in line]
    print(f"  workers' log: {sum('lease lost' in line for line in lines)} 'lease lost', "
          f"{sum('registered again' in line for line in lines)} 'registered again'; "
          f"blocking logged: {blocked}")


def report(conn: Conn, dsn: str, args: argparse.Namespace, *, holder: str, port: int,
           blocking: int, steady: list[int]) -> None:
    leases: dict[int, set[Any]] = {}
    beats: set[Any] = set()
    live_looks = dead_looks = 0
    answers: list[int] = []
    blocked_texts: set[str] = set()
    recovering = Recovering(dsn)
    recovering.start()
    everything = [blocking, *steady]
    blocked_from = blocked_until = None
    while scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE id = ANY(%s)"
                       " AND status NOT IN ('done', 'dlq')", (everything,)):
        now = time.monotonic()
        block_running = scalar(conn, "SELECT count(*) = 1 FROM bench_block_starts WHERE"
                                     " job_id = %s", (blocking,)) and not scalar(
            conn, "SELECT count(*) FROM bench_block_ends WHERE job_id = %s", (blocking,))
        status, body = healthz(port)
        if block_running and "blocked" in body:
            blocked_from = blocked_from or now
            blocked_until = now
            answers.append(status)
            blocked_texts.add(body["blocked"].split(" for ")[0] + " by " +
                              body["blocked"].split(" by ", 1)[1])
            for row in conn.execute("SELECT id, lease_expires_at FROM mdm.aa_job WHERE"
                                    " status = 'running' AND claimed_by = %s", (holder,)):
                leases.setdefault(row["id"], set()).add(row["lease_expires_at"])
            beat = scalar(conn, "SELECT heartbeat_at FROM mdm.aa_worker WHERE worker_id = %s"
                                " AND heartbeat_at >= now() - make_interval(secs => %s)",
                          (holder, DEAD_AFTER))
            if beat is None:
                dead_looks += 1
            else:
                live_looks += 1
                beats.add(beat)
        time.sleep(0.5)
    recovering.stop()

    starts = conn.execute("SELECT job_id, count(*) AS runs, min(started_at) AS first"
                          " FROM bench_block_starts GROUP BY job_id").fetchall()
    by_job = {row["job_id"]: row for row in starts}
    ends = {row["job_id"]: row["ended_at"] for row in
            conn.execute("SELECT job_id, ended_at FROM bench_block_ends").fetchall()}
    jobs = {row["id"]: row for row in conn.execute(
        "SELECT id, status::text AS status, attempts FROM mdm.aa_job WHERE id = ANY(%s)",
        (everything,)).fetchall()}
    late = [ends[j] - by_job[j]["first"] - args.seconds for j in steady if j in ends]
    seen = (blocked_until or 0) - (blocked_from or 0)
    print(f"blocking handler (time.sleep {args.block:g} s, lease 6 s, `jobpool recover` every "
          f"second, 2 workers x {args.slots} slots; load {os.getloadavg()[0]:.1f}):")
    print(f"  blocking job: {jobs[blocking]['status']}, runs {by_job[blocking]['runs']}, "
          f"attempts {jobs[blocking]['attempts']}")
    print(f"  {len(steady)} steady jobs of {args.seconds:g} s: done "
          f"{sum(jobs[j]['status'] == 'done' for j in steady)}, runs "
          f"{sum(by_job[j]['runs'] for j in steady if j in by_job)}, lateness max "
          f"{max(late, default=0):.2f} s, p50 {percentile(late, 50) if late else 0:.2f} s")
    renewed = sorted(len(values) for values in leases.values())
    print(f"  while A's loop was seen blocked ({seen:.0f} s): leases of its "
          f"{len(leases)} running jobs seen with {renewed} distinct expiries; heartbeat "
          f"{len(beats)} distinct beats, listed live {live_looks} / dead {dead_looks} looks")
    print(f"  /healthz while blocked: {len(answers)} answers, statuses "
          f"{sorted(set(answers))}; {sorted(blocked_texts)}")
    print(f"  recovery (`jobpool recover`'s) ran {recovering.runs} times, took back "
          f"{recovering.recovered} claim(s)")


if __name__ == "__main__":
    main()
