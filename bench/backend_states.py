"""What the server's backends do during a jobpool drain: waiting for the worker, or working.

    python3 bench/backend_states.py --kind bench_write --slots 32 --jobs 40000
    python3 bench/backend_states.py --kind bench_noop --slots 4

Fills a fresh database with `--jobs` jobs of `--kind` (`bench_noop`, or `bench_write`, whose
handler inserts one row in the job's transaction), drains it with one `jobpool run
--until-empty --slots N` process, and from the moment the first job is done samples
`pg_stat_activity` every `--every` seconds for `--seconds`, then stops the worker. Prints,
per (state, wait event, start of the backend's last query up to its first parenthesis), how
many of the drain's backends were in it on average.
`idle` and `idle in transaction` with the wait event `ClientRead` are backends waiting for the
worker to send; `active` ones work or wait for the server (a lock, the WAL). Then where the
worker's event-loop thread was over the same seconds (Linux's /proc/PID/task/PID/schedstat):
on a core, runnable but waiting for one (the machine's cores taken by others, the server's
backends most of all), or asleep (waiting for the server's answers, or for nothing to do).
Runs inside bench/.venv (run.py's bootstrap), on JOBPOOL_BENCH_DSN's server or a private
cluster.
"""

from __future__ import annotations

import sys

from run import bootstrap


def thread_times(pid: int) -> tuple[float, float] | None:
    """Seconds the main thread of process `pid` has run on a core and waited runnable for
    one, or None where the kernel keeps no such figures."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
            on_core, runnable = stat.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(on_core) / 1e9, int(runnable) / 1e9


QUERY_START = 30
"""Characters of each backend's last query, up to its first parenthesis (past it come the
values of a job's end), that tell the statements apart."""


def main() -> int:
    import argparse
    import collections
    import subprocess
    import time

    from common import admin, child_env, drop_database
    from scenarios import count_rows, enqueue_drain_jobs, fresh, template
    from systems import SYSTEMS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--kind", default="bench_write", choices=["bench_noop", "bench_write"])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--every", type=float, default=0.01)
    args = parser.parse_args()
    system = SYSTEMS["jobpool"]
    tpl = template(system)
    database, dsn = fresh(system, tpl, "states")
    states: collections.Counter[tuple[str, str, str]] = collections.Counter()
    samples = 0
    before = after = None
    sampled = 0.0
    try:
        enqueue_drain_jobs(system, dsn, args.kind, args.jobs)
        worker = subprocess.Popen(system.worker(dsn, "drain", args.slots, args.kind),
                                  env=child_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            done = "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'"
            while count_rows(dsn, done) == 0 and worker.poll() is None:
                time.sleep(0.05)
            with admin() as conn:
                began, before = time.monotonic(), thread_times(worker.pid)
                ends = began + args.seconds
                while time.monotonic() < ends and worker.poll() is None:
                    for state, wait, query in conn.execute(
                            "SELECT state, coalesce(wait_event, ''), "
                            "left(split_part(query, '(', 1), %s) "
                            "FROM pg_stat_activity WHERE datname = %s",
                            (QUERY_START, database)):
                        states[(state or "", wait, " ".join(query.split()))] += 1
                    samples += 1
                    time.sleep(args.every)
                after, sampled = thread_times(worker.pid), time.monotonic() - began
        finally:
            worker.kill()  # the samples are taken: the rest of the drain is not needed
            worker.wait()
    finally:
        drop_database(database)
        drop_database(tpl)
    if not samples:
        print("the drain ended before a sample was taken: give it more --jobs")
        return 1
    print(f"{samples} samples of the backends of a {args.slots}-slot drain of {args.kind}:")
    print("| backends (mean) | state | wait event | last query |")
    print("| --- | --- | --- | --- |")
    for (state, wait, query), seen in states.most_common(12):
        print(f"| {seen / samples:.2f} | {state} | {wait} | `{query}` |")
    if before is not None and after is not None:
        on_core, runnable = (b - a for a, b in zip(before, after, strict=True))
        print(f"the worker's event-loop thread over those {sampled:.1f} s: on a core "
              f"{on_core / sampled:.0%}, runnable waiting for a core {runnable / sampled:.0%}, "
              f"asleep {max(sampled - on_core - runnable, 0.0) / sampled:.0%}")
    return 0


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
