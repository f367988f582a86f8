"""reindex against a real PostgreSQL: rebuild search vectors in batches, alongside writes."""

from __future__ import annotations

import asyncio
import random
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from .entities_helpers import Conn, add_attribute, create_type, jobs_of, run_worker

pytestmark = pytest.mark.asyncio


async def _stale_vectors(conn: Conn, type_id: int) -> int:
    cur = await conn.execute(
        "SELECT count(*) AS n FROM mdm.ddm_entity e WHERE entity_type_id = %s"
        " AND search_vector IS DISTINCT FROM mdm.entity_search_vector(e.attributes,"
        " ARRAY(SELECT attr_key FROM mdm.ddm_entity_type_attribute"
        "       WHERE entity_type_id = %s AND searchable ORDER BY attr_key))", (type_id, type_id))
    return int((await cur.fetchone() or {})["n"])


async def _setup(conn: Conn, tenant: uuid.UUID) -> int:
    type_id = await create_type(conn, tenant, "person")
    await conn.execute(
        "INSERT INTO mdm.ddm_entity (tenant_id, entity_type_id, external_key, attributes)"
        " SELECT %s, %s, 'p' || g, jsonb_build_object('name', 'Name' || g, 'city',"
        "        CASE WHEN g %% 2 = 0 THEN 'Berlin' ELSE 'Hamburg' END)"
        "   FROM generate_series(1, 2000) AS g", (tenant, type_id))
    return type_id


async def test_toggling_searchable_enqueues_reindex_and_it_rebuilds_every_vector(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id = await _setup(conn, tenant)
    async with conn.transaction():
        await add_attribute(conn, type_id, attr_key="name", data_type="string", searchable=True)
        await add_attribute(conn, type_id, attr_key="city", data_type="string", searchable=True)
    assert len(await jobs_of(conn, "reindex")) == 1  # once per transaction and type
    assert await _stale_vectors(conn, type_id) == 2000

    await run_worker(dsn, "reindex")

    [job] = await jobs_of(conn, "reindex")
    assert job["status"] == "done"
    assert job["result"]["search_keys"] == ["city", "name"]
    assert (job["result"]["scanned"], job["result"]["updated"]) == (2000, 2000)
    assert await _stale_vectors(conn, type_id) == 0
    cur = await conn.execute("SELECT count(*) AS n FROM mdm.ddm_entity WHERE search_vector @@"
                             " to_tsquery('simple', 'berlin & name42')")
    assert (await cur.fetchone() or {})["n"] == 1


async def test_reindex_twice_and_alongside_writes_leaves_every_vector_right(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    type_id = await _setup(conn, tenant)
    await add_attribute(conn, type_id, attr_key="name", data_type="string", searchable=True)
    await conn.execute("UPDATE mdm.aa_job SET payload = payload || '{\"batch_size\": 50}'"
                       " WHERE job_kind = 'reindex'")

    async def writer() -> int:
        rng = random.Random(7)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            for i in range(300):
                key = f"p{rng.randint(1, 2000)}"
                await other.execute(
                    "UPDATE mdm.ddm_entity SET attributes = attributes || %s,"
                    " search_vector = mdm.entity_search_vector(attributes || %s, ARRAY['name'])"
                    " WHERE external_key = %s",
                    (Jsonb({"name": f"Renamed{i}"}), Jsonb({"name": f"Renamed{i}"}), key))
        return 300

    written, _ = await asyncio.gather(writer(), run_worker(dsn, "reindex"))
    assert written == 300
    assert await _stale_vectors(conn, type_id) == 0

    await conn.execute("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts)"
                       " VALUES (%s, 'reindex', '{\"type_key\": \"person\"}', 3)", (tenant,))
    await run_worker(dsn, "reindex")

    jobs = await jobs_of(conn, "reindex")
    assert [j["status"] for j in jobs] == ["done", "done"]
    assert jobs[1]["result"]["scanned"] == 2000 and jobs[1]["result"]["updated"] == 0
