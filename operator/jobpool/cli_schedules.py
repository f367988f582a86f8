"""`jobpool status`'s schedules table (each schedule with its pool, last and next run), and
`jobpool schedules retire`, which deletes the schedules of a pool that is gone."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jobpool.cli_arguments import actor_of, add_actor, add_common_arguments
from jobpool.db.queries import Many
from jobpool.settings import Settings

COLUMNS = ("schedule", "pool", "kind", "tenant", "when", "last run", "next run", "missed",
           "error")
RETIRE_POOL_SCHEDULES = Many("retire_pool_schedules")
SCHEDULE_OWNERS = Many("schedule_owners")


def schedule_rows(schedules: Sequence[Mapping[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The table rows of `list_schedules` rows, times in UTC and `next run` with its wait."""
    from jobpool.core.lane_activity import duration_text

    def at(moment: datetime | None) -> str:
        return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")

    return [{
        "schedule": s["name"], "pool": s["owner"] or "(built in)", "kind": s["kind"],
        "tenant": s["tenant"],
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


def add_schedule_commands(subparsers: Any, settings: Settings) -> None:
    """Add `schedules retire` to the `jobpool` parser."""
    schedules = subparsers.add_parser("schedules", help="retire the schedules of a pool that "
                                                        "is gone")
    ssub = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    p = ssub.add_parser(
        "retire", help="delete every schedule a pool declared (its owner, as `jobpool status` "
                       "shows it); audited",
        description="A pool's workers retire the schedules its file no longer declares when "
                    "they start; a pool deleted for good has no workers to do so, and every "
                    "worker of the database would go on enqueueing its ticks.")
    add_common_arguments(p, settings)
    add_actor(p)
    p.add_argument("pool", help="the schedules' owner: <namespace>/<name> of a JobWorkerPool, "
                                "a pool file's name")
    p.set_defaults(func=cmd_schedules_retire)


async def cmd_schedules_retire(args: argparse.Namespace, settings: Settings) -> int:
    """Delete the pool's schedules and name them; ValueError naming the owners there are when
    the pool owns none."""
    from jobpool.db.connect import open_database

    async with await open_database(settings) as conn:
        retired = await RETIRE_POOL_SCHEDULES(conn, {"owner": args.pool,
                                                     "actor": actor_of(args)})
        await conn.commit()
        owners = [] if retired else await SCHEDULE_OWNERS(conn)
    if not retired:
        known = ", ".join(f"{o['owner']} ({o['schedules']})" for o in owners) or "none"
        raise ValueError(f"pool {args.pool!r} owns no schedule (pools that own schedules: "
                         f"{known}; the built-in ones belong to no pool)")
    names = [row["name"] for row in retired]
    print(f"retired {len(names)} schedule(s) of pool {args.pool}: {', '.join(names)}")
    return 0
