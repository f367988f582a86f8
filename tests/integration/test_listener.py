"""LISTEN/NOTIFY wake-ups, and the listener's recovery from a dead connection."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

import jobpool
from integration.helpers import job, prepare, scalar, worker

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _wait_for(conn: Conn, job_id: int, status: str, seconds: float = 10.0) -> bool:
    for _ in range(int(seconds / 0.1)):
        if (await job(conn, job_id))["status"] == status:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_notify_wakes_an_idle_worker_and_survives_a_dead_listener(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    w = worker(dsn, ("test_record",), until_empty=False, poll_interval=3600.0)
    task = asyncio.create_task(w.run())
    try:
        for _ in range(100):
            if w.listening:
                break
            await asyncio.sleep(0.05)
        first = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
        assert await _wait_for(conn, first, "done")  # no poll for an hour: NOTIFY woke it

        killed = await scalar(conn, "SELECT count(pg_terminate_backend(pid))"
                              " FROM pg_stat_activity WHERE datname = current_database()"
                              " AND (query ILIKE 'LISTEN%%' OR query = 'SELECT 1')")
        assert killed >= 1
        for _ in range(50):
            await asyncio.sleep(0.1)
            if not w.listening:
                break
        for _ in range(100):
            if w.listening:
                break
            await asyncio.sleep(0.1)
        assert w.listening
        second = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
        assert await _wait_for(conn, second, "done")
    finally:
        w.stop()
        await task
