"""The steady scenario's figures from what a run recorded (pure: no database, no process)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common import median, percentile

RECOVERY_WINDOW = 10
"""Seconds of latencies whose p99 must be back under the bar for the run to have recovered."""


def summary(latencies: Sequence[Sequence[float]], sent: Sequence[int],
            tables: Sequence[tuple[float, int, int]], seconds: float, hold_at: float,
            hold: float) -> dict[str, Any]:
    """The run's figures from per-second latencies (ms) and enqueue counts and the table
    samples: per minute and over the run (bench/steady.py).

    `latencies[s]`: the enqueue-to-start latencies (ms) of the jobs that started in second
    `s` of the run; `sent[s]`: the jobs enqueued in it; `tables`: (second, table + index
    bytes, dead tuples) samples. The snapshot is held from `hold_at` for `hold` seconds of
    the run's `seconds`; `recovery_s` counts the seconds from its release to the first
    `RECOVERY_WINDOW` seconds whose p99 is at most 1.5 times the p99 of the minute before the
    snapshot (of its second half if it starts within two minutes; at least 5 ms more), NaN
    if none."""
    def flat(first: float, last: float) -> list[float]:
        return [v for s in range(max(0, int(first)), min(len(latencies), int(last)))
                for v in latencies[s]]

    minutes = []
    for m in range(int(-(-seconds // 60))):
        values = flat(m * 60, (m + 1) * 60)
        in_minute = [t for t in tables if m * 60 <= t[0] < (m + 1) * 60]
        span = min(60.0, seconds - m * 60)
        minutes.append({
            "minute": m + 1, "snapshot": m * 60 < hold_at + hold and (m + 1) * 60 > hold_at,
            "offered_per_s": sum(sent[m * 60:(m + 1) * 60]) / span,
            "started_per_s": len(values) / span,
            "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
            "p999_ms": percentile(values, 99.9),
            "size_mb": in_minute[-1][1] / 2**20 if in_minute else float("nan"),
            "dead_tuples": in_minute[-1][2] if in_minute else -1})
    window = flat(max(hold_at / 2, hold_at - 60), hold_at)  # past the warm-up
    before = percentile(window, 99) if window else float("nan")
    release = hold_at + hold
    bar = max(1.5 * before, before + 5.0)
    recovery = float("nan")
    for k in range(0, max(0, int(seconds - release) - RECOVERY_WINDOW + 1)):
        window = flat(release + k, release + k + RECOVERY_WINDOW)
        if window and percentile(window, 99) <= bar:
            recovery = float(k)
            break
    everything = flat(0, len(latencies))
    total_sent = sum(sent)
    return {"sent": total_sent, "started": len(everything),
            "offered_per_s": total_sent / seconds,
            "held": len(flat(0, seconds)) / total_sent if total_sent else 0.0,
            "p50_ms": percentile(everything, 50), "p99_ms": percentile(everything, 99),
            "p999_ms": percentile(everything, 99.9), "p99_ms_before": before,
            "p99_ms_held": percentile(flat(hold_at, release), 99), "recovery_s": recovery,
            "size_mb_max": max((t[1] for t in tables), default=0) / 2**20,
            "dead_tuples_max": max((t[2] for t in tables), default=0),
            "per_minute": minutes}


def minute_table(title: str, runs: Sequence[dict[str, Any]]) -> list[str]:
    """A Markdown table of one system's minutes (each figure the median over `runs`)."""
    fields = ("offered_per_s", "started_per_s", "p50_ms", "p99_ms", "p999_ms", "size_mb",
              "dead_tuples")
    lines = [f"{title}", "", "| minute | snapshot held | offered jobs/s | started jobs/s | "
             "p50 ms | p99 ms | p99.9 ms | table+indexes MB | dead tuples |",
             "|" + " --- |" * 9]
    for i, first in enumerate(runs[0]["per_minute"]):
        cells = [_fmt(median([float(r["per_minute"][i][f]) for r in runs]))
                 for f in fields]
        lines.append(f"| {first['minute']} | {'yes' if first['snapshot'] else ''} | "
                     + " | ".join(cells) + " |")
    return lines


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"
