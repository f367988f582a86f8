"""`jobpool status`'s schedules table: each schedule with its last and next run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

COLUMNS = ("schedule", "kind", "tenant", "when", "last run", "next run", "missed", "error")


def schedule_rows(schedules: Sequence[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The table rows of `list_schedules` rows, times in UTC and `next run` with its wait."""
    from jobpool.core.lane_activity import duration_text

    def at(moment: datetime | None) -> str:
        return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")

    return [{
        "schedule": s["name"], "kind": s["kind"], "tenant": s["tenant"],
        "when": f"{s['expression']} ({s['time_zone']})" if s["time_zone"] else s["expression"],
        "last run": at(s["last_run_at"]),
        "next run": f"{at(s['next_run_at'])} (in "
                    f"{duration_text(max(0.0, (s['next_run_at'] - now).total_seconds()))})",
        "missed": s["missed_total"], "error": s["last_error"] or "",
    } for s in schedules]


def print_schedules(live: Mapping[str, Any],
                    print_rows: Callable[[Sequence[dict[str, Any]], Sequence[str], bool], None],
                    ) -> None:
    """Print the overview's schedules after the lanes, as `jobpool status` shows them."""
    print("\nschedules (times in UTC)")
    print_rows(schedule_rows(live["schedules"], live["now"]), COLUMNS, False)
