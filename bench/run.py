"""Benchmark jobpool against PgQueuer, Procrastinate, graphile-worker and River on one PostgreSQL.

    python3 bench/run.py                 # everything, 3 repetitions, medians
    python3 bench/run.py drain --repeat 1 --jobs 10000 --systems jobpool

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
INTERLEAVED = ("drain", "best", "bounded", "drain-write", "latency", "enqueue")
"""The scenarios run by every system in turn within each repeat, on a template per system."""


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

    from common import conditions, drop_database, machine, median
    from scenarios import (
        drain,
        enqueue_batch,
        enqueue_concurrent,
        enqueue_single,
        latency,
        template,
    )
    from systems import SYSTEMS, System
    from table import FIELDS, SameRunTable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per drain")
    parser.add_argument("--rate", type=float, default=200.0, help="latency: enqueues per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency: seconds of load")
    parser.add_argument("--best", default="jobpool=32,pgqueuer=100,procrastinate=50,"
                        "graphile=24,river=2000", help="system=concurrency of the 'best' drain")
    parser.add_argument("--processes", type=int, default=1,
                        help="worker processes per drain, for every system (jobpool: its "
                        "--processes; the peers: that many copies of their worker)")
    parser.add_argument("--growth-sizes", default="10000,100000,1000000")
    args = parser.parse_args()
    systems = [SYSTEMS[name] for name in args.systems.split(",")]
    best = dict(item.split("=") for item in args.best.split(","))
    results: dict[str, object] = {"machine": machine(), "argv": sys.argv[1:],
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    summary: list[str] = []

    def record(key: str, rows: list[dict[str, object]], field: str, unit: str) -> None:
        results[key] = rows
        value = median([float(str(row[field])) for row in rows])
        loads = [row.get("load") for row in rows]
        shown = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
        loads = [round(x, 1) if isinstance(x, float) else x for x in loads]
        summary.append(f"| {key} | {shown} {unit} | n={len(rows)} | load {loads} |")
        print(summary[-1], flush=True)

    table = SameRunTable(systems=[s.name for s in systems], processes=args.processes,
                         notes=setting_notes(systems, best))
    command = "python3 bench/run.py " + " ".join(sys.argv[1:])

    def measure(scenario: str, system: System, tpl: str) -> list[tuple[str, dict[str, Any]]]:
        """One run of `scenario` for `system`: (result key, figures) pairs."""
        if scenario == "drain":
            return [("drain/{system}/default", drain(
                system, tpl, args.jobs, system.default_concurrency, args.processes))]
        if scenario == "best":
            conc = int(best[system.name])
            return [(f"drain/{{system}}/best={conc}", drain(
                system, tpl, args.jobs, conc, args.processes, profile="best"))]
        if scenario == "drain-write":  # both settings, each handler inserting one row
            conc = int(best[system.name])
            default = drain(system, tpl, args.jobs, system.default_concurrency, args.processes,
                            "bench_write")
            top = drain(system, tpl, args.jobs, conc, args.processes, "bench_write", "best")
            return [("drain-write/{system}/default", {**default, "setting": "default"}),
                    (f"drain-write/{{system}}/best={conc}", {**top, "setting": "best"})]
        if scenario == "bounded":  # jobpool's two slot counts, prefetch bounded alike
            if system.bounded_setting is None and system.name != "jobpool":
                return []
            pairs: list[tuple[str, dict[str, Any]]] = []
            for conc in (SYSTEMS["jobpool"].default_concurrency, int(best["jobpool"])):
                for kind, label in (("bench_noop", "drain"), ("bench_write", "drain-write")):
                    row = drain(system, tpl, args.jobs, conc, args.processes, kind, "bounded")
                    pairs.append((f"{label}/{{system}}/bounded={conc}",
                                  {**row, "setting": "bounded"}))
            return pairs
        if scenario == "latency":
            return [("latency/{system}", latency(system, tpl, args.rate, args.seconds))]
        return [("enqueue/{system}/single", enqueue_single(system, tpl, 2000)),
                ("enqueue/{system}/batch5000", enqueue_batch(system, tpl, 50_000, 5000))]

    templates = {s.name: template(s) for s in systems
                 if set(args.scenarios) & set(INTERLEAVED)}
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
                        record(f"{key.format(system=name)}/{field}", rows, field, unit)
                    table.add(scenario, name, rows)
        if scenario == "notify" and "jobpool" in templates:
            for notify in (True, False):
                rows = [enqueue_concurrent(templates["jobpool"], 8, 4000, notify)
                        for _ in range(args.repeat)]
                record(f"enqueue/jobpool/8clients/notify={notify}", rows, "jobs_per_s",
                       "jobs/s")
        if scenario == "growth":
            from growth import growth

            results["growth"] = growth([int(n) for n in args.growth_sizes.split(",")],
                                       args.repeat)
    for name in templates.values():
        drop_database(name)
    out = BENCH / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    print("\n".join(["", "| measurement | median | runs | load |", "| --- | --- | --- | --- |",
                     *summary, f"\nraw: {out}", "", *table.markdown(command), "",
                     conditions(results["machine"])]))
    return 0


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
