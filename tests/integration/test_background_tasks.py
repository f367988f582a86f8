"""A worker's background tasks never die silently: a task that raises is restarted and shows
in /readyz until it works again; a limit changed meanwhile still applies."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import psycopg
from psycopg_pool import AsyncConnectionPool

import jobpool
from integration.helpers import prepare, scalar
from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.health import HealthServer
from jobpool.worker.runtime import Worker
from jobpool.worker.token_store import TokenStore

Conn = psycopg.AsyncConnection[dict[str, Any]]

DEADLINE = 60.0


class BreakableLimiter(TokenStore):
    """Rate limits whose reload raises an unexpected exception while `broken` is set."""

    def __init__(self) -> None:
        super().__init__(refresh_every=0.2)
        self.broken = False

    async def refresh(self, pool: AsyncConnectionPool[Any]) -> None:
        if self.broken:
            raise RuntimeError("injected fault")
        await super().refresh(pool)


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{port}/readyz") as response:
        return response.status, json.loads(await response.text())


async def eventually(check: Any, what: str) -> None:
    for _ in range(int(DEADLINE / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {DEADLINE:.0f}s: {what}")


async def test_a_limits_refresh_that_raises_is_restarted_and_shown_in_readyz(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    limiter = BreakableLimiter()
    w = Worker(dsn, load_kind_modules(), WorkerConfig(kinds=("test_record",), poll_interval=0.5),
               actor="test", limiter=limiter)
    server = HealthServer(w, w.metrics)
    port = await server.start(port=0, host="127.0.0.1")
    task = asyncio.create_task(w.run())
    try:
        await eventually(lambda: _is(readyz(port), 200), "ready")
        limiter.broken = True

        async def failing() -> bool:
            status, body = await readyz(port)
            return status == 503 and body["problems"] == [
                "background task rate-limits failing: RuntimeError: injected fault"]

        await eventually(failing, "/readyz names the failing task")
        await conn.execute("UPDATE mdm.aa_tenant SET metadata = %s::jsonb WHERE id = %s",
                           (json.dumps({"rate_limit": {"test_record": {"rps": 3}}}), tenant))
        limiter.broken = False

        async def applied() -> bool:
            limits = limiter.tenants.get(str(tenant))
            return limits is not None and limits.for_kind("test_record") is not None

        await eventually(applied, "the limit changed while the task failed applies")
        await eventually(lambda: _is(readyz(port), 200), "ready again")
        job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        await eventually(lambda: _done(conn, job.id), "jobs still run")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
        await server.stop()


async def test_a_worker_starts_although_a_tenants_limits_cannot_be_read(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """1e400 is valid jsonb; Python reads it as a 401-digit integer that no float holds."""
    await prepare(conn)
    await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES ('odd',"
                       " '{\"rate_limit\": {\"k\": {\"rps\": 1e400}}}')")
    limiter = TokenStore(refresh_every=0.2)
    w = Worker(dsn, load_kind_modules(), WorkerConfig(kinds=("test_record",), poll_interval=0.5),
               actor="test", limiter=limiter)
    task = asyncio.create_task(w.run())
    try:
        job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        await eventually(lambda: _done(conn, job.id), "the worker runs jobs")
        await conn.execute("UPDATE mdm.aa_tenant SET metadata = %s::jsonb WHERE key = 'odd'",
                           (json.dumps({"rate_limit": {"k": {"rps": 2}}}),))

        async def applied() -> bool:
            return any(limits.for_kind("k") for limits in limiter.tenants.values())

        await eventually(applied, "the corrected limit applies")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)


async def _is(answer: Any, status: int) -> bool:
    return bool((await answer)[0] == status)


async def _done(conn: Conn, job_id: int) -> bool:
    return bool(await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                             (job_id,)) == "done")
