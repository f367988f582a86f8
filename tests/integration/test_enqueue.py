"""Enqueue in the caller's transaction: idempotency, batches, clear errors."""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import jobpool
from integration.helpers import job, prepare, scalar

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _connect(dsn: str, autocommit: bool = True) -> Conn:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, row_factory=dict_row)


async def test_job_exists_only_if_the_callers_transaction_commits(conn: Conn, dsn: str,
                                                                 tenant: uuid.UUID) -> None:
    await prepare(conn)
    async with await _connect(dsn, autocommit=False) as caller:
        rolled_back = await jobpool.enqueue(caller, tenant_id=tenant, kind="test_record")
        await caller.rollback()
        committed = await jobpool.enqueue(caller, tenant_id=tenant, kind="test_record")
        await caller.commit()
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE id = %s",
                        (rolled_back.id,)) == 0
    assert (await job(conn, committed.id))["status"] == "pending"


async def test_kind_defaults_fill_priority_and_attempts(conn: Conn, tenant: uuid.UUID) -> None:
    await prepare(conn)
    plain = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    custom = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", priority=5,
                                   max_attempts=9)
    plain_row, custom_row = await job(conn, plain.id), await job(conn, custom.id)
    assert (plain_row["max_attempts"], plain_row["priority"]) == (3, 100)
    assert (custom_row["max_attempts"], custom_row["priority"]) == (9, 5)


async def test_five_concurrent_enqueues_with_one_key_while_the_job_runs(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    first = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record",
                                  idempotency_key="order-42")
    await conn.execute("UPDATE mdm.aa_job SET status = 'running', claimed_by = 'h/1/x',"
                       " claimed_at = now(), attempts = 1 WHERE id = %s", (first.id,))

    async def again() -> jobpool.Enqueued:
        async with await _connect(dsn) as other:
            return await jobpool.enqueue(other, tenant_id=tenant, kind="test_record",
                                         idempotency_key="order-42")

    results = await asyncio.gather(*(again() for _ in range(5)))
    assert [r.id for r in results] == [first.id] * 5
    assert not any(r.created for r in results)
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 1


@pytest.mark.parametrize("first_commits", [True, False])
async def test_idempotency_key_under_a_concurrent_uncommitted_insert(
    conn: Conn, dsn: str, tenant: uuid.UUID, first_commits: bool
) -> None:
    await prepare(conn)
    async with await _connect(dsn, autocommit=False) as first, await _connect(dsn) as second:
        mine = await jobpool.enqueue(first, tenant_id=tenant, kind="test_record",
                                     idempotency_key="k")
        waiting = asyncio.create_task(jobpool.enqueue(second, tenant_id=tenant,
                                                      kind="test_record", idempotency_key="k"))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # blocked on the first inserter's row
        await (first.commit() if first_commits else first.rollback())
        theirs = await waiting
    if first_commits:
        assert theirs == jobpool.Enqueued(mine.id, False)
    else:
        assert theirs.created and theirs.id != mine.id
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 1


async def test_batch_enqueue_keeps_order_and_resolves_duplicate_keys(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    existing = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record",
                                     idempotency_key="a")
    jobs = [
        jobpool.NewJob(tenant, "test_record", {"n": 1}),
        jobpool.NewJob(tenant, "test_record", {"n": 2}, idempotency_key="a"),
        jobpool.NewJob(tenant, "test_record", {"n": 3}, idempotency_key="b"),
        jobpool.NewJob(tenant, "test_record", {"n": 4}, idempotency_key="b"),
        jobpool.NewJob(tenant, "test_record", {"n": 5}),
    ]
    results = await jobpool.enqueue_many(conn, jobs)
    assert [r.created for r in results] == [True, False, True, False, True]
    assert results[1].id == existing.id
    assert results[2].id == results[3].id
    payloads = [(await job(conn, r.id))["payload"] for r in results]
    assert payloads == [{"n": 1}, {}, {"n": 3}, {"n": 3}, {"n": 5}]


async def test_sync_enqueue(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    with psycopg.connect(dsn) as sync_conn:
        result = jobpool.enqueue_sync(sync_conn, tenant_id=tenant, kind="test_record",
                                      payload={"x": 1}, idempotency_key="s")
        again = jobpool.enqueue_sync(sync_conn, tenant_id=tenant, kind="test_record",
                                     idempotency_key="s")
    assert result.created and again == jobpool.Enqueued(result.id, False)


async def test_enqueue_notifies_at_commit(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    async with await _connect(dsn) as listener:
        await listener.execute("LISTEN jobpool")
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        notes = [n.payload async for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert notes == ["test_record"]


async def test_unknown_kind_is_a_clear_error(conn: Conn, tenant: uuid.UUID) -> None:
    await prepare(conn)
    with pytest.raises(jobpool.UnknownKindError, match="'no_such_kind'"):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="no_such_kind")
    with pytest.raises(jobpool.UnknownKindError, match=re.escape("Robert'); DROP")):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="Robert'); DROP TABLE mdm.aa_job;--")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


async def test_unknown_tenant_is_a_clear_error(conn: Conn) -> None:
    await prepare(conn)
    ghost = uuid.uuid4()
    with pytest.raises(jobpool.UnknownTenantError, match=str(ghost)):
        await jobpool.enqueue(conn, tenant_id=ghost, kind="test_record")
    with pytest.raises(ValueError, match="tenant_id must be a UUID"):
        await jobpool.enqueue(conn, tenant_id="acme", kind="test_record")


@pytest.mark.parametrize(
    ("payload", "message"),
    [({"text": "a\x00b"}, "NUL"), ({"when": object()}, "not valid JSON"),
     ({"ratio": float("nan")}, "not valid JSON"), ({"big": float("inf")}, "not valid JSON"),
     ([1, 2], "must be a JSON object"), ("text", "must be a JSON object")],
)
async def test_bad_payloads_are_refused_before_any_write(
    conn: Conn, tenant: uuid.UUID, payload: Any, message: str
) -> None:
    await prepare(conn)
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", payload=payload)
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


async def test_a_nul_in_an_idempotency_key_is_refused_before_any_write(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    with pytest.raises(ValueError, match="idempotency key contains a NUL"):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", idempotency_key="a\x00b")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0
