"""Claims while a snapshot is held open: the index entries of the jobs claimed since cannot be
removed, so a bounded claim starts past the last job claimed from each pair instead of stepping
over them; a full claim still finds the jobs that lie behind a bound."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from integration.helpers import add_tenant, prepare
from jobpool.core import claim_bounds
from jobpool.core.claim_bounds import Bound, Pair
from jobpool.db.connect import open_pool
from jobpool.db.store import CLAIM_JOBS, QueueStore, claim_parameters

Conn = psycopg.AsyncConnection[dict[str, Any]]

KIND = "test_record"


async def _jobs(conn: Conn, tenant: uuid.UUID, count: int, *, age: float = 60.0) -> list[int]:
    """`count` pending jobs, the first available `age` seconds ago, each a millisecond after
    the one before."""
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, available_at, max_attempts)"
        " SELECT %s, %s, now() - make_interval(secs => %s) + make_interval(secs => 0.001 * g), 5"
        " FROM generate_series(0, %s - 1) g ORDER BY g RETURNING id",
        (tenant, KIND, age, count))
    return [int(row["id"]) for row in await cur.fetchall()]


def _bounds(rows: list[dict[str, Any]]) -> dict[Pair, Bound]:
    last = max(rows, key=lambda row: (row["priority"], row["available_at"], row["id"]))
    return {(last["job_kind"], last["tenant_id"]):
            (last["priority"], last["available_at"], last["id"])}


@pytest.fixture
def always_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every full claim counts as slow, and bounded claims, once begun, last all of the test."""
    monkeypatch.setattr(claim_bounds, "SLOW_CLAIM", 0.0)
    monkeypatch.setattr(claim_bounds, "SLOW_PAIR", 0.0)
    monkeypatch.setattr(claim_bounds, "FULL_CLAIM_SHARE", 1e-9)


@pytest.fixture
async def snapshot(dsn: str) -> AsyncIterator[None]:
    """Another session holding a snapshot open (a REPEATABLE READ transaction that has read)."""
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as holder:
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute("SELECT count(*) FROM mdm.aa_tenant")
        yield
        await holder.rollback()


async def _buffers(conn: Conn, params: dict[str, Any]) -> int:
    """Shared buffers the claim with `params` reads (EXPLAIN ANALYZE, rolled back)."""
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_JOBS.text,
                                 params)
        row = await cur.fetchone()
    assert row is not None
    plan = row["QUERY PLAN"]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


async def test_a_bounded_claim_does_not_step_over_the_jobs_claimed_under_a_held_snapshot(
        conn: Conn, snapshot: None) -> None:
    await prepare(conn)
    tenant = await add_tenant(conn, "a")
    ids = await _jobs(conn, tenant, 20_100)
    cur = await conn.execute(
        "UPDATE mdm.aa_job SET status = 'running', claimed_by = 'w', claimed_at = now()"
        " WHERE id <= %s RETURNING job_kind, tenant_id, priority, available_at, id",
        (ids[19_999],))
    claimed = await cur.fetchall()
    full = claim_parameters(kinds=[KIND], tenants=None, limit=10, worker_id="w", lease=30.0)
    bounded = claim_parameters(kinds=[KIND], tenants=None, limit=10, worker_id="w", lease=30.0,
                               bounds=_bounds(claimed))
    # the full claim visits the 20,000 claimed jobs' index entries and rows, which the held
    # snapshot keeps; the bounded one starts past them
    full_buffers, bounded_buffers = await _buffers(conn, full), await _buffers(conn, bounded)
    assert bounded_buffers * 3 < full_buffers, (bounded_buffers, full_buffers)
    cur = await conn.execute(CLAIM_JOBS.text, bounded)
    assert [row["id"] for row in await cur.fetchall()] == ids[20_000:20_010]


async def test_a_bounded_claim_leaves_a_job_behind_its_bound_to_the_next_full_claim(
        conn: Conn, store: QueueStore, always_bounded: None,
        caplog: pytest.LogCaptureFixture) -> None:
    tenant, other = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    ids = await _jobs(conn, tenant, 10)
    taken: list[dict[str, Any]] = []
    for _ in range(claim_bounds.SLOW_STREAK):  # slow full claims: from then on bounded
        taken += await store.claim(kinds=[KIND], tenants=None, limit=1)
    streak = claim_bounds.SLOW_STREAK
    assert [row["id"] for row in taken] == ids[:streak]
    assert "likely a snapshot held open" in caplog.text  # the worker's log says so
    # available before the jobs claimed (an enqueue whose transaction began before theirs),
    # and a pair this store has not claimed from
    behind = await _jobs(conn, tenant, 1, age=3600.0)
    elsewhere = await _jobs(conn, other, 1, age=3600.0)
    bounded = await store.claim(kinds=[KIND], tenants=None, limit=3)
    assert [row["id"] for row in bounded] == ids[streak:streak + 3]
    # a full claim (another worker's, or this one's next) takes them first: they are older
    pool_store = QueueStore(store.pool, worker_id="host/2/store", actor="w")
    async with pool_store:
        full = await pool_store.claim(kinds=[KIND], tenants=None, limit=2)
    assert {row["id"] for row in full} == {behind[0], elsewhere[0]}


async def test_a_worker_of_its_own_tenants_claims_bounded_from_their_pairs_alone(
        conn: Conn, store: QueueStore, always_bounded: None) -> None:
    a, b, c = [await add_tenant(conn, key) for key in "abc"]
    jobs_a, jobs_b, jobs_c = [await _jobs(conn, t, 4) for t in (a, b, c)]
    taken: list[int] = []
    for _ in range(claim_bounds.SLOW_STREAK):  # slow full claims: from then on bounded
        taken += [row["id"] for row in await store.claim(kinds=[KIND], tenants=[a, b], limit=2)]
    taken += [row["id"] for row in await store.claim(kinds=[KIND], tenants=[a, b], limit=8)]
    # every job of the worker's tenants once, none of the other tenant's
    assert sorted(taken) == sorted(jobs_a + jobs_b)
    assert not set(taken) & set(jobs_c)


@pytest.mark.parametrize("style", ["iso_8601", "sql_standard", "postgres_verbose"])
async def test_the_claim_reads_its_own_timing_whatever_the_databases_interval_style(
        conn: Conn, dsn: str, style: str) -> None:
    """The claim reports its time as a timestamp, never as an interval, whose text would
    follow the session's IntervalStyle."""
    await prepare(conn)
    database = conninfo_to_dict(dsn)["dbname"]
    await conn.execute(sql.SQL("ALTER DATABASE {} SET IntervalStyle = {}").format(
        sql.Identifier(database), sql.Literal(style)))
    tenant = await add_tenant(conn, "a")
    ids = await _jobs(conn, tenant, 3)
    pool = open_pool(dsn, size=2)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="host/1/store", actor="w") as store:
            claimed = await store.claim(kinds=[KIND], tenants=None, limit=3)
    finally:
        await pool.close()
    assert [row["id"] for row in claimed] == ids
