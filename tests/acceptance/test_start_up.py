"""`jobpool run` started before its database is there waits for it, serving its probes
(alive, not ready), instead of exiting (a crash loop on Kubernetes)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import aiohttp
import jwt
import psycopg
from integration.helpers import prepare, scalar
from ports import free_port
from private_postgres import PrivateServer
from psycopg.rows import dict_row

import jobpool
from acceptance.cli import jobpool as run_cli
from acceptance.cli import start, worker_args

DEADLINE = 60.0


async def probe(port: int, path: str) -> tuple[int, str]:
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{port}{path}") as response:
            return response.status, await response.text()
    except aiohttp.ClientConnectionError:
        return 0, ""


async def wait_for_probe(port: int, path: str, status: int, text: str = "") -> None:
    for _ in range(int(DEADLINE / 0.1)):
        got, body = await probe(port, path)
        if got == status and text in body:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} never answered {status} with {text!r}; last: {got} {body}")


async def stop(worker: subprocess.Popen[str]) -> str:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(worker.communicate, timeout=DEADLINE)
    return err


async def test_run_waits_for_a_database_that_is_down_at_start(
    private_server: PrivateServer,
) -> None:
    await asyncio.to_thread(private_server.stop)
    port = free_port()
    worker = start(private_server.dsn(), *worker_args("test_record", metrics_port=port))
    try:
        await wait_for_probe(port, "/readyz", 503, "database unreachable")
        assert (await probe(port, "/healthz"))[0] == 200
        assert worker.poll() is None

        await asyncio.to_thread(private_server.start)
        async with await psycopg.AsyncConnection.connect(
            private_server.dsn(), autocommit=True, row_factory=dict_row
        ) as conn:
            await prepare(conn)
            tenant = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('acme')"
                                  " RETURNING id")
            job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
            await wait_for_probe(port, "/readyz", 200)
            for _ in range(int(DEADLINE / 0.1)):
                if await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                                (job.id,)) == "done":
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the job never ran")
    finally:
        err = await stop(worker)
    assert worker.returncode == 0, err


async def test_run_waits_for_the_schema_to_be_migrated(empty_dsn: str) -> None:
    port = free_port()
    worker = start(empty_dsn, *worker_args("test_record", metrics_port=port))
    try:
        await wait_for_probe(port, "/readyz", 503, "run `jobpool migrate`")
        assert worker.poll() is None
        run_cli(empty_dsn, "migrate")
        await wait_for_probe(port, "/readyz", 200)
    finally:
        err = await stop(worker)
    assert worker.returncode == 0, err


API_SECRET = "s3cret-s3cret-s3cret-s3cret-s3cret!"
API_AUDIENCE = "jobpool-admin"


async def dlq_page(port: int) -> tuple[int, str]:
    bearer = jwt.encode({"sub": "oncall", "aud": API_AUDIENCE, "exp": int(time.time()) + 600,
                         "permissions": ["manage_metadata"], "tenants": "*"}, API_SECRET)
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{port}/v1/dlq", headers={"Authorization": f"Bearer {bearer}"}
    ) as response:
        return response.status, await response.text()


async def test_api_waits_for_its_database_at_start_and_after_an_outage(
    private_server: PrivateServer,
) -> None:
    """`jobpool api` serves while its database is away (/healthz 200, /readyz and /v1 503
    naming why) and serves the database as soon as it is back, at start and later."""
    await asyncio.to_thread(private_server.stop)
    port = free_port()
    api = start(private_server.dsn(), "api", "--port", str(port), "--log-level", "warning",
                JOBPOOL_API_JWT_SECRET=API_SECRET, JOBPOOL_API_JWT_AUDIENCE=API_AUDIENCE)
    try:
        for _ in range(2):  # down at start, then down again while serving
            await wait_for_probe(port, "/readyz", 503, "database unreachable")
            assert (await probe(port, "/healthz"))[0] == 200
            status, body = await dlq_page(port)
            assert status == 503 and "database unreachable" in body, body
            assert api.poll() is None

            await asyncio.to_thread(private_server.start)
            await wait_for_probe(port, "/readyz", 200, '"ready"')
            status, body = await dlq_page(port)
            assert (status, json.loads(body)["items"]) == (200, []), body
            await asyncio.to_thread(private_server.stop)
    finally:
        err = await stop(api)
    assert api.returncode == 0, err
    assert "database connection lost" in err or "trying again" in err, err
