"""index_sync against a real PostgreSQL: online builds, drift, blockers, duplicates."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from jobpool.kinds.indexes.index_builds import check_own_transaction
from jobpool.kinds.indexes.index_plans import attribute_index_name
from jobpool.kinds.indexes.index_sync import SyncPayload, index_work, wanted_index

from .entities_helpers import (
    Conn,
    add_attribute,
    create_type,
    index_state,
    jobs_of,
    make_runnable,
    run_worker,
)

pytestmark = pytest.mark.asyncio


async def _customer(conn: Conn, tenant: uuid.UUID) -> tuple[int, int]:
    type_id = await create_type(conn, tenant, "customer")
    attr_id = await add_attribute(conn, type_id, attr_key="email", data_type="string")
    await conn.execute(
        "INSERT INTO mdm.ddm_entity (tenant_id, entity_type_id, external_key, attributes)"
        " SELECT %s, %s, 'c' || g, jsonb_build_object('email', 'user' || g || '@example.com')"
        "   FROM generate_series(1, 500) AS g", (tenant, type_id))
    return type_id, attr_id


async def _customer_with_sorted_email(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> tuple[int, str]:
    """A customer type whose `email` is sortable and indexed; its attribute id and index name."""
    _, attr_id = await _customer(conn, tenant)
    await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET sortable = true WHERE id = %s",
                       (attr_id,))
    await run_worker(dsn, "index_sync")
    return attr_id, attribute_index_name(str(tenant), "customer", "email")


async def _attribute(conn: Conn, attr_id: int) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT index_status::text AS index_status, index_error"
        " FROM mdm.ddm_entity_type_attribute WHERE id = %s", (attr_id,))
    row = await cur.fetchone()
    assert row is not None
    return row


async def test_toggle_searchable_builds_a_valid_index_that_serves_the_query_and_off_drops_it(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id, attr_id = await _customer(conn, tenant)
    name = attribute_index_name(str(tenant), "customer", "email")

    async with conn.transaction():
        await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET searchable = true"
                           " WHERE id = %s", (attr_id,))
        inside = await jobs_of(conn, "index_sync")
        assert [j["payload"]["attribute_id"] for j in inside] == [attr_id]
        assert (await _attribute(conn, attr_id))["index_status"] == "building"

    await run_worker(dsn, "index_sync")

    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "done" and job["attempts"] == 1
    assert job["result"]["action"] == "build"
    assert job["result"]["explain"]["equality"]["uses_index"] is True
    assert job["result"]["serves_canonical_queries"] is True
    state = await index_state(conn, name)
    assert state is not None and state["valid"] and not state["is_unique"]
    assert f"WHERE (entity_type_id = {type_id})" in state["def"]
    assert (await _attribute(conn, attr_id))["index_status"] == "active"
    async with conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(
            "EXPLAIN SELECT id FROM mdm.ddm_entity WHERE entity_type_id = %s"
            " AND attributes ->> 'email' = 'user7@example.com'", (type_id,))
        plan = "\n".join(str(r["QUERY PLAN"]) for r in await cur.fetchall())
    assert name in plan

    await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET searchable = false"
                       " WHERE id = %s", (attr_id,))
    await run_worker(dsn, "index_sync")

    jobs = await jobs_of(conn, "index_sync")
    assert [j["status"] for j in jobs] == ["done", "done"]
    assert jobs[1]["result"]["action"] == "drop"
    assert await index_state(conn, name) is None
    assert (await _attribute(conn, attr_id))["index_status"] == "dropped"


async def test_sortable_integer_index_serves_order_by(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id = await create_type(conn, tenant, "product")
    await conn.execute(
        "INSERT INTO mdm.ddm_entity (tenant_id, entity_type_id, external_key, attributes)"
        " SELECT %s, %s, 'p' || g, jsonb_build_object('price', g) FROM generate_series(1, 300) g",
        (tenant, type_id))
    await add_attribute(conn, type_id, attr_key="price", data_type="integer", sortable=True)

    await run_worker(dsn, "index_sync")

    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "done"
    assert job["result"]["explain"]["sort"]["uses_index"] is True
    async with conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(
            "SELECT external_key FROM mdm.ddm_entity WHERE entity_type_id = %s"
            " ORDER BY (attributes ->> 'price')::bigint DESC LIMIT 2", (type_id,))
        assert [r["external_key"] for r in await cur.fetchall()] == ["p300", "p299"]


async def test_an_unchanged_valid_index_is_left_alone(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    attr_id, name = await _customer_with_sorted_email(dsn, conn, tenant)
    before = await conn.execute("SELECT %s::regclass::oid AS oid", (f"mdm.{name}",))
    oid = (await before.fetchone() or {})["oid"]

    await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET searchable = true WHERE id = %s",
                       (attr_id,))
    await run_worker(dsn, "index_sync")

    jobs = await jobs_of(conn, "index_sync")
    assert jobs[1]["result"]["action"] == "keep"
    after = await conn.execute("SELECT %s::regclass::oid AS oid", (f"mdm.{name}",))
    assert (await after.fetchone() or {})["oid"] == oid


async def test_an_invalid_index_left_by_a_failed_unique_build_is_replaced(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id, attr_id = await _customer(conn, tenant)
    await conn.execute("UPDATE mdm.ddm_entity SET attributes = '{\"email\": \"dup@example.com\"}'"
                       " WHERE external_key IN ('c1', 'c2')")
    cur = await conn.execute(
        "SELECT a.*, a.data_type::text AS data_type, t.tenant_id, t.type_key"
        " FROM mdm.ddm_entity_type_attribute a JOIN mdm.ddm_entity_type t"
        " ON t.id = a.entity_type_id WHERE a.id = %s", (attr_id,))
    attribute = await cur.fetchone()
    assert attribute is not None
    attribute.update(searchable=True, is_unique=True)
    request = SyncPayload(attribute_id=attr_id, type_key="customer", attr_key="email")
    name, wanted = wanted_index(tenant, request, attribute)
    work = index_work(name, wanted)
    assert work.create is not None
    with pytest.raises(psycopg.errors.UniqueViolation):
        await conn.execute(work.create)  # the failed build leaves an INVALID index
    leftover = await index_state(conn, name)
    assert leftover is not None and leftover["valid"] is False
    await conn.execute("UPDATE mdm.ddm_entity SET attributes = '{\"email\": \"c2@example.com\"}'"
                       " WHERE external_key = 'c2'")

    await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET searchable = true,"
                       " is_unique = true WHERE id = %s", (attr_id,))
    await run_worker(dsn, "index_sync")

    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "done", job["last_error"]
    assert job["result"]["action"] == "rebuild"
    assert "INVALID" in job["result"]["reason"]
    state = await index_state(conn, name)
    assert state is not None and state["valid"] and state["is_unique"]
    assert f"WHERE (entity_type_id = {type_id})" in state["def"]


async def test_duplicate_key_in_a_unique_build_goes_to_the_dlq_at_once_naming_the_key(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    _, attr_id = await _customer(conn, tenant)
    await conn.execute("UPDATE mdm.ddm_entity SET attributes = '{\"email\": \"twice@example.com\"}'"
                       " WHERE external_key IN ('c5', 'c6')")
    await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET sortable = true,"
                       " is_unique = true WHERE id = %s", (attr_id,))

    await run_worker(dsn, "index_sync")

    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "dlq" and job["attempts"] == 1
    assert "twice@example.com" in job["last_error"]
    assert await index_state(conn, attribute_index_name(str(tenant), "customer", "email")) is None
    attribute = await _attribute(conn, attr_id)
    assert attribute["index_status"] == "failed"
    assert "twice@example.com" in attribute["index_error"]


async def test_a_value_past_the_index_rows_limit_goes_to_the_dlq_at_once_naming_it(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    """A stored value too long for an index row (SQLSTATE class 54, which every retry would
    meet): no retries, the INVALID index dropped, the limit named."""
    _, attr_id = await _customer(conn, tenant)
    await conn.execute(  # 9,600 characters: past what one index row holds
        "UPDATE mdm.ddm_entity SET attributes = jsonb_build_object('email',"
        " (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) AS g))"
        " WHERE external_key = 'c7'")
    await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET sortable = true WHERE id = %s",
                       (attr_id,))

    await run_worker(dsn, "index_sync")

    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "dlq" and job["attempts"] == 1
    name = attribute_index_name(str(tenant), "customer", "email")
    assert (f"index {name} cannot be built, a stored value is past a server limit: index row "
            "requires ") in job["last_error"]
    assert "the INVALID index it left was dropped" in job["last_error"]
    assert await index_state(conn, name) is None
    assert (await _attribute(conn, attr_id))["index_status"] == "failed"


async def test_a_build_blocked_by_a_repeatable_read_transaction_times_out_then_succeeds(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    _, attr_id = await _customer(conn, tenant)
    name = attribute_index_name(str(tenant), "customer", "email")
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as blocker:
        await blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await blocker.execute("SELECT count(*) FROM mdm.aa_tenant")  # takes the snapshot
        await conn.execute("UPDATE mdm.ddm_entity_type_attribute SET searchable = true"
                           " WHERE id = %s", (attr_id,))
        await conn.execute("UPDATE mdm.aa_job SET payload = payload || '{\"lock_timeout\": 1}'"
                           " WHERE job_kind = 'index_sync'")

        await run_worker(dsn, "index_sync")

        [job] = await jobs_of(conn, "index_sync")
        assert job["status"] == "pending" and job["attempts"] == 1
        assert "BuildBlockedError" in job["last_error"] and "lock_timeout 1s" in job["last_error"]
        assert "the INVALID index it left was dropped" in job["last_error"]
        assert await index_state(conn, name) is None  # no INVALID index left behind
        assert (await _attribute(conn, attr_id))["index_status"] == "building"
        await blocker.commit()

    await make_runnable(conn, "index_sync")
    await run_worker(dsn, "index_sync")

    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "done" and job["attempts"] == 2
    state = await index_state(conn, name)
    assert state is not None and state["valid"]
    assert (await _attribute(conn, attr_id))["index_status"] == "active"


async def test_an_open_transaction_without_a_snapshot_does_not_block_a_concurrent_build(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    """What the worker relies on: `tx` has sent BEGIN (psycopg's transaction() does so at once)
    but runs nothing before the build, so it holds no snapshot; one that has read under
    REPEATABLE READ holds a snapshot and would block the build, its own worker's included."""
    type_id, _ = await _customer(conn, tenant)
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as tx:
        async with tx.transaction():
            status = await conn.execute(
                "SELECT state, backend_xmin FROM pg_stat_activity WHERE pid = %s",
                (tx.info.backend_pid,))
            row = await status.fetchone()
            assert row is not None
            assert row["state"] == "idle in transaction"  # BEGIN was sent already
            assert row["backend_xmin"] is None  # ... but no snapshot is held
            await check_own_transaction(conn, tx.info.backend_pid)  # the handler's guard passes
            await conn.execute("SET lock_timeout = '2s'")
            await conn.execute(sql.SQL(
                "CREATE INDEX CONCURRENTLY ix_probe_ok ON mdm.ddm_entity"
                " ((attributes ->> 'email')) WHERE entity_type_id = {}").format(type_id))
        assert (await index_state(conn, "ix_probe_ok") or {}).get("valid") is True

        await tx.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await tx.execute("SELECT 1")
        with pytest.raises(RuntimeError, match="holds a snapshot"):
            await check_own_transaction(conn, tx.info.backend_pid)
        await conn.execute("SET lock_timeout = '1s'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            await conn.execute("CREATE INDEX CONCURRENTLY ix_probe_blocked ON mdm.ddm_entity"
                               " ((attributes ->> 'email'), id)")
        await tx.rollback()


async def test_deleting_an_indexed_attribute_drops_its_index(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    attr_id, name = await _customer_with_sorted_email(dsn, conn, tenant)
    assert await index_state(conn, name) is not None

    await conn.execute("DELETE FROM mdm.ddm_entity_type_attribute WHERE id = %s", (attr_id,))
    await run_worker(dsn, "index_sync")

    jobs = await jobs_of(conn, "index_sync")
    assert jobs[-1]["status"] == "done" and jobs[-1]["result"]["action"] == "drop"
    assert await index_state(conn, name) is None


async def test_a_hostile_attr_key_in_the_payload_is_refused_before_any_sql(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts) VALUES"
        " (%s, 'index_sync', %s, 3)",
        (tenant, psycopg.types.json.Jsonb({"attribute_id": 1, "type_key": "customer",
                                           "attr_key": "x\"; DROP TABLE mdm.aa_job; --"})))
    await run_worker(dsn, "index_sync")
    [job] = await jobs_of(conn, "index_sync")
    assert job["status"] == "dlq" and job["attempts"] == 1
    assert "invalid attr_key" in job["last_error"]
