"""gin_backfill against a real PostgreSQL, and hostile keys."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobpool.kinds.indexes.index_plans import gin_index_name

from .entities_helpers import Conn, create_type, index_state, jobs_of, run_worker

pytestmark = pytest.mark.asyncio


async def _fill(conn: Conn, tenant: uuid.UUID, type_id: int, count: int = 400) -> None:
    await conn.execute(
        "INSERT INTO mdm.ddm_entity (tenant_id, entity_type_id, external_key, attributes)"
        " SELECT %s, %s, 's' || g, jsonb_build_object('source', 'crm', 'n', g)"
        "   FROM generate_series(1, %s) AS g", (tenant, type_id, count))


async def test_setting_external_source_target_builds_the_partial_gin_index(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id = await create_type(conn, tenant, "supplier")
    await _fill(conn, tenant, type_id)
    async with conn.transaction():
        await conn.execute("UPDATE mdm.ddm_entity_type SET is_external_source_target = true"
                           " WHERE id = %s", (type_id,))
        [pending] = await jobs_of(conn, "gin_backfill")
        assert pending["payload"] == {"entity_type_id": type_id, "type_key": "supplier"}

    await run_worker(dsn, "gin_backfill")

    [job] = await jobs_of(conn, "gin_backfill")
    assert job["status"] == "done" and job["attempts"] == 1
    name = gin_index_name(str(tenant), "supplier")
    assert name.startswith("ix_entity_attributes_gin_supplier_") and len(name) <= 63
    assert job["result"]["index"] == name and job["result"]["action"] == "build"
    assert job["result"]["explain"]["containment"]["uses_index"] is True
    state = await index_state(conn, name)
    assert state is not None and state["valid"]
    assert "USING gin (attributes jsonb_path_ops)" in state["def"]
    assert f"WHERE (entity_type_id = {type_id})" in state["def"]
    cur = await conn.execute("SELECT gin_index_status::text AS s FROM mdm.ddm_entity_type"
                             " WHERE id = %s", (type_id,))
    assert (await cur.fetchone() or {})["s"] == "active"


async def test_an_index_of_that_name_with_another_definition_is_rebuilt(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id = await create_type(conn, tenant, "supplier")
    await _fill(conn, tenant, type_id, 50)
    name = gin_index_name(str(tenant), "supplier")
    await conn.execute(psycopg.sql.SQL("CREATE INDEX {} ON mdm.ddm_entity (id)").format(
        psycopg.sql.Identifier(name)))
    await conn.execute("UPDATE mdm.ddm_entity_type SET is_external_source_target = true"
                       " WHERE id = %s", (type_id,))

    await run_worker(dsn, "gin_backfill")

    [job] = await jobs_of(conn, "gin_backfill")
    assert job["status"] == "done"
    assert job["result"]["action"] == "rebuild"
    assert "different definition" in job["result"]["reason"]
    state = await index_state(conn, name)
    assert state is not None and "USING gin" in state["def"]


async def test_two_tenants_with_the_same_type_key_get_two_indexes(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('globex') RETURNING id")
    other = (await cur.fetchone() or {})["id"]
    await create_type(conn, tenant, "supplier", external=True)
    await create_type(conn, other, "supplier", external=True)

    await run_worker(dsn, "gin_backfill")

    jobs = await jobs_of(conn, "gin_backfill")
    assert [j["status"] for j in jobs] == ["done", "done"]
    names = {gin_index_name(str(tenant), "supplier"), gin_index_name(str(other), "supplier")}
    assert len(names) == 2
    for name in names:
        assert (await index_state(conn, name) or {}).get("valid") is True


@pytest.mark.parametrize("type_key", ["x; drop table mdm.aa_job", "a" * 70])
async def test_a_hostile_type_key_is_rejected_with_a_clear_error_and_no_sql(
    dsn: str, conn: Conn, tenant: uuid.UUID, type_key: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        await conn.execute("INSERT INTO mdm.ddm_entity_type (tenant_id, type_key)"
                           " VALUES (%s, %s)", (tenant, type_key))
    await conn.execute("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts)"
                       " VALUES (%s, 'gin_backfill', %s, 3)",
                       (tenant, Jsonb({"type_key": type_key})))

    await run_worker(dsn, "gin_backfill")

    [job] = await jobs_of(conn, "gin_backfill")
    assert job["status"] == "dlq" and job["attempts"] == 1
    assert "invalid type_key" in job["last_error"]
    assert "^[a-z][a-z0-9_]{0,39}$" in job["last_error"]
    cur = await conn.execute("SELECT count(*) AS n FROM mdm.aa_job")
    assert (await cur.fetchone() or {})["n"] == 1  # mdm.aa_job is intact
    cur = await conn.execute("SELECT count(*) AS n FROM pg_indexes WHERE schemaname = 'mdm'"
                             " AND indexname LIKE 'ix_entity_attributes_gin_%%'")
    assert (await cur.fetchone() or {})["n"] == 0
