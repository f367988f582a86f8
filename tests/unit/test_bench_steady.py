"""The steady-state benchmark's figures (bench/steady_figures.py), from recorded seconds."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from steady_figures import summary


def _run(after_release: list[float]) -> dict[str, object]:
    """Three minutes at 10 jobs/s: 10 ms before the snapshot (held in minute 2), 100 ms while
    it is held, then `after_release` (one latency per second), then 10 ms again."""
    latencies = [[10.0] * 10 for _ in range(60)] + [[100.0] * 10 for _ in range(60)]
    latencies += [[value] * 10 for value in after_release]
    latencies += [[10.0] * 10 for _ in range(60 - len(after_release))]
    tables = [(float(s), 1000 * s, s // 2) for s in range(0, 180, 5)]
    return summary(latencies, [10] * 180, tables, 180.0, 60.0, 60.0)


def test_the_p99_before_and_during_the_snapshot_and_the_recovery_after_it() -> None:
    figures = _run([100.0] * 7)
    assert figures["p99_ms_before"] == 10.0
    assert figures["p99_ms_held"] == 100.0
    assert figures["recovery_s"] == 7.0
    assert figures["held"] == 1.0 and figures["sent"] == figures["started"] == 1800


def test_a_run_whose_p99_never_comes_back_has_no_recovery_time() -> None:
    assert math.isnan(float(str(_run([100.0] * 60)["recovery_s"])))


def test_minutes_carry_the_rates_the_snapshot_and_the_last_table_sample() -> None:
    minutes = _run([])["per_minute"]
    assert isinstance(minutes, list)
    assert [m["snapshot"] for m in minutes] == [False, True, False]
    assert [m["offered_per_s"] for m in minutes] == [10.0, 10.0, 10.0]
    assert [m["started_per_s"] for m in minutes] == [10.0, 10.0, 10.0]
    assert [m["p99_ms"] for m in minutes] == [10.0, 100.0, 10.0]
    assert [m["size_mb"] * 2**20 for m in minutes] == [55_000, 115_000, 175_000]
    assert [m["dead_tuples"] for m in minutes] == [27, 57, 87]
