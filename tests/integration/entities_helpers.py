"""Shared steps of the data-kind tests: entity types, workers, job rows."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def create_type(
    conn: Conn, tenant: uuid.UUID, type_key: str, attributes: Sequence[dict[str, Any]] = (),
    *, external: bool = False,
) -> int:
    """An entity type with attributes (dicts of ddm_entity_type_attribute columns)."""
    cur = await conn.execute(
        "INSERT INTO mdm.ddm_entity_type (tenant_id, type_key, is_external_source_target)"
        " VALUES (%s, %s, %s) RETURNING id", (tenant, type_key, external))
    row = await cur.fetchone()
    assert row is not None
    for attribute in attributes:
        await add_attribute(conn, row["id"], **attribute)
    return int(row["id"])


async def add_attribute(conn: Conn, entity_type_id: int, *, attr_key: str, data_type: str,
                        required: bool = False, enum_values: list[str] | None = None,
                        is_unique: bool = False, searchable: bool = False,
                        sortable: bool = False) -> int:
    cur = await conn.execute(
        "INSERT INTO mdm.ddm_entity_type_attribute (entity_type_id, attr_key, data_type,"
        " required, enum_values, is_unique, searchable, sortable)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (entity_type_id, attr_key, data_type, required, enum_values, is_unique, searchable,
         sortable))
    row = await cur.fetchone()
    assert row is not None
    return int(row["id"])


async def run_worker(dsn: str, *kinds: str) -> None:
    """Run an in-process worker for `kinds` until nothing runnable is left."""
    config = WorkerConfig(kinds=kinds, until_empty=True, poll_interval=0.2)
    await Worker(dsn, load_kind_modules(), config, actor="test").run()


async def jobs_of(conn: Conn, kind: str) -> list[dict[str, Any]]:
    cur = await conn.execute(
        "SELECT id, status::text AS status, attempts, last_error, result, payload, available_at"
        " FROM mdm.aa_job WHERE job_kind = %s ORDER BY id", (kind,))
    return await cur.fetchall()


async def make_runnable(conn: Conn, kind: str) -> None:
    """Make pending jobs of `kind` runnable now (skip their backoff)."""
    await conn.execute("UPDATE mdm.aa_job SET available_at = now()"
                       " WHERE job_kind = %s AND status = 'pending'", (kind,))


async def index_state(conn: Conn, name: str) -> dict[str, Any] | None:
    cur = await conn.execute(
        "SELECT i.indisvalid AS valid, i.indisunique AS is_unique, pg_get_indexdef(c.oid) AS def"
        " FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'mdm' AND c.relname = %s", (name,))
    return await cur.fetchone()
