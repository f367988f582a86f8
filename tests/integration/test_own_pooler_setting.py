"""Each connection follows the `pooler` setting of whoever opens it (a worker's
`WorkerConfig`, `jobpool.testing`'s settings, the API's, a command's), never the process's:
behind a transaction pooler nothing is prepared on the server (`prepare_threshold` None),
also when the process itself says `JOBPOOL_POOLER=none`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from ports import free_port

import jobpool
from jobpool import settings, testing
from jobpool.api.database import DatabaseLink
from jobpool.db.connect import open_database, open_pool, open_side_connection
from jobpool.job import Job
from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.health import start_worker_health
from jobpool.worker.maintenance import run_due_steps
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]


@jobpool.kind("pooler_probe", max_attempts=1)
async def pooler_probe(job: Job, tx: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """Return the `prepare_threshold` of the job's connection and of a side connection."""
    async with await open_side_connection(tx, application_name="pooler probe") as side:
        return {"tx": tx.prepare_threshold, "side": side.prepare_threshold}


@pytest.fixture(autouse=True)
def process_says_direct() -> Iterator[settings.Settings]:
    """The process's settings say `pooler=none`; the tests give their own `transaction`."""
    previous = settings.current()
    settings.configure(replace(previous, pooler="none"))
    yield replace(previous, pooler="transaction")
    settings.configure(previous)


async def test_a_worker_run_by_jobpool_testing_follows_the_settings_it_is_given(
    dsn: str, tenant: uuid.UUID, process_says_direct: settings.Settings
) -> None:
    behind = await testing.run_job(dsn, "pooler_probe", tenant=tenant,
                                   settings=process_says_direct)
    direct = await testing.run_job(dsn, "pooler_probe", tenant=tenant,
                                   settings=replace(process_says_direct, pooler="none"))
    assert behind.result == {"tx": None, "side": None}
    assert direct.result == {"tx": 5, "side": 5}


async def test_a_workers_gauges_follow_its_own_pooler_setting(dsn: str, conn: Conn) -> None:
    worker = Worker(dsn, load_kind_modules(), WorkerConfig(kinds=("pooler_probe",),
                                                           pooler="transaction"),
                    actor="test")
    health = await start_worker_health(worker, dsn, free_port(),
                                       transaction_pooler=worker.transaction_pooler)
    assert health is not None
    try:
        gauges = worker.metrics.gauges
        assert gauges is not None
        await gauges.refresh()
        assert gauges.conn is not None and gauges.conn.prepare_threshold is None
    finally:
        await health.stop()


async def test_the_maintenance_connection_follows_the_workers_setting(dsn: str) -> None:
    seen: list[int | None] = []

    async def step(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        seen.append(conn.prepare_threshold)
        return {}

    await run_due_steps(dsn, [("probe", step)], transaction_pooler=True)
    await run_due_steps(dsn, [("probe", step)], transaction_pooler=False)
    assert seen == [None, 5]


async def test_the_apis_connections_follow_its_own_pooler_setting(dsn: str) -> None:
    link = DatabaseLink(dsn, size=1, name="test-api", transaction_pooler=True)
    link.start()
    try:
        for _ in range(100):
            if not link.not_ready():
                break
            await asyncio.sleep(0.1)
        async with link.connection() as conn:
            assert conn.prepare_threshold is None
    finally:
        await link.close()
    pool = open_pool(dsn, size=1, transaction_pooler=True)
    assert DatabaseLink.serving(pool).transaction_pooler is True
    assert DatabaseLink.serving(open_pool(dsn, size=1)).transaction_pooler is False


async def test_a_commands_connection_follows_its_settings(
    dsn: str, process_says_direct: settings.Settings
) -> None:
    async with await open_database(replace(process_says_direct, dsn=dsn)) as conn:
        assert conn.prepare_threshold is None
    async with await open_database(replace(process_says_direct, dsn=dsn,
                                           pooler="none")) as conn:
        assert conn.prepare_threshold == 5
