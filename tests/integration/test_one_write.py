"""A transaction written to the server in one write: the claim round (`done`s and claim)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from recording_proxy import SYNC, recording_proxy

import jobpool
from integration.helpers import prepare, scalar
from jobpool.db.connect import open_pool
from jobpool.db.one_write import one_write_transaction
from jobpool.db.store import Completion, QueueStore

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def test_a_claim_round_reaches_the_server_in_one_write(
    conn: Conn, dsn: str, tenant: uuid.UUID,
) -> None:
    """BEGIN, the batched `done`, the claim, COMMIT and the Sync go out in one write: the
    transaction is never open on the server waiting for the worker, which runs jobs
    meanwhile (psycopg's own pipeline waits for the BEGIN's answer first)."""
    await prepare(conn)
    for _ in range(3):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    async with recording_proxy(dsn) as (proxied, chunks):
        pool = open_pool(proxied, size=1)
        await pool.open()
        store = QueueStore(pool, worker_id="h/1/one-write", actor="test")
        try:
            [first] = await store.claim(kinds=["test_record"], tenants=None, limit=1)
            before = len(chunks)
            held, claimed, _ = await store.complete_and_claim(
                [Completion(first["id"], first["attempts"], None)], kinds=["test_record"],
                tenants=None, limit=2)
            sent = chunks[before:]
        finally:
            await store.close()
            await pool.close()
    assert len(sent) == 1, sent
    assert sent[0].startswith(b"P") and b"BEGIN" in sent[0] and b"COMMIT" in sent[0], sent
    assert sent[0].endswith(SYNC), sent
    assert held == {first["id"]} and len(claimed) == 2
    assert await scalar(conn, "SELECT status FROM mdm.aa_job WHERE id = %s",
                        (first["id"],)) == "done"


@pytest.fixture
async def autocommit(dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                 row_factory=dict_row) as own:
        await own.execute("CREATE TEMP TABLE written (n int)")
        yield own


async def test_the_statements_run_in_one_transaction_each_with_its_rows(autocommit: Conn) -> None:
    first, second = await one_write_transaction(autocommit, [
        ("INSERT INTO written VALUES (%s) RETURNING pg_current_xact_id()::text AS xact", (1,)),
        ("SELECT pg_current_xact_id()::text AS xact, count(*) AS n FROM written", None),
    ])
    [inserted] = await first.fetchall()
    [counted] = await second.fetchall()
    assert inserted["xact"] == counted["xact"] and counted["n"] == 1
    assert autocommit.info.transaction_status == TransactionStatus.IDLE  # committed


async def test_a_failing_statement_commits_nothing_and_is_raised(autocommit: Conn) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        await one_write_transaction(autocommit, [
            ("INSERT INTO written VALUES (%s)", (1,)), ("SELECT 1 / %s::int", (0,))])
    assert autocommit.info.transaction_status == TransactionStatus.INERROR  # the caller's to end
    await autocommit.rollback()
    assert await (await autocommit.execute("SELECT count(*) AS n FROM written")).fetchone() == {
        "n": 0}


async def test_a_parameter_that_cannot_be_sent_rolls_back_what_was_queued_before_it(
    autocommit: Conn,
) -> None:
    """The BEGIN and the statements before it are written all the same: a ROLLBACK takes
    the COMMIT's place, and the connection is idle, out of pipeline mode."""
    with pytest.raises(psycopg.ProgrammingError, match="cannot adapt"):
        await one_write_transaction(autocommit, [
            ("INSERT INTO written VALUES (%s)", (1,)), ("SELECT %s", (object(),))])
    assert autocommit.pgconn.pipeline_status == 0
    assert autocommit.info.transaction_status == TransactionStatus.IDLE
    assert await (await autocommit.execute("SELECT count(*) AS n FROM written")).fetchone() == {
        "n": 0}


async def test_a_connection_outside_autocommit_is_refused(dsn: str) -> None:
    """Its own BEGIN would wait for an answer before the statements go out."""
    async with await psycopg.AsyncConnection.connect(dsn) as plain:
        with pytest.raises(psycopg.ProgrammingError, match="autocommit"):
            await one_write_transaction(plain, [("SELECT 1", None)])
