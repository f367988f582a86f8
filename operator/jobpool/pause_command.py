"""`jobpool pause`, `jobpool resume` and `jobpool paused`: hold a scope's ready jobs, let them
go again, list what is held (`jobpool.pauses`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from jobpool.cli_arguments import actor_of, add_actor, add_common_arguments
from jobpool.core.jsondata import escape_line
from jobpool.core.pause_scopes import MAX_REASON, check_scope, overlaps, scope_text
from jobpool.settings import Settings
from jobpool.terminal import print_table

_SCOPE_HELP = ("a tenant key or id, a kind, or both: --tenant alone is every kind of the "
               "tenant, --kind alone the kind for every tenant")


def add_pause_commands(subparsers: Any, settings: Settings) -> None:
    """Add `pause`, `resume` and `paused` to the `jobpool` parser."""
    p = subparsers.add_parser(
        "pause", help="leave the ready jobs of a tenant, a kind or a (tenant, kind) pair "
                      "unclaimed until resumed (running jobs finish)",
        description=_SCOPE_HELP)
    add_common_arguments(p, settings)
    add_actor(p)
    _add_scope(p)
    p.add_argument("--reason", help=f"why (shown with the pause; at most {MAX_REASON} "
                                    "characters)")
    p.set_defaults(func=cmd_pause)

    p = subparsers.add_parser("resume", help="resume a paused scope (as `pause` named it)",
                              description=_SCOPE_HELP)
    add_common_arguments(p, settings)
    add_actor(p)
    _add_scope(p)
    p.set_defaults(func=cmd_resume)

    p = subparsers.add_parser("paused", help="list the paused scopes and the jobs they hold")
    add_common_arguments(p, settings)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_paused)


def _checked_scope(args: argparse.Namespace) -> None:
    try:
        check_scope(args.tenant, args.kind)
    except ValueError as exc:
        raise ValueError(f"{exc} (--tenant T, --kind K)") from None


def _add_scope(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="tenant key or id (default: every tenant)")
    parser.add_argument("--kind", help="job kind (default: every kind)")


async def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause the scope; say so, or that it was paused already (by whom, since when)."""
    from jobpool.db.connect import open_database
    from jobpool.pauses import pause

    _checked_scope(args)
    async with await open_database(settings) as conn:
        row, created = await pause(conn, tenant=args.tenant, kind=args.kind,
                                   actor=actor_of(args), reason=args.reason)
        await conn.commit()
    scope = scope_text(row["tenant"], row["kind"])
    if created:
        print(f"paused {scope}")
    else:
        print(f"{scope} was paused already, by {escape_line(row['paused_by'])} at "
              f"{row['paused_at'].isoformat()}{_reason(row)}")
    return 0


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume the scope; an error names what is paused when it was not."""
    from jobpool.db.connect import open_database
    from jobpool.pauses import resume

    _checked_scope(args)
    async with await open_database(settings) as conn:
        row = await resume(conn, tenant=args.tenant, kind=args.kind, actor=actor_of(args))
        await conn.commit()
        paused = await _list(conn)
    print(f"resumed {scope_text(row['tenant'], row['kind'])} "
          f"(paused by {escape_line(row['paused_by'])} at {row['paused_at'].isoformat()})")
    for other in paused:
        if overlaps(other, row):
            print(f"  still paused: {scope_text(other['tenant'], other['kind'])}")
    return 0


async def cmd_paused(args: argparse.Namespace, settings: Settings) -> int:
    """List the paused scopes."""
    from jobpool.db.connect import open_database

    async with await open_database(settings) as conn:
        rows = await _list(conn)
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
    else:
        print_pauses(rows)
    return 0


async def _list(conn: Any) -> list[dict[str, Any]]:
    from jobpool.pauses import list_pauses

    return await list_pauses(conn)


def _reason(row: Mapping[str, Any]) -> str:
    return f" ({escape_line(row['reason'])})" if row.get("reason") else ""


def print_pauses(pauses: Sequence[Mapping[str, Any]]) -> None:
    """The paused scopes as a table (tenant, kind, jobs held, who, since, why), or a line
    saying that nothing is paused; `jobpool status` prints it too."""
    if not pauses:
        print("nothing is paused")
        return
    rows = [[p["tenant"] or "*", p["kind"] or "*", str(p["pending"]), str(p["ready"]),
             str(p["paused_by"]), p["paused_at"].isoformat(timespec="seconds"),
             p["reason"] or ""] for p in pauses]
    print_table(["tenant", "kind", "pending", "ready", "paused by", "since", "reason"], rows)
