"""The lane count query on real PostgreSQL: what each lane's scaler sees."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from jobpool.core.poolspec import PoolSpec, load_pool
from jobpool.core.scaling import LaneJobs
from jobpool.db.scaling import count_lane_jobs, count_lane_jobs_at
from jobpool.k8s.manifests import keda_query
from jobpool.sql import QUERIES

Conn = psycopg.AsyncConnection[dict[str, Any]]
KINDS = ["email_send", "outbox_dispatch", "bulk_import", "reindex", "index_sync", "gin_backfill"]


def pool_of(*lanes: dict[str, Any]) -> PoolSpec:
    return load_pool({
        "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
        "metadata": {"name": "p"},
        "spec": {"image": "i", "database": {"secretName": "s"}, "lanes": list(lanes)},
    })


POOL = pool_of(
    {"name": "default"},
    {"name": "bulk", "kinds": ["bulk_import", "reindex"]},
    {"name": "acme", "kinds": ["email_send"], "tenants": ["acme"]},
)


async def add_jobs(
    conn: Conn, tenant: uuid.UUID, kind: str, count: int, *, status: str = "pending",
    delay: str = "0 seconds",
) -> None:
    claimed = status == "running"
    await conn.execute(
        """
        INSERT INTO mdm.aa_job (tenant_id, job_kind, status, available_at, max_attempts,
                                claimed_by, claimed_at, completed_at)
        SELECT %(tenant)s, %(kind)s, %(status)s::mdm.job_status, now() + %(delay)s::interval, 3,
               CASE WHEN %(claimed)s THEN 'test/1/x' END, CASE WHEN %(claimed)s THEN now() END,
               CASE WHEN %(status)s IN ('done', 'dlq') THEN now() END
          FROM generate_series(1, %(count)s)
        """,
        {"tenant": tenant, "kind": kind, "status": status, "delay": delay,
         "claimed": claimed, "count": count},
    )


@pytest.fixture
async def kinds(conn: Conn) -> None:
    for kind in KINDS:
        await conn.execute(
            "INSERT INTO mdm.aa_job_kind (name) VALUES (%s) ON CONFLICT DO NOTHING", (kind,)
        )


@pytest.fixture
async def other_tenant(conn: Conn) -> uuid.UUID:
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('beta') RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


async def test_empty_table_counts_zero_for_every_lane(conn: Conn, kinds: None) -> None:
    counts = await count_lane_jobs(conn, POOL.lanes)
    assert counts == {lane.name: LaneJobs(0, 0) for lane in POOL.lanes}


async def test_jobs_scheduled_later_do_not_count(
    conn: Conn, kinds: None, tenant: uuid.UUID
) -> None:
    await add_jobs(conn, tenant, "outbox_dispatch", 100, delay="1 hour")
    counts = await count_lane_jobs(conn, POOL.lanes)
    assert counts["default"] == LaneJobs(0, 0)


async def test_ready_and_running_count_finished_jobs_do_not(
    conn: Conn, kinds: None, tenant: uuid.UUID
) -> None:
    await add_jobs(conn, tenant, "outbox_dispatch", 17)
    await add_jobs(conn, tenant, "outbox_dispatch", 3, status="running")
    for status in ("done", "dlq"):
        await add_jobs(conn, tenant, "outbox_dispatch", 5, status=status)
    counts = await count_lane_jobs(conn, POOL.lanes)
    assert counts["default"] == LaneJobs(17, 3)


async def test_other_lanes_kinds_do_not_count(
    conn: Conn, kinds: None, tenant: uuid.UUID, other_tenant: uuid.UUID
) -> None:
    await add_jobs(conn, tenant, "bulk_import", 7)
    await add_jobs(conn, tenant, "index_sync", 2)
    await add_jobs(conn, other_tenant, "email_send", 4)
    await add_jobs(conn, tenant, "email_send", 5, status="running")
    counts = await count_lane_jobs(conn, POOL.lanes)
    assert counts["bulk"] == LaneJobs(7, 0)
    assert counts["heavy"] == LaneJobs(2, 0)
    assert counts["default"] == LaneJobs(4, 5)  # email_send of every tenant, no bulk, no heavy
    assert counts["acme"] == LaneJobs(0, 5)  # only acme's email_send


async def test_tenants_by_key_or_id_and_unknown_tenants(
    conn: Conn, kinds: None, tenant: uuid.UUID, other_tenant: uuid.UUID
) -> None:
    await add_jobs(conn, tenant, "reindex", 3)
    await add_jobs(conn, other_tenant, "reindex", 2)
    pool = pool_of(
        {"name": "by-key", "kinds": ["reindex"], "tenants": ["acme"]},
        {"name": "by-id", "kinds": ["reindex"], "tenants": [str(other_tenant)]},
        {"name": "nobody", "kinds": ["reindex"], "tenants": ["no-such-tenant"]},
    )
    counts = await count_lane_jobs(conn, pool.lanes)
    assert (counts["by-key"], counts["by-id"], counts["nobody"]) == (
        LaneJobs(3, 0), LaneJobs(2, 0), LaneJobs(0, 0))


async def test_count_through_a_dsn(dsn: str, conn: Conn, kinds: None, tenant: uuid.UUID) -> None:
    await add_jobs(conn, tenant, "email_send", 2)
    counts = await count_lane_jobs_at(dsn, POOL.lanes)
    assert counts["default"] == LaneJobs(2, 0)
    assert counts["acme"] == LaneJobs(2, 0)


async def test_keda_query_runs_and_totals_one_lane(
    conn: Conn, kinds: None, tenant: uuid.UUID
) -> None:
    await add_jobs(conn, tenant, "bulk_import", 6)
    await add_jobs(conn, tenant, "reindex", 1, status="running")
    await add_jobs(conn, tenant, "email_send", 9)
    query = keda_query(QUERIES["count_lane_jobs"].text, POOL.lane("bulk"))
    cur = await conn.execute(query.encode())
    row = await cur.fetchone()
    assert row is not None
    assert list(row.values()) == [7]
