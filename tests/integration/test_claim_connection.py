"""The worker's claim connection: its own settings, kept apart from the handlers' connections,
and replaced after it fails."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

import jobpool
from integration.helpers import prepare, scalar
from jobpool.db.connect import open_pool
from jobpool.db.failures import lost_connection
from jobpool.db.store import CLAIM_APPLICATION_NAME, Completion, QueueStore

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _claim_backends(conn: Conn) -> list[int]:
    cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                             " AND application_name = %s", (CLAIM_APPLICATION_NAME,))
    return [row["pid"] for row in await cur.fetchall()]


async def test_claims_and_batched_dones_run_on_one_connection_of_their_own(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The claim connection's settings (generic plans, no sequential scans) never reach the
    pooled connections a handler gets as `tx`; done and claim commit together."""
    await prepare(conn)
    ids = [r.id for r in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_record")] * 4)]
    pool = open_pool(dsn, size=1)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="host/1/c", actor="w") as store:
            first = await store.claim(kinds=["test_record"], tenants=None, limit=2)
            held, second, _ = await store.complete_and_claim(
                [Completion(row["id"], row["attempts"], None) for row in first],
                kinds=["test_record"], tenants=None, limit=2)
            assert held == {row["id"] for row in first}
            assert sorted(row["id"] for row in first + second) == sorted(ids)
            assert len(await _claim_backends(conn)) == 1
            async with pool.connection() as handler_tx:
                cur = await handler_tx.execute(
                    "SELECT current_setting('synchronous_commit') AS sync,"
                    " current_setting('plan_cache_mode') AS plans,"
                    " current_setting('enable_seqscan') AS seqscan")
                assert await cur.fetchone() == {"sync": "on", "plans": "auto", "seqscan": "on"}
        # leaving `async with` closed it (its backend exits a moment after the client left)
        for _ in range(100):
            if not await _claim_backends(conn):
                break
            await asyncio.sleep(0.1)
        assert await _claim_backends(conn) == []
    finally:
        await pool.close()
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'") == 2


@pytest.mark.parametrize("durability", ["on", "off"])
async def test_the_claim_connection_commits_with_the_databases_durability(
    conn: Conn, dsn: str, tenant: uuid.UUID, durability: str
) -> None:
    """The claim and the batched `done`s commit with the `synchronous_commit` of the server,
    the database or the role (a DBA's choice, docs/writing-kinds.md "Durability"): jobpool
    sets none of its own, neither `off` under a server at `on` nor the reverse."""
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")])
    database = await scalar(conn, "SELECT current_database()")
    await conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
        sql.Identifier(database), sql.Literal(durability)))
    await conn.commit()
    pool = open_pool(dsn, size=1)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="host/1/c", actor="w") as store:
            assert len(await store.claim(kinds=["test_record"], tenants=None, limit=1)) == 1
            claimer = await store._claim_connection()
            cur = await claimer.execute("SELECT current_setting('synchronous_commit') AS sync")
            assert await cur.fetchone() == {"sync": durability}
            await claimer.rollback()
    finally:
        await pool.close()


async def test_a_claim_connection_that_failed_is_replaced_by_the_next_claim(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """A claim on a connection the server ended raises a lost-connection error (the worker
    then pauses claiming and sends its `done`s again); the next claim opens a fresh one."""
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 2)
    pool = open_pool(dsn, size=1)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="host/1/c", actor="w") as store:
            assert len(await store.claim(kinds=["test_record"], tenants=None, limit=1)) == 1
            [ended] = await _claim_backends(conn)
            # with a timeout, pg_terminate_backend returns once the backend has ended
            await conn.execute("SELECT pg_terminate_backend(%s, 5000)", (ended,))
            with pytest.raises(psycopg.OperationalError) as failed:
                await store.claim(kinds=["test_record"], tenants=None, limit=1)
            assert lost_connection(failed.value)
            assert len(await store.claim(kinds=["test_record"], tenants=None, limit=1)) == 1
            assert (await _claim_backends(conn)) not in ([], [ended])
    finally:
        await pool.close()
