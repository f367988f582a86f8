"""Paired drains of jobpool versions, which goes first alternating: rate and CPU per job.

    python3 bench/paired_drain.py before=/path/to/old/checkout after=. --slots 32 --jobs 20000
    python3 bench/paired_drain.py now=. --slots 32 --extra "--prefetch 0"
    python3 bench/paired_drain.py before=/path/to/old after=. --kind bench_write --jobs 10000

Each `name=checkout` is a jobpool checkout: its `operator/` goes first on the worker's
PYTHONPATH, and its own migrations build the template its drains copy (a version is its code
and its schema). Every round drains a fresh database of `--jobs` jobs of `--kind` (`bench_noop`,
or `bench_write`, whose handler inserts one row in the job's transaction; the round fails
unless every job's row is there) with one `jobpool run --until-empty --slots N` per version,
each round starting one version further down the list (two versions: A B, B A, A B, ...)
after a CHECKPOINT: a change of load hits every version alike, and no version always drains
after another's WAL and dead rows (with a fixed order, the second drain of a round ran
9-12 % slower and took 10-15 % more worker CPU per job, whichever version it was). Prints
each drain's wall time, rate (start-up included), the worker's CPU per job (user + system,
start-up included: measure it with `--jobs 1`), PostgreSQL's CPU per job and the SQL
transactions per job, then each version's medians (min-max). Give an even `--rounds` for
as many first places as second ones. Runs inside bench/.venv (run.py's bootstrap), on
JOBPOOL_BENCH_DSN's server or a private cluster.
"""

from __future__ import annotations

import sys

from run import bootstrap


def main() -> int:
    import argparse
    import os
    import statistics

    from common import (
        PREFIX,
        admin,
        child_env,
        children_cpu,
        drop_database,
        python,
        recreate_database,
        run_child,
        server_cpu,
        transactions,
    )
    from scenarios import count_rows, enqueue_drain_jobs, fresh
    from systems import SYSTEMS
    from table import spread

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", metavar="NAME=CHECKOUT")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--extra", default="", help="more `jobpool run` flags, one string")
    parser.add_argument("--kind", default="bench_noop", choices=["bench_noop", "bench_write"])
    args = parser.parse_args()
    versions = []
    for text in args.versions:
        name, sep, checkout = text.partition("=")
        if not sep or not os.path.isdir(os.path.join(checkout, "operator", "jobpool")):
            parser.error(f"{text!r}: expected NAME=CHECKOUT, a folder with operator/jobpool")
        versions.append((name, os.path.abspath(checkout)))
    system = SYSTEMS["jobpool"]
    figures: dict[str, list[tuple[float, float, float, float]]] = {}
    bench = os.path.dirname(os.path.abspath(__file__))

    def path_of(checkout: str) -> str:
        return os.pathsep.join((os.path.join(checkout, "operator"), bench))

    def versioned_template(name: str, checkout: str) -> str:
        """A template migrated by `checkout`'s own code (`Jobpool.install` run from it)."""
        database = f"{PREFIX}paired_tpl_{name}"
        env = child_env()
        env["PYTHONPATH"] = path_of(checkout)
        run_child([python(), "-c", "import asyncio, sys; from systems import SYSTEMS; "
                   "asyncio.run(SYSTEMS['jobpool'].install(sys.argv[1]))",
                   recreate_database(database)], env, timeout=600)
        return database

    templates: dict[str, str] = {}
    try:
        for name, checkout in versions:
            templates[name] = versioned_template(name, checkout)
        for round_ in range(args.rounds):
            turn = round_ % len(versions)
            for name, checkout in versions[turn:] + versions[:turn]:
                database, dsn = fresh(system, templates[name], "paired")
                try:
                    enqueue_drain_jobs(system, dsn, args.kind, args.jobs)
                    with admin() as conn:
                        conn.execute("CHECKPOINT")
                    argv = system.worker(dsn, "drain", args.slots,
                                         args.kind) + args.extra.split()
                    env = child_env()
                    env["PYTHONPATH"] = path_of(checkout)
                    xacts, cpu, server = transactions(database), children_cpu(), server_cpu()
                    wall = run_child(argv, env, timeout=3600)
                    worker_us = (children_cpu() - cpu) / args.jobs * 1e6
                    after = server_cpu()
                    server_us = ((after - server) / args.jobs * 1e6
                                 if after is not None and server is not None else float("nan"))
                    per_job = (transactions(database) - xacts) / args.jobs
                    if args.kind == "bench_write":
                        written = count_rows(dsn, "SELECT count(*) FROM bench_writes")
                        if written != args.jobs:
                            raise RuntimeError(f"{name}: {written} rows written for "
                                               f"{args.jobs} jobs")
                finally:
                    drop_database(database)
                figures.setdefault(name, []).append(
                    (args.jobs / wall, worker_us, server_us, per_job))
                print(f"round {round_ + 1} {name}: {wall:.2f} s, {args.jobs / wall:,.0f} jobs/s, "
                      f"worker {worker_us:.0f} µs/job, PostgreSQL {server_us:.0f} µs/job, "
                      f"{per_job:.3f} transactions/job", flush=True)
    finally:
        for database in templates.values():
            drop_database(database)

    for name, rows in figures.items():
        print(f"{name}: {spread([r[0] for r in rows])} jobs/s; worker "
              f"{spread([r[1] for r in rows])} µs/job; PostgreSQL "
              f"{spread([r[2] for r in rows])} µs/job; "
              f"{statistics.median(r[3] for r in rows):.3f} transactions/job")
    return 0


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
