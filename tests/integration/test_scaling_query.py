"""The lane count query on real PostgreSQL: what each lane's scaler sees."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from pgbouncer_server import PgBouncer
from private_postgres import PrivateServer
from psycopg.rows import dict_row
from recording_proxy import recording_proxy

from integration.helpers import add_tenant, prepare
from jobpool.core.crd import API_VERSION
from jobpool.core.poolspec import PoolSpec, load_pool
from jobpool.core.scaling import LaneJobs
from jobpool.db import lane_counts
from jobpool.db.lane_counts import LaneCounter, count_lane_jobs, count_lane_jobs_at
from jobpool.db.queries import Many
from jobpool.k8s.manifests import keda_query

COUNT_LANE_JOBS = Many("count_lane_jobs")

Conn = psycopg.AsyncConnection[dict[str, Any]]
KINDS = ["email_send", "outbox_dispatch", "bulk_import", "reindex", "index_sync", "gin_backfill"]


def pool_of(*lanes: dict[str, Any]) -> PoolSpec:
    return load_pool({
        "apiVersion": API_VERSION, "kind": "JobWorkerPool",
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
    assert counts["heavy"] == LaneJobs(1, 0, capped=True)  # its cap: 1 replica x 1 worker
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
    query = keda_query(COUNT_LANE_JOBS.text, POOL.lane("bulk"))
    cur = await conn.execute(query.encode())
    row = await cur.fetchone()
    assert row is not None
    assert list(row.values()) == [7]


async def test_counts_stop_at_the_lane_cap_and_say_so(
    conn: Conn, kinds: None, tenant: uuid.UUID
) -> None:
    """3 replicas x 2 workers x 0.5 utilisation: 3 jobs already ask for every replica."""
    pool = pool_of({"name": "small", "kinds": ["reindex"], "maxReplicas": 3,
                    "workersPerPod": 2, "autoscaling": {"targetUtilization": 0.5}},
                   {"name": "roomy", "kinds": ["bulk_import"], "maxReplicas": 50})
    for kind in ("reindex", "bulk_import"):
        await add_jobs(conn, tenant, kind, 40)
        await add_jobs(conn, tenant, kind, 5, status="running")
    counts = await count_lane_jobs(conn, pool.lanes)
    assert counts["small"] == LaneJobs(3, 3, capped=True)
    assert counts["roomy"] == LaneJobs(40, 5, capped=False)


async def test_the_operator_counter_keeps_its_connection(
    dsn: str, conn: Conn, kinds: None, tenant: uuid.UUID
) -> None:
    await add_jobs(conn, tenant, "email_send", 2)
    counter = LaneCounter()
    try:
        first = await counter(dsn, POOL.lanes)
        kept = counter.connections[dsn]
        await add_jobs(conn, tenant, "email_send", 1)
        second = await counter(dsn, POOL.lanes)
        assert counter.connections[dsn] is kept
        in_count = await counter._answer(dsn, settings)
        in_session = await settings(kept)
    finally:
        await counter.close()
    assert (first["acme"].ready, second["acme"].ready) == (2, 3)
    assert in_count == ("5s", "off")
    assert in_session == ("0", "on")  # the count's own, never the session's
    assert counter.connections == {}


async def settings(conn: psycopg.AsyncConnection[Any]) -> tuple[str, str]:
    cur = await conn.execute("SELECT current_setting('statement_timeout'),"
                             " current_setting('jit')")
    row = await cur.fetchone()
    assert row is not None
    return tuple(row.values() if isinstance(row, dict) else row)  # type: ignore[return-value]


async def test_the_operator_counts_through_a_transaction_pooler(
    private_server: PrivateServer, pgbouncer: PgBouncer,
) -> None:
    """A pool's DSN may lead to PgBouncer: its counts failed at once ("unsupported startup
    parameter: options", their settings went as startup options), and prepared after five
    counts they would have met server connections without the statement. Ten counts, each
    with its settings, and none left on the pooler's server connections."""
    async with await psycopg.AsyncConnection.connect(
            private_server.dsn(), autocommit=True, row_factory=dict_row) as conn:
        await prepare(conn)
        tenant = await add_tenant(conn, "acme")
        await add_jobs(conn, tenant, "email_send", 2)
    counter = LaneCounter()
    try:
        counts = [(await counter(pgbouncer.dsn(), POOL.lanes))["acme"] for _ in range(10)]
        in_count = await counter._answer(pgbouncer.dsn(), settings)
    finally:
        await counter.close()
    assert counts == [LaneJobs(2, 0)] * 10
    assert in_count == ("5s", "off")
    async with await psycopg.AsyncConnection.connect(pgbouncer.dsn()) as client:
        assert await settings(client) == ("0", "on")


async def test_a_kept_count_connection_closed_while_idle_is_made_again_for_that_count(
    dsn: str, conn: Conn, kinds: None, tenant: uuid.UUID
) -> None:
    """A server restart, an `idle_session_timeout` or a pooler's idle timeout closes the
    connection kept between ticks: the count connects again instead of failing (with an
    idle timeout below the scale interval, every tick failed)."""
    await add_jobs(conn, tenant, "email_send", 2)
    counter = LaneCounter()
    try:
        await counter(dsn, POOL.lanes)
        kept = counter.connections[dsn]
        await conn.execute("SELECT pg_terminate_backend(%s)", (kept.info.backend_pid,))
        counts = await counter(dsn, POOL.lanes)
        assert counter.connections[dsn] is not kept
    finally:
        await counter.close()
    assert counts["acme"] == LaneJobs(2, 0)


async def test_behind_a_session_pooler_a_count_whose_session_was_closed_connects_again(
    private_server: PrivateServer, session_pgbouncer: PgBouncer,
) -> None:
    """There the server's closing message reaches the next BEGIN, which psycopg raises as
    InternalError ("received 2 results"): every other count failed."""
    async with await psycopg.AsyncConnection.connect(
            private_server.dsn(), autocommit=True, row_factory=dict_row) as direct:
        await prepare(direct)
        await add_jobs(direct, await add_tenant(direct, "acme"), "email_send", 2)
        counter = LaneCounter()
        try:
            first = await counter(session_pgbouncer.dsn(), POOL.lanes)
            await direct.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                 " WHERE application_name = 'jobpool-operator'")
            second = await counter(session_pgbouncer.dsn(), POOL.lanes)
        finally:
            await counter.close()
    assert first["acme"] == second["acme"] == LaneJobs(2, 0)


async def test_a_count_whose_database_goes_silent_fails_in_bounded_time(
    dsn: str, conn: Conn, kinds: None, tenant: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server-side statement timeout never reaches a client whose connection went
    silent; the operator syncs every pool in one loop, so a count must not wait for it."""
    monkeypatch.setattr(lane_counts, "ANSWER_TIMEOUT", 1.0)
    await add_jobs(conn, tenant, "email_send", 2)
    counter = LaneCounter()
    try:
        silent = asyncio.Event()
        async with recording_proxy(dsn, silent=silent) as (proxied, _):
            assert (await counter(proxied, POOL.lanes))["acme"].ready == 2
            silent.set()
            with pytest.raises(psycopg.OperationalError,
                               match=r"the database did not answer within 1s"):
                await asyncio.wait_for(counter(proxied, POOL.lanes), 30)
            assert proxied not in counter.connections  # dropped: the next count reconnects
            silent.clear()
            assert (await counter(proxied, POOL.lanes))["acme"].ready == 2
    finally:
        await counter.close()
