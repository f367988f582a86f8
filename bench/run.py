"""Benchmark jobpool against PgQueuer, Procrastinate, graphile-worker and River on one PostgreSQL.

    python3 bench/run.py headline        # the performance page's table (about 25 minutes)
    python3 bench/run.py                 # every scenario but steady and long-drain, 3 repeats
    python3 bench/run.py drain --repeat 1 --jobs 10000 --systems jobpool
    python3 bench/run.py steady --synchronous-commit on    # 50 % and 90 % of capacity, 10 min

The first run creates bench/.venv (pinned peers from bench/requirements.txt plus this
checkout) and re-executes itself there; graphile-worker (`npm ci`) and River (`go build` of
bench/peers/river) are installed into bench/.peers on their first use. Databases
`jobpool_bench_*` are created on the server of JOBPOOL_BENCH_DSN, else on a private cluster
with PostgreSQL's defaults that the run starts and removes (its settings are printed), and
dropped afterwards. Raw figures go to bench/results/<time>.json; a summary table is printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
VENV = BENCH / ".venv"
SCENARIOS = ("drain", "best", "bounded", "drain-write", "latency", "enqueue", "notify", "growth")
"""What a run without scenarios runs."""
MORE = ("long-drain", "steady", "headline")
"""Scenarios run only when named: minutes to hours each."""
INTERLEAVED = ("drain", "best", "bounded", "drain-write", "latency", "enqueue", "long-drain",
               "steady")
"""The scenarios run by every system in turn within each repeat, on a template per system."""
HEADLINE = {"scenarios": ("drain", "best", "bounded", "drain-write"), "jobs": 5_000,
            "noop_jobs": 20_000, "repeat": 3, "synchronous_commit": "on,off",
            "systems": "jobpool,pgqueuer,graphile,river"}
"""`headline`: the one table of docs/performance.md. Every system at its default, best and
like-for-like setting, no-op and writing drains, both durability variants, 3 repeats: 20,000
no-op jobs per drain (a drain of 5,000 at 20,000 jobs/s lasted a quarter of a second, and its
rate was mostly noise) and 5,000 writing jobs: 24 minutes on a quiet 2-core machine.
Procrastinate is left out (a drain of it at 50-400 jobs/s would take the whole budget alone);
its own command is in bench/README.md."""
SLOW_FOR_LONG_DRAINS = {"procrastinate": "it drains 50-400 jobs/s here: 200,000 jobs would "
                        "take 10 to 60 minutes per drain"}
"""The systems `long-drain` leaves out, and why."""


def bootstrap() -> None:
    """Re-execute inside bench/.venv, creating and filling it first if needed."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    interpreter = VENV / "bin" / "python"
    if not interpreter.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = subprocess.run([str(interpreter), "-c", "import pgqueuer, procrastinate; "
                            "from jobpool.extras import missing_modules; "
                            "assert not missing_modules('worker')"],
                           capture_output=True, check=False)
    if probe.returncode != 0:  # jobpool's workers need its worker extra
        print(f"bench: installing the peers and jobpool's worker extra into {VENV} "
              "(the first run: a few minutes)", file=sys.stderr, flush=True)
        subprocess.run([str(interpreter), "-m", "pip", "install", "-q", "-r",
                        str(BENCH / "requirements.txt"), "-e", f"{BENCH.parent}[worker]"],
                       check=True)
    os.execv(str(interpreter), [str(interpreter), sys.argv[0], *sys.argv[1:]])


def setting_notes(systems: Sequence[Any], best: dict[str, str]) -> list[str]:
    """The lines under the table that say what each setting was, system by system."""
    def line(title: str, profile: str, concurrency: Callable[[Any], int]) -> str:
        return f"{title}: " + "; ".join(
            f"{s.title} {s.setting(profile, concurrency(s))}" for s in systems) + "."

    slots = (4, int(best.get("jobpool", 32)))
    bounded = [s for s in systems if s.bounded_setting is not None]
    lines = [line("Default", "default", lambda s: s.default_concurrency),
             line("Best setting", "best", lambda s: int(best[s.name]))]
    if bounded:
        lines.append(f"Like-for-like at N = {slots[0]} and {slots[1]} (jobpool's slots at its "
                     "default and best setting), each peer's jobs fetched ahead of its "
                     "workers bounded as near jobpool's bound (no more than its free slots) as "
                     "the peer allows: " + "; ".join(f"{s.title} {s.setting('bounded', 'N')}"
                                              for s in bounded) + ".")
    return lines


def main() -> int:
    import argparse
    import json
    import time

    from common import DURABILITIES, conditions, drop_database, machine, median, set_durability
    from scenarios import (
        drain,
        enqueue_batch,
        enqueue_concurrent,
        enqueue_single,
        latency,
        template,
    )
    from steady import steady
    from steady_figures import minute_table
    from systems import SYSTEMS, System
    from table import FIELDS, SameRunTable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"any of {', '.join(SCENARIOS + MORE)} (default: "
                        f"{', '.join(SCENARIOS)})")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated (default: {','.join(SYSTEMS)})")
    parser.add_argument("--repeat", type=int, default=None, help="default 3")
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs per drain (default 50,000; headline 5,000)")
    parser.add_argument("--noop-jobs", type=int, default=None,
                        help="jobs per drain of no-op jobs (drain, best and bounded's no-op "
                        "drains; default: --jobs; headline 20,000)")
    parser.add_argument("--synchronous-commit", default=None, metavar="on,off",
                        help="run everything once per variant, every system's databases set "
                        "to it (ALTER DATABASE ... SET synchronous_commit); default: the "
                        "server's setting (headline: on,off)")
    parser.add_argument("--long-jobs", type=int, default=200_000, help="long-drain: jobs")
    parser.add_argument("--minutes", type=float, default=10.0, help="steady: minutes of load")
    parser.add_argument("--snapshot-at", type=float, default=3.0,
                        help="steady: minute at which a snapshot is taken and held")
    parser.add_argument("--snapshot-minutes", type=float, default=3.0,
                        help="steady: minutes the snapshot is held")
    parser.add_argument("--shares", default="50,90",
                        help="steady: percentages of each system's drain capacity offered")
    parser.add_argument("--retention", type=float, default=None,
                        help="steady: jobpool's done jobs older than this many seconds are "
                        "deleted every 5 s (its retention step; default: its 7 days)")
    parser.add_argument("--capacity", default="",
                        help="steady: system=jobs/s to use as its capacity instead of "
                        "measuring it (a drain of --jobs at default concurrency)")
    parser.add_argument("--rate", type=float, default=200.0, help="latency: enqueues per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: seconds of load")
    parser.add_argument("--best", default="jobpool=32,pgqueuer=100,procrastinate=50,"
                        "graphile=24,river=2000", help="system=concurrency of the 'best' drain")
    parser.add_argument("--processes", type=int, default=1,
                        help="worker processes per drain, for every system (jobpool: its "
                        "--processes; the peers: that many copies of their worker)")
    parser.add_argument("--growth-sizes", default="10000,100000,1000000")
    args = parser.parse_args()
    if "headline" in args.scenarios:
        args.scenarios = [s for s in args.scenarios if s != "headline"] + [
            s for s in HEADLINE["scenarios"] if s not in args.scenarios]
        for option in ("jobs", "noop_jobs", "repeat", "synchronous_commit", "systems"):
            if getattr(args, option) is None:
                setattr(args, option, HEADLINE[option])
    args.systems = args.systems or ",".join(SYSTEMS)
    args.repeat = args.repeat if args.repeat is not None else 3
    args.jobs = args.jobs if args.jobs is not None else 50_000
    args.noop_jobs = args.noop_jobs if args.noop_jobs is not None else args.jobs
    unknown = set(args.scenarios) - set(SCENARIOS + MORE)
    if unknown:
        parser.error(f"unknown scenario {', '.join(sorted(unknown))}")
    variants: list[str | None] = (args.synchronous_commit.split(",")
                                  if args.synchronous_commit else [None])
    for variant in variants:
        if variant not in DURABILITIES and variant is not None:
            parser.error(f"--synchronous-commit {variant}: one of {', '.join(DURABILITIES)}")
    systems = [SYSTEMS[name] for name in args.systems.split(",")]
    capacities = {k: float(v) for k, v in (item.split("=") for item in args.capacity.split(",")
                                             if item)}
    best = dict(item.split("=") for item in args.best.split(","))
    results: dict[str, object] = {"machine": machine(), "argv": sys.argv[1:],
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    summary: list[str] = []
    tables: list[str] = []

    def record(key: str, rows: list[dict[str, object]], field: str, unit: str) -> None:
        results[key] = rows
        value = median([float(str(row[field])) for row in rows])
        loads = [row.get("load") for row in rows]
        shown = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
        loads = [round(x, 1) if isinstance(x, float) else x for x in loads]
        summary.append(f"| {key} | {shown} {unit} | n={len(rows)} | load {loads} |")
        print(summary[-1], flush=True)

    command = "python3 bench/run.py " + " ".join(sys.argv[1:])
    drained: dict[str, float] = {}
    """Each system's default-concurrency drain rate of this run (steady's capacity)."""

    def measure(scenario: str, system: System, tpl: str) -> list[tuple[str, dict[str, Any]]]:
        """One run of `scenario` for `system`: (result key, figures) pairs."""
        if scenario == "drain":
            return [("drain/{system}/default", drain(
                system, tpl, args.noop_jobs, system.default_concurrency, args.processes))]
        if scenario == "best":
            conc = int(best[system.name])
            return [(f"drain/{{system}}/best={conc}", drain(
                system, tpl, args.noop_jobs, conc, args.processes, profile="best"))]
        if scenario == "drain-write":  # both settings, each handler inserting one row
            conc = int(best[system.name])
            default = drain(system, tpl, args.jobs, system.default_concurrency, args.processes,
                            "bench_write")
            top = drain(system, tpl, args.jobs, conc, args.processes, "bench_write", "best")
            return [("drain-write/{system}/default", {**default, "setting": "default"}),
                    (f"drain-write/{{system}}/best={conc}", {**top, "setting": "best"})]
        if scenario == "bounded":  # jobpool's two slot counts, prefetch bounded alike
            if system.bounded_setting is None:
                return []
            pairs: list[tuple[str, dict[str, Any]]] = []
            for conc in (SYSTEMS["jobpool"].default_concurrency, int(best["jobpool"])):
                for kind, label in (("bench_noop", "drain"), ("bench_write", "drain-write")):
                    jobs = args.noop_jobs if kind == "bench_noop" else args.jobs
                    row = drain(system, tpl, jobs, conc, args.processes, kind, "bounded")
                    pairs.append((f"{label}/{{system}}/bounded={conc}",
                                  {**row, "setting": "bounded"}))
            return pairs
        if scenario == "latency":
            return [("latency/{system}", latency(system, tpl, args.rate, args.seconds))]
        if scenario == "long-drain":
            if system.name in SLOW_FOR_LONG_DRAINS:
                return []
            conc = int(best[system.name])
            return [("long-drain/{system}/default", drain(
                system, tpl, args.long_jobs, system.default_concurrency, args.processes)),
                (f"long-drain/{{system}}/best={conc}", {**drain(
                    system, tpl, args.long_jobs, conc, args.processes, profile="best"),
                    "setting": "best"})]
        if scenario == "steady":
            capacity = capacities.get(system.name) or drained.get(system.name)
            if capacity is None:
                capacity = drain(system, tpl, args.noop_jobs, system.default_concurrency)[
                    "jobs_per_s"]
                drained[system.name] = capacity
            return [(f"steady/{{system}}/{share}%", {**steady(
                system, tpl, capacity * int(share) / 100, args.minutes, args.snapshot_at,
                args.snapshot_minutes, system.default_concurrency,
                retention=args.retention), "share": int(share),
                "capacity": capacity}) for share in args.shares.split(",")]
        return [("enqueue/{system}/single", enqueue_single(system, tpl, 2000)),
                ("enqueue/{system}/batch5000", enqueue_batch(system, tpl, 50_000, 5000))]

    if "long-drain" in args.scenarios:
        for name, why in SLOW_FOR_LONG_DRAINS.items():
            if name in args.systems.split(","):
                print(f"bench: long-drain leaves out {SYSTEMS[name].title}: {why}", flush=True)
    templates = {s.name: template(s) for s in systems
                 if set(args.scenarios) & set(INTERLEAVED)}
    facts = results["machine"]
    assert isinstance(facts, dict)
    for variant in variants:
        set_durability(variant)
        prefix = f"synchronous_commit={variant}/" if variant else ""
        table = SameRunTable(systems=[s.name for s in systems], processes=args.processes,
                             notes=setting_notes(systems, best))
        drained.clear()
        minutes: list[str] = []
        for scenario in args.scenarios:
            if scenario in INTERLEAVED:
                # systems interleaved within each repeat: a change of load hits all of them
                runs: dict[str, dict[str, list[dict[str, object]]]] = {}
                for _ in range(args.repeat):
                    for system in systems:
                        for key, row in measure(scenario, system, templates[system.name]):
                            runs.setdefault(key, {}).setdefault(system.name, []).append(row)
                for key, by_system in runs.items():
                    for name, rows in by_system.items():
                        for field, unit in FIELDS[scenario]:
                            record(f"{prefix}{key.format(system=name)}/{field}", rows, field,
                                   unit)
                        table.add(scenario, name, rows)
                        if scenario == "steady":
                            minutes += ["", *minute_table(
                                f"steady, {SYSTEMS[name].title} at {key.rsplit('/', 1)[1]} of "
                                f"its drain capacity (median of {len(rows)} per minute):",
                                rows)]
            if scenario == "notify" and "jobpool" in templates:
                for notify in (True, False):
                    rows = [enqueue_concurrent(templates["jobpool"], 8, 4000, notify)
                            for _ in range(args.repeat)]
                    record(f"{prefix}enqueue/jobpool/8clients/notify={notify}", rows,
                           "jobs_per_s", "jobs/s")
            if scenario == "growth":
                from growth import growth

                results[f"{prefix}growth"] = growth(
                    [int(n) for n in args.growth_sizes.split(",")], args.repeat)
        tables += ["", *table.markdown(command, variant), *minutes, "",
                   conditions(facts, variant)]
    set_durability(None)
    for name in templates.values():
        drop_database(name)
    out = BENCH / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    print("\n".join(["", "| measurement | median | runs | load |", "| --- | --- | --- | --- |",
                     *summary, f"\nraw: {out}", *tables]))
    return 0


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
