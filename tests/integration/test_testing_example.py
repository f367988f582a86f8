"""Tests of the invoice kinds on a real PostgreSQL (pytest-asyncio, asyncio_mode = "auto")."""

import os
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import jobpool
from jobpool import testing
from jobpool.db.migrate import migrate

SERVER = os.environ.get("JOBPOOL_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@jobpool.kind("invoice_total", max_attempts=3)
async def invoice_total(job: jobpool.Job, tx: psycopg.AsyncConnection) -> dict:
    lines = job.payload.get("lines")
    if not lines:
        raise jobpool.PermanentError("payload.lines is empty")
    await jobpool.enqueue(tx, tenant_id=job.tenant_id, kind="invoice_mail",
                          payload={"total": sum(lines)})
    return {"total": sum(lines)}


@jobpool.kind("invoice_mail")
async def invoice_mail(job: jobpool.Job, tx: psycopg.AsyncConnection) -> None:
    pass  # send the mail


@pytest.fixture
async def dsn():
    """A fresh database with the jobpool schema, the kinds above and the tenant `acme`."""
    name = f"test_{uuid.uuid4().hex}"
    async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as server:
        await server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        dsn = make_conninfo(SERVER, dbname=name)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await migrate(conn)
            await testing.register_kinds(conn)
            await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme')")
        yield dsn
        await server.execute(
            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


async def test_an_invoice_total_is_mailed(dsn):
    run = await testing.run_job(dsn, "invoice_total", {"lines": [5, 7]}, tenant="acme")
    assert (run.status, run.result) == ("done", {"total": 12})
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        [mail] = await testing.enqueued(conn, kind="invoice_mail", status="pending")
    assert mail.payload == {"total": 12}
    assert await testing.drain(dsn) == {"done": 1}


async def test_an_empty_invoice_goes_to_the_dlq(dsn):
    run = await testing.run_job(dsn, "invoice_total", {"lines": []}, tenant="acme")
    assert (run.status, run.attempts) == ("dlq", 1)
    assert run.last_error == "PermanentError: payload.lines is empty"
