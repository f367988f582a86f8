"""`jobpool import FILE --tenant T --type K`: stage a CSV or JSON Lines file, enqueue its job."""

from __future__ import annotations

import argparse
import stat
from pathlib import Path
from typing import Any

from jobpool.cli_arguments import actor_of, add_actor, add_common_arguments
from jobpool.settings import Settings


def add_import_command(subparsers: Any, settings: Settings) -> None:
    """Add the `import` subcommand to the `jobpool` parser; its flags default to `settings`."""
    p = subparsers.add_parser(
        "import", help="stage a CSV or JSON Lines file of entities and enqueue bulk_import")
    add_common_arguments(p, settings)
    p.add_argument("file", type=Path, help="a .csv (header line first) or .jsonl file")
    p.add_argument("--tenant", required=True, help="tenant key or id")
    p.add_argument("--type", dest="type_key", required=True, help="entity type key")
    p.add_argument("--format", choices=["csv", "jsonl"], help="default: from the file suffix")
    p.add_argument("--key-field", default="external_key",
                   help="the field that holds each record's external key")
    p.add_argument("--unknown-keys", choices=["reject", "ignore"], default="reject",
                   help="fields that are not attributes of the type: reject the record "
                        "(default) or ignore the field")
    p.add_argument("--batch-size", type=int, help="records per committed batch (default 1000)")
    add_actor(p)
    p.set_defaults(func=cmd_import)


async def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Stage the file and enqueue its job in one transaction; print the ids."""
    from jobpool import admin
    from jobpool.db.connect import open_database
    from jobpool.kinds.entities.attributes import check_key
    from jobpool.kinds.imports.staging import detect_format, read_file, stage_import

    check_key("type_key", args.type_key)
    if args.batch_size is not None and not 1 <= args.batch_size <= 10_000:
        raise ValueError(f"--batch-size must be 1 to 10000, got {args.batch_size}")
    path: Path = args.file
    problem = not_a_regular_file(path)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    fmt = detect_format(path, args.format)
    async with await open_database(settings) as conn:
        tenant = await admin.resolve_tenant(conn, args.tenant)
        staged = await stage_import(
            conn, read_file(path, fmt, args.key_field), tenant_id=tenant["id"],
            type_key=args.type_key,
            source_name=path.name, fmt=fmt, key_field=args.key_field,
            unknown_keys=args.unknown_keys, batch_size=args.batch_size, actor=actor_of(args))
        await conn.commit()
    print(f"staged {staged.rows} record(s) from {path.name} as import {staged.import_job_id}; "
          f"enqueued bulk_import job {staged.job_id}")
    return 0


def not_a_regular_file(path: Path) -> str | None:
    """Why `path` cannot be imported (missing, a directory, a device or pipe), or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot read it: {exc.strerror or type(exc).__name__}"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a device, pipe or socket); import a CSV or JSON Lines file"
    return None
