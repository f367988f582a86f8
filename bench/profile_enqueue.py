"""Where a batch enqueue spends its time: client CPU per job, then the server's statement.

    python3 bench/profile_enqueue.py                      # 20 batches of 5,000 no-op jobs
    python3 bench/profile_enqueue.py --batch 1 --batches 2000 --top 15
    python3 bench/profile_enqueue.py --keys                # every job with its own idempotency key

Runs inside bench/.venv (run.py's bootstrap), against a fresh database from the migrated
template, with `jobpool.enqueue_many_sync` on one autocommit connection (one transaction per
batch, as `run.py enqueue` does). Prints, per job: the client's CPU time (`process_time`,
building the NewJobs included, as in `run.py`), the wall time, and the CPU time of the
server process serving the connection (read from /proc, so only when the server runs on this
machine); then cProfile's top functions by own time over a few batches; then the plan of one
batch's statements as `EXPLAIN (ANALYZE, BUFFERS)` prints it, trigger times included (via
auto_explain at NOTICE level, so whatever statements this checkout sends are the ones shown;
it needs a superuser). The queries that triggers run are not explained one by one: that would
time each of a row trigger's 5,000 queries and swell the figures it is compared with. The
figures compare checkouts run the same minute; cProfile slows every Python call, so its times
compare with each other only.
"""

from __future__ import annotations

import sys

from run import bootstrap


def _server_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of server process `pid`, or None if it is not local."""
    import os

    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    import argparse
    import cProfile
    import itertools
    import os
    import pstats
    import time

    import psycopg
    from common import drop_database
    from scenarios import fresh, template
    from systems import BENCH_TENANT, SYSTEMS

    import jobpool

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=5000, help="jobs per enqueue_many call")
    parser.add_argument("--batches", type=int, default=20, help="timed batches")
    parser.add_argument("--profiled", type=int, default=5, help="batches under cProfile")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--keys", action="store_true", help="give every job an idempotency key")
    args = parser.parse_args()
    system = SYSTEMS["jobpool"]
    tpl = template(system)
    name, dsn = fresh(system, tpl, "profile")

    keys = itertools.count()

    def batch() -> list[jobpool.NewJob]:
        if args.keys:
            return [jobpool.NewJob(BENCH_TENANT, "bench_noop", {}, idempotency_key=f"k{next(keys)}")
                    for _ in range(args.batch)]
        return [jobpool.NewJob(BENCH_TENANT, "bench_noop", {}) for _ in range(args.batch)]

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            pid = conn.info.backend_pid
            for _ in range(3):  # warm: prepared statements, plpgsql caches
                jobpool.enqueue_many_sync(conn, batch())
            server = _server_cpu(pid)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.batches):
                jobpool.enqueue_many_sync(conn, batch())
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            after = _server_cpu(pid)
            jobs = args.batch * args.batches
            print(f"{args.batches} batches of {args.batch:,}: client CPU "
                  f"{cpu / jobs * 1e6:.2f} µs/job, wall {wall / jobs * 1e6:.2f} µs/job "
                  f"({jobs / wall:,.0f} jobs/s)"
                  + ("" if server is None or after is None else
                     f", server CPU {(after - server) / jobs * 1e6:.2f} µs/job")
                  + f"; load {os.getloadavg()[0]:.2f}")
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.profiled):
                jobpool.enqueue_many_sync(conn, batch())
            profile.disable()
            stats = pstats.Stats(profile)
            print(f"\ncProfile, {args.profiled} batches: "
                  f"{stats.total_tt / (args.profiled * args.batch) * 1e6:.1f} µs/job profiled")  # type: ignore[attr-defined]
            stats.sort_stats("tottime").print_stats(args.top)
            plans: list[str] = []
            conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
            conn.execute("LOAD 'auto_explain'")
            for setting, value in (("log_min_duration", "0"), ("log_analyze", "on"),
                                   ("log_buffers", "on"), ("log_triggers", "on"),
                                   ("log_level", "notice")):
                conn.execute(f"SET auto_explain.{setting} = {value}")
            jobpool.enqueue_many_sync(conn, batch())
            conn.execute("SET auto_explain.log_min_duration = -1")
            print("\n\n".join(plans))
    finally:
        drop_database(name)
        drop_database(tpl)
    return 0


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
