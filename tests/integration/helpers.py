"""Shared helpers of the integration tests: run a worker in-process, read rows."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import kinds_for_tests
import psycopg
from psycopg.conninfo import make_conninfo

from jobpool.db.store import register_kinds
from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker


async def prepare(conn: psycopg.AsyncConnection[Any]) -> None:
    """Create the side table and register every kind (built-in and test kinds)."""
    await conn.execute(kinds_for_tests.TEST_RUNS_DDL)
    await register_kinds(conn, load_kind_modules().specs())


def worker(dsn: str, kinds: tuple[str, ...], **config: Any) -> Worker:
    config.setdefault("until_empty", True)
    config.setdefault("poll_interval", 0.2)
    return Worker(dsn, load_kind_modules(), WorkerConfig(kinds=kinds, **config),
                  actor="test-worker")


async def run_until_empty(dsn: str, *kinds: str, **config: Any) -> Worker:
    w = worker(dsn, kinds, **config)
    await w.run()
    return w


async def job(conn: psycopg.AsyncConnection[Any], job_id: int) -> dict[str, Any]:
    cur = await conn.execute("SELECT *, status::text AS status FROM mdm.aa_job WHERE id = %s",
                             (job_id,))
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def add_tenant(conn: psycopg.AsyncConnection[Any], key: str) -> uuid.UUID:
    """Insert tenant `key`; return its id."""
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES (%s) RETURNING id", (key,))
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"] if isinstance(row, dict) else row[0]))


async def scalar(conn: psycopg.AsyncConnection[Any], query: Any, params: Any = None) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return next(iter(row.values()))


async def wait_until(check: Callable[[], Awaitable[bool] | bool], what: str,
                     deadline: float) -> None:
    """Poll `check` (sync or async) every 0.1 s until it is true; AssertionError naming `what`
    after `deadline` seconds."""
    for _ in range(int(deadline / 0.1)):
        answer = check()
        if await answer if inspect.isawaitable(answer) else answer:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {deadline:.0f}s: {what}")


def role_dsn(dsn: str, role: str) -> str:
    """`dsn` as role `role`."""
    return make_conninfo(dsn, user=role)
