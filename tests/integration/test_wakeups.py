"""Jobs that become runnable again wake idle workers at commit, as a new job does."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

import jobpool
from integration.helpers import prepare
from jobpool import admin
from jobpool.db.connect import open_pool
from jobpool.db.queries import Exec
from jobpool.db.store import QueueStore
from jobpool.worker.maintenance import recover_stale_claims

LISTEN_FOR_JOBS = Exec("listen_for_jobs")

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _listener(dsn: str) -> psycopg.AsyncConnection[Any]:
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await LISTEN_FOR_JOBS(listener)
    return listener


async def _wake_ups(listener: psycopg.AsyncConnection[Any]) -> list[str]:
    return [note.payload async for note in listener.notifies(timeout=1.0)]


async def _claim_by(conn: Conn, job_id: int, worker: str, age: str = "0 seconds") -> None:
    await conn.execute(
        "UPDATE mdm.aa_job SET status = 'running', claimed_by = %s, attempts = 1,"
        " claimed_at = now() - %s::interval, heartbeat_at = now() - %s::interval WHERE id = %s",
        (worker, age, age, job_id))


async def test_recovered_stale_claims_wake_workers(conn: Conn, dsn: str,
                                                   tenant: uuid.UUID) -> None:
    await prepare(conn)
    stale = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    await _claim_by(conn, stale, "h/1/dead", age="1 hour")
    async with await _listener(dsn) as listener:
        await recover_stale_claims(conn, actor="cleanup")
        assert await _wake_ups(listener) == ["test_record"]


async def test_a_replayed_dlq_job_wakes_workers(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    dead = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    await conn.execute("UPDATE mdm.aa_job SET status = 'dlq', completed_at = now()"
                       " WHERE id = %s", (dead,))
    async with await _listener(dsn) as listener:
        await admin.replay(conn, dead, actor="on-call")
        assert await _wake_ups(listener) == ["test_record"]


async def test_claims_released_unrun_wake_workers(conn: Conn, dsn: str,
                                                  tenant: uuid.UUID) -> None:
    await prepare(conn)
    held, running = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
                     for _ in range(2)]
    await _claim_by(conn, held, "h/1/me")
    await _claim_by(conn, running, "h/1/me")
    pool = open_pool(dsn, size=1)
    await pool.open()
    try:
        async with await _listener(dsn) as listener:
            store = QueueStore(pool, worker_id="h/1/me", actor="worker")
            released = await store.release_unrun_claims([running])
            assert [row["id"] for row in released] == [held]
            assert await _wake_ups(listener) == ["test_record"]
    finally:
        await pool.close()
