"""Forward-only migrations, applied in order under an advisory lock."""

from __future__ import annotations

import logging
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import tuple_row

from jobpool.errors import SchemaNotMigratedError
from jobpool.sql import QUERIES, migrations

log = logging.getLogger(__name__)

_LOCK_KEY = 0x6A6F62706F6F6C  # "jobpool"


async def applied_versions(conn: AsyncConnection[Any]) -> set[int]:
    """Versions recorded in `mdm.jobpool_migration` (empty on a fresh database)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(QUERIES["migration_table_exists"].text)
        present = await cur.fetchone()
        if not (present and present[0]):
            return set()
        await cur.execute(QUERIES["applied_migrations"].text)
        return {int(row[0]) for row in await cur.fetchall()}


async def migrate(conn: AsyncConnection[Any]) -> list[str]:
    """Apply the migrations `conn`'s database lacks; return their names.

    Safe when several processes run it at once: they queue on an advisory lock, and each
    migration commits with its row in `mdm.jobpool_migration`.
    """
    applied: list[str] = []
    await conn.set_autocommit(True)
    await conn.execute(QUERIES["migration_lock"].text, {"key": _LOCK_KEY})
    try:
        await conn.execute(QUERIES["create_migration_table"].text)
        done = await applied_versions(conn)
        for version, name, text in migrations():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(text)
                await conn.execute(QUERIES["record_migration"].text,
                                   {"version": version, "name": name})
            applied.append(f"{version:04d}_{name}")
            log.info("applied migration %04d_%s", version, name)
    finally:
        await conn.execute(QUERIES["migration_unlock"].text, {"key": _LOCK_KEY})
    return applied


async def check_schema(conn: AsyncConnection[Any]) -> None:
    """Raise SchemaNotMigratedError unless every migration is applied."""
    missing = sorted({v for v, _, _ in migrations()} - await applied_versions(conn))
    if missing:
        raise SchemaNotMigratedError(
            f"the database lacks jobpool migrations {missing}: run `jobpool migrate`"
        )


def migration_script() -> str:
    """All migrations as one SQL script, for platforms that run their own migration tool."""
    parts = [QUERIES["create_migration_table"].text]
    for version, name, text in migrations():
        parts.append(
            f"-- {version:04d}_{name}\nBEGIN;\n{text.strip()}\n"
            f"INSERT INTO mdm.jobpool_migration (version, name) VALUES ({version}, '{name}')"
            " ON CONFLICT DO NOTHING;\nCOMMIT;"
        )
    return "\n\n".join(parts) + "\n"
