"""Profile one jobpool drain: where a worker process spends its time per job.

    python3 bench/profile_drain.py --slots 4 --jobs 20000        # cProfile, top 25 by own time
    python3 bench/profile_drain.py --slots 32 --sort cumulative
    python3 bench/profile_drain.py --slots 32 --kind bench_write   # handlers that insert a row
    python3 bench/profile_drain.py --slots 32 --kind bench_write --timer cpu
    python3 bench/profile_drain.py --slots 4 --kind bench_write --setting bounded  # prefetch 0

Runs inside bench/.venv (run.py's bootstrap). Fills a fresh database with `--jobs` jobs of
`--kind` (`bench_noop`, or `bench_write`, whose handler inserts one row in the job's transaction),
drains it with one `jobpool run --until-empty` process under cProfile, prints the functions
that took the most time and the profiled microseconds per job (of the timer's kind).
cProfile slows every Python call, so compare profiles with each other, never with `run.py`'s
rates.

`--timer wall` (cProfile's default) counts the time the worker waited runnable, too: on a
machine with fewer cores than busy processes, a send that wakes a server backend often hands
it the core, and the send is charged with the backend's work. `--timer cpu` counts the
worker's own CPU time only (each timer call is a system call, so every call costs more).
"""

from __future__ import annotations

import sys

from run import bootstrap

TIMERS = {"wall": ("time.perf_counter", "elapsed time"),
          "cpu": ("time.process_time", "worker CPU time")}
"""Each `--timer`: the clock cProfile reads, and what it charges a function with."""

PROFILED = """\
import cProfile, runpy, sys, time
sys.argv = ["jobpool", *sys.argv[1:]]
profile = cProfile.Profile({timer})
try:
    profile.runcall(runpy.run_module, "jobpool", run_name="__main__")
except SystemExit:
    pass
finally:
    profile.dump_stats({out!r})
"""
"""A worker under cProfile with the timer asked for: `-c` with this, then the worker's
arguments after `-m jobpool`."""


def main() -> int:
    import argparse
    import pstats
    import tempfile

    from common import child_env, drop_database, run_child
    from scenarios import enqueue_drain_jobs, fresh, template
    from systems import SYSTEMS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--kind", default="bench_noop", choices=["bench_noop", "bench_write"])
    parser.add_argument("--setting", default="default", choices=["default", "bounded"],
                        help="the worker's setting as bench/run.py names it (bounded: prefetch 0)")
    parser.add_argument("--sort", default="tottime", help="pstats sort key")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--timer", default="wall", choices=list(TIMERS),
                        help="what a function is charged with: elapsed time, or CPU time")
    args = parser.parse_args()
    system = SYSTEMS["jobpool"]
    tpl = template(system)
    name, dsn = fresh(system, tpl, "profile")
    try:
        enqueue_drain_jobs(system, dsn, args.kind, args.jobs)
        with tempfile.NamedTemporaryFile(suffix=".prof") as out:
            argv = system.worker(dsn, "drain", args.slots, args.kind, args.setting)
            clock, charged = TIMERS[args.timer]
            profiled = [argv[0], "-c", PROFILED.format(timer=clock, out=out.name),
                        *argv[3:]]
            elapsed = run_child(profiled, child_env(), timeout=3600)
            stats = pstats.Stats(out.name)
            print(f"{args.jobs} jobs, {args.slots} slots: {elapsed:.2f}s wall under cProfile, "
                  f"{stats.total_tt / args.jobs * 1e6:.0f} µs of profiled {charged} per job "
                  f"(--timer {args.timer}), start-up included")
            stats.sort_stats(args.sort).print_stats(args.top)
    finally:
        drop_database(name)
        drop_database(tpl)
    return 0


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
