"""A worker (a lane) serving tenants that do not exist yet waits for them, never exits."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import jobpool
from integration.helpers import prepare, scalar, worker

Conn = psycopg.AsyncConnection[dict[str, Any]]

DEADLINE = 60.0


async def test_a_lane_serves_its_tenant_once_it_is_created(conn: Conn, dsn: str) -> None:
    await prepare(conn)
    existing = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('early') RETURNING id")
    w = worker(dsn, ("test_record",), tenants=("early", "latecomer"), until_empty=False,
               poll_interval=0.5)
    task = asyncio.create_task(w.run())
    try:
        early = (await jobpool.enqueue(conn, tenant_id=existing, kind="test_record")).id
        for _ in range(int(DEADLINE / 0.1)):
            if await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'"):
                break
            assert not task.done(), task
            await asyncio.sleep(0.1)
        assert await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                            (early,)) == "done"
        assert w.not_ready() == []  # waiting for a tenant is what the lane should do

        latecomer = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('latecomer')"
                                 " RETURNING id")
        late = (await jobpool.enqueue(conn, tenant_id=latecomer, kind="test_record")).id
        for _ in range(int(DEADLINE / 0.1)):
            if await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                            (late,)) == "done":
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the latecomer's job never ran")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
