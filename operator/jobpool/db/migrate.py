"""Forward-only migrations, applied in order under an advisory lock, then the built-in kinds.

A migration runs in one transaction with its row in `mdm.jobpool_migration`, unless its
first line is `-- jobpool: no-transaction` (`NO_TRANSACTION`): then its statements run one
by one outside a transaction (what `CREATE INDEX CONCURRENTLY` needs, so that a big queue
keeps working while an index is built) and the row is recorded after the last one. Such a
file must be safe to run again from the start after an interruption.

The built-in kinds are registered with the defaults their declarations carry (their
`jobpool.kinds` entry points), so a service can enqueue them before any worker has started.
Their modules need the worker extra; without it, `migrate` leaves them to the first worker.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from typing import Any

from psycopg import AsyncConnection, sql

from jobpool.db.queries import Exec, Many, One
from jobpool.db.store import kind_rows, register_kinds
from jobpool.errors import SchemaNotMigratedError
from jobpool.registry import builtin_kinds
from jobpool.sql import migrations

APPLIED_MIGRATIONS = Many("applied_migrations")
CREATE_MIGRATION_TABLE = Exec("create_migration_table")
MIGRATION_LOCK = One("migration_lock")
MIGRATION_TABLE_EXISTS = One("migration_table_exists")
MIGRATION_UNLOCK = Exec("migration_unlock")
RECORD_MIGRATION = Exec("record_migration")
REGISTER_KINDS = Exec("register_kinds")

log = logging.getLogger(__name__)

_LOCK_KEY = 0x6A6F62706F6F6C  # "jobpool"
_LOCK_POLL = 0.2
"""Seconds between two tries for the migration lock."""

NO_TRANSACTION = "-- jobpool: no-transaction"
"""First line of a migration whose statements run one by one outside a transaction."""


def runs_outside_transaction(text: str) -> bool:
    """Whether a migration's text starts with the `NO_TRANSACTION` marker."""
    return text.lstrip().startswith(NO_TRANSACTION)


def statements(text: str) -> list[str]:
    """The statements of a migration, split at each `;` that ends a line (comments dropped).

    Only for `NO_TRANSACTION` files, which hold plain statements (no function bodies).
    """
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [part.strip() for part in re.split(r";[ \t]*$", code, flags=re.M) if part.strip()]


async def applied_versions(conn: AsyncConnection[Any]) -> set[int]:
    """Versions recorded in `mdm.jobpool_migration` (empty on a fresh database)."""
    present = await MIGRATION_TABLE_EXISTS(conn)
    if not (present and present["present"]):
        return set()
    return {int(row["version"]) for row in await APPLIED_MIGRATIONS(conn)}


async def migrate(conn: AsyncConnection[Any]) -> list[str]:
    """Apply the migrations `conn`'s database lacks, register the built-in kinds; return the
    names of the migrations applied.

    Safe when several processes run it at once: they queue on an advisory lock, and each
    migration commits with its row in `mdm.jobpool_migration`. The built-in kinds' rows of
    `mdm.aa_job_kind` are set to their declared defaults on every run (a new release may
    change them); rows that already hold them are left untouched.
    """
    applied: list[str] = []
    await conn.set_autocommit(True)
    await _lock(conn)
    try:
        await CREATE_MIGRATION_TABLE(conn)
        done = await applied_versions(conn)
        for version, name, text in migrations():
            if version in done:
                continue
            if runs_outside_transaction(text):
                for statement in statements(text):
                    await conn.execute(statement.encode())
                await RECORD_MIGRATION(conn,
                                   {"version": version, "name": name})
            else:
                async with conn.transaction():
                    await conn.execute(text)
                    await RECORD_MIGRATION(conn,
                                       {"version": version, "name": name})
            applied.append(f"{version:04d}_{name}")
            log.info("applied migration %04d_%s", version, name)
        await register_kinds(conn, builtin_kinds())
    finally:
        await MIGRATION_UNLOCK(conn, {"key": _LOCK_KEY})
    return applied


async def _lock(conn: AsyncConnection[Any]) -> None:
    """Take the migration lock, polling: a session waiting inside pg_advisory_lock would hold
    a snapshot, and another process's CREATE INDEX CONCURRENTLY would wait for it forever."""
    while True:
        row = await MIGRATION_LOCK(conn, {"key": _LOCK_KEY})
        if row is not None and row["locked"]:
            return
        await asyncio.sleep(_LOCK_POLL)


async def check_schema(conn: AsyncConnection[Any]) -> None:
    """Raise SchemaNotMigratedError unless every migration is applied."""
    missing = sorted({v for v, _, _ in migrations()} - await applied_versions(conn))
    if missing:
        raise SchemaNotMigratedError(
            f"the database lacks jobpool migrations {missing}: run `jobpool migrate`"
        )


def migration_script() -> str:
    """All migrations, then the registration of the built-in kinds, as one SQL script (what
    `migrate` does), for platforms that run their own migration tool.

    Run it statement by statement (`psql -f`, or a tool that does the same): the migrations
    that build indexes CONCURRENTLY come without BEGIN/COMMIT and cannot run inside one
    multi-statement query.
    """
    parts = [CREATE_MIGRATION_TABLE.text]
    for version, name, text in migrations():
        record = (f"INSERT INTO mdm.jobpool_migration (version, name) VALUES ({version}, "
                  f"'{name}') ON CONFLICT DO NOTHING;")
        if runs_outside_transaction(text):
            parts.append(f"-- {version:04d}_{name} (outside a transaction)\n"
                         + "".join(f"{statement};\n" for statement in statements(text))
                         + record)
        else:
            parts.append(f"-- {version:04d}_{name}\nBEGIN;\n{text.strip()}\n{record}\nCOMMIT;")
    parts.append("-- the built-in kinds and their declared defaults\n"
                 + _inline(REGISTER_KINDS.text, kind_rows(builtin_kinds())))
    return "\n\n".join(parts) + "\n"


def _inline(query: str, params: Mapping[str, Any]) -> str:
    """`query` with each `%(name)s` placeholder replaced by the SQL literal of params[name]."""
    pieces = re.split(r"%\((\w+)\)s", query)
    return sql.Composed([
        sql.SQL(piece) if index % 2 == 0 else sql.Literal(params[piece])
        for index, piece in enumerate(pieces)
    ]).as_string(None)

