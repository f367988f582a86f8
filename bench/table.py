"""The same-run table: each system's median and min-max per measurement, ready to paste."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common import median

FIELDS: dict[str, list[tuple[str, str]]] = {
    "drain": [("jobs_per_s", "jobs/s"), ("xacts_per_job", "xacts/job"),
              ("worker_cpu_us_per_job", "µs"), ("server_cpu_us_per_job", "µs"),
              ("startup_s", "s")],
    "best": [("jobs_per_s", "jobs/s"), ("xacts_per_job", "xacts/job"),
             ("worker_cpu_us_per_job", "µs"), ("server_cpu_us_per_job", "µs")],
    "bounded": [("jobs_per_s", "jobs/s"), ("xacts_per_job", "xacts/job"),
                ("worker_cpu_us_per_job", "µs"), ("server_cpu_us_per_job", "µs")],
    "drain-write": [("jobs_per_s", "jobs/s"), ("xacts_per_job", "xacts/job"),
                    ("worker_cpu_us_per_job", "µs"), ("server_cpu_us_per_job", "µs")],
    "long-drain": [("jobs_per_s", "jobs/s"), ("xacts_per_job", "xacts/job"),
                   ("worker_cpu_us_per_job", "µs"), ("server_cpu_us_per_job", "µs")],
    "steady": [("offered_per_s", "jobs/s"), ("held", "share"), ("p99_ms_before", "ms"),
               ("p99_ms_held", "ms"), ("p999_ms", "ms"), ("recovery_s", "s"),
               ("size_mb_max", "MB"), ("dead_tuples_max", "tuples"),
               ("worker_cpu_us_per_job", "µs"), ("server_cpu_us_per_job", "µs")],
    "latency": [("p50_ms", "ms"), ("p99_ms", "ms"), ("max_ms", "ms")],
    "enqueue": [("jobs_per_s", "jobs/s")],
}
"""The figures each scenario reports, with their units."""

NAMES = {"jobpool": "jobpool", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate",
         "graphile": "graphile-worker", "river": "River"}
HIGHER_IS_BETTER = {"jobs_per_s"}


def spread(values: Sequence[float]) -> str:
    """`median (min-max)`, rounded for reading."""
    def fmt(value: float) -> str:
        return f"{value:,.0f}" if value >= 100 else f"{value:.2g}" if value < 1 else f"{value:.1f}"

    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(median(values))} ({fmt(min(values))}\u2013{fmt(max(values))})"


def print_variants(columns: Sequence[str],
                   figures: Mapping[str, Sequence[Sequence[float]]]) -> None:
    """One line per variant of `figures` (its rounds, each one figure per column), the
    spread of each column's figures over the rounds under its name in `columns`."""
    rows = [[name, *(spread([r[i] for r in rounds]) for i in range(len(columns)))]
            for name, rounds in figures.items()]
    header = ["variant", *columns]
    widths = [max(len(row[i]) for row in [header, *rows]) + 2 for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "".join(cell.ljust(width)
                             for cell, width in zip(row, widths, strict=True)).rstrip())


class SameRunTable:
    """Collects the runs of one `run.py` invocation and prints them as one Markdown table."""

    def __init__(self, *, systems: Sequence[str], processes: int, notes: Sequence[str]) -> None:
        """`notes`: the lines printed under the table (what each setting was)."""
        self.systems = list(systems)
        self.processes = processes
        self.notes = list(notes)
        self.rows: list[tuple[str, str, dict[str, list[float]]]] = []

    def add(self, scenario: str, system: str, runs: Sequence[dict[str, Any]]) -> None:
        """Record the runs of `system` in `scenario` (one row per figure)."""
        for field, unit in FIELDS[scenario]:
            label = self._label(scenario, runs[0], field, unit)
            for row_label, row_field, values in self.rows:
                if row_label == label and row_field == field:
                    values[system] = [float(run[field]) for run in runs]
                    break
            else:
                self.rows.append((label, field, {system: [float(run[field]) for run in runs]}))

    def _label(self, scenario: str, run: dict[str, Any], field: str, unit: str) -> str:
        what = {"jobs_per_s": "jobs/s", "xacts_per_job": "SQL transactions per job",
                "worker_cpu_us_per_job": "worker CPU per job (µs)",
                "server_cpu_us_per_job": "PostgreSQL CPU per job (µs)",
                "startup_s": "worker start-up and exit on the empty queue, subtracted (s)",
                "p50_ms": "enqueue-to-start p50 (ms)", "p99_ms": "enqueue-to-start p99 (ms)",
                "max_ms": "enqueue-to-start max (ms)",
                "offered_per_s": "jobs/s offered", "held": "share of the offered rate started",
                "p99_ms_before": "p99 enqueue-to-start before the snapshot (ms)",
                "p99_ms_held": "p99 enqueue-to-start while it is held (ms)",
                "p999_ms": "p99.9 enqueue-to-start, whole run (ms)",
                "recovery_s": "seconds after its release until the p99 is back",
                "size_mb_max": "largest job table + indexes (MB)",
                "dead_tuples_max": "most dead tuples in the job table"}.get(field, unit)
        if scenario == "steady":
            return (f"steady, {run['share']} % of its drain capacity for {run['minutes']:g} "
                    f"min, a snapshot held from minute {run['hold_at']:g} for "
                    f"{run['hold']:g}: {what}")
        if scenario == "long-drain":
            setting = "best setting" if run.get("setting") == "best" else "default concurrency"
            return f"drain of {run['jobs']:,}, {setting}: {what}"
        if scenario in ("drain", "best", "bounded", "drain-write"):
            best = scenario == "best" or run.get("setting") == "best"
            setting = "best setting" if best else "default concurrency"
            if run.get("setting") == "bounded":
                setting = f"like-for-like at {run['concurrency']}"
            procs = f", {self.processes} processes" if self.processes > 1 else ""
            writes = ", handler inserts a row" if run.get("kind") == "bench_write" else ""
            return f"drain of {run['jobs']:,}{writes}, {setting}{procs}: {what}"
        if scenario == "enqueue":
            kind = "batch of 5,000" if "batch" in run else "single"
            return f"enqueue, {kind}: {what}"
        return f"latency, {run.get('rate', 200):g} jobs/s to idle default workers: {what}"

    def markdown(self, command: str, sync: str | None = None) -> list[str]:
        """The table's lines, headed by the command that produced it (and the
        `synchronous_commit` variant `sync` of its runs, if the run set one)."""
        peers = [s for s in self.systems if s != "jobpool"]
        ratios = [f"jobpool / {NAMES[p]}" for p in peers] if "jobpool" in self.systems else []
        head = ["measurement", *(NAMES[s] for s in self.systems), *ratios]
        variant = f", synchronous_commit {sync} for every system" if sync else ""
        lines = [f"`{command}` (median of each system's runs, min\u2013max in brackets; the "
                 f"systems ran interleaved within each repeat{variant})", "",
                 "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for label, field, values in self.rows:
            cells = [spread(values[s]) if s in values else "" for s in self.systems]
            for peer in (peers if ratios else []):
                if "jobpool" in values and peer in values and field in HIGHER_IS_BETTER:
                    ratio = median(values["jobpool"]) / median(values[peer])
                    cells.append(f"{ratio:.2f}x")
                else:
                    cells.append("")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return [*lines, "", *self.notes]
