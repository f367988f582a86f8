"""Enqueue in the caller's transaction: idempotency, batches, clear errors."""

from __future__ import annotations

import asyncio
import enum
import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql
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


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("kind", ["no_such_kind", "Robert'); DROP"])
async def test_an_unknown_kind_in_a_batch_names_the_first_job_that_has_it(
    conn: Conn, tenant: uuid.UUID, kind: str, keyed: bool
) -> None:
    """A kind the database lacks (refused by its foreign key) or no kind can have (refused
    before anything is sent): the error begins with the job's place, as for a bad field."""
    await prepare(conn)
    key = "k" if keyed else None
    good = jobpool.NewJob(tenant, "test_record", {})
    jobs = [good, jobpool.NewJob(tenant, kind, {}, idempotency_key=key),
            jobpool.NewJob(tenant, kind, {})]
    with pytest.raises(jobpool.UnknownKindError) as refused:
        await jobpool.enqueue_many(conn, jobs)
    assert str(refused.value).startswith(f"job 2 of 3 in the batch: unknown job kind {kind!r}")
    await conn.rollback()
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


async def test_an_unknown_tenant_in_a_batch_names_the_first_job_that_has_it(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    ghost = uuid.uuid4()
    jobs = [jobpool.NewJob(tenant, "test_record", {}), jobpool.NewJob(ghost, "test_record", {})]
    with pytest.raises(jobpool.UnknownTenantError) as refused:
        await jobpool.enqueue_many(conn, jobs)
    assert str(refused.value).startswith(f"job 2 of 2 in the batch: unknown tenant '{ghost}'")


async def test_unknown_tenant_is_a_clear_error(conn: Conn) -> None:
    await prepare(conn)
    ghost = uuid.uuid4()
    with pytest.raises(jobpool.UnknownTenantError, match=str(ghost)):
        await jobpool.enqueue(conn, tenant_id=ghost, kind="test_record")
    with pytest.raises(ValueError, match="tenant_id must be a UUID"):
        await jobpool.enqueue(conn, tenant_id="acme", kind="test_record")


def nested(levels: int) -> dict[str, Any]:
    """A payload whose objects nest `levels` deep, built without recursion."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


BAD_PAYLOADS = [
    ({"text": "a\x00b"}, r"payload\.text contains a NUL character"),
    ({"n": "x\ud800"}, r"payload\.n contains a lone surrogate \(U\+D800\)"),
    ({"ok": ["fine", {"k\x00": 1}]}, r"payload\.ok\[1\] has a key that contains a NUL"),
    ({"when": object()}, r"payload\.when is of type object, which is not JSON"),
    ({"ratio": float("nan")}, r"payload\.ratio is nan, which JSON cannot hold"),
    ({"big": float("inf")}, r"payload\.big is inf, which JSON cannot hold"),
    (nested(101), r"payload is nested more than 100 levels deep"),
    (nested(3000), r"payload is nested more than 100 levels deep"),
    ([1, 2], "must be a JSON object, got array"),
    ("text", "must be a JSON object, got string"),
]


@pytest.mark.parametrize(("payload", "message"), BAD_PAYLOADS)
async def test_bad_payloads_are_refused_before_any_write(
    conn: Conn, dsn: str, tenant: uuid.UUID, payload: Any, message: str
) -> None:
    """Async and sync, one job and a batch: a ValueError naming the problem, nothing written."""
    await prepare(conn)
    good = jobpool.NewJob(tenant, "test_record", {"n": 1})
    bad = jobpool.NewJob(tenant, "test_record", payload)
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", payload=payload)
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue_many(conn, [good, bad])
    with psycopg.connect(dsn) as sync:
        with pytest.raises(ValueError, match=message):
            jobpool.enqueue_sync(sync, tenant_id=tenant, kind="test_record", payload=payload)
        with pytest.raises(ValueError, match=message):
            jobpool.enqueue_many_sync(sync, [good, bad])
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


async def test_a_batch_error_names_the_job_at_fault(conn: Conn, tenant: uuid.UUID) -> None:
    await prepare(conn)
    jobs = [jobpool.NewJob(tenant, "test_record", {"n": n}) for n in range(3)]
    jobs.append(jobpool.NewJob(tenant, "test_record", {"n": "x\udfff"}))
    with pytest.raises(ValueError,
                       match=r"job 4 of 4 in the batch: payload of a job of kind "
                             r"test_record is refused: payload\.n"):
        await jobpool.enqueue_many(conn, jobs)


async def test_payloads_up_to_the_depth_limit_and_lookalike_text_are_accepted(
    conn: Conn, tenant: uuid.UUID
) -> None:
    """The limit is 100 levels; brackets and escapes inside strings are only text."""
    await prepare(conn)
    payloads = [nested(100), {"text": "\\u0000 is not a NUL", "brackets": "[[[{{{" * 40},
                {"emoji": "\U0001f600", "accent": "é"}]
    jobs = [jobpool.NewJob(tenant, "test_record", p) for p in payloads]
    for enqueued, payload in zip(await jobpool.enqueue_many(conn, jobs * 20), payloads * 20,
                                 strict=True):
        assert (await job(conn, enqueued.id))["payload"] == payload


NAIVE = datetime(2030, 1, 1, 12, 0)


async def test_naive_available_at_is_refused_everywhere(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """A naive datetime would be read in each session's TimeZone: hours early or late."""
    await prepare(conn)
    message = r"available_at is a naive datetime \(2030-01-01T12:00:00\): give it a time zone"
    naive_job = jobpool.NewJob(tenant, "test_record", available_at=NAIVE)
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", available_at=NAIVE)
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue_many(conn, [naive_job])
    with psycopg.connect(dsn) as sync:
        with pytest.raises(ValueError, match=message):
            jobpool.enqueue_sync(sync, tenant_id=tenant, kind="test_record", available_at=NAIVE)
        with pytest.raises(ValueError, match=message):
            jobpool.enqueue_many_sync(sync, [naive_job])
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


@pytest.mark.parametrize("moment", [
    datetime.max.replace(tzinfo=timezone(timedelta(hours=-14))),  # year 10000 in UTC
    datetime.min.replace(tzinfo=timezone(timedelta(hours=14))),   # year 0 in UTC
    datetime(9999, 12, 31, tzinfo=UTC),
])
async def test_an_available_at_the_schema_cannot_hold_is_refused_by_name(
    conn: Conn, tenant: uuid.UUID, moment: datetime
) -> None:
    """The database would refuse it with a bare check violation; enqueue names the field,
    the value and the range, for a batch as for one job, and writes nothing."""
    await prepare(conn)
    message = (r"available_at .* is outside the times a job can hold \(from "
               r"0001-01-02T00:00:00\+00:00 up to, not including, 9999-12-31")
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", available_at=moment)
    with pytest.raises(ValueError, match=message):
        await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record"),
                                          jobpool.NewJob(tenant, "test_record",
                                                         available_at=moment)])
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Tokyo", "UTC"])
async def test_an_aware_available_at_is_the_same_instant_in_every_session_time_zone(
    conn: Conn, dsn: str, tenant: uuid.UUID, zone: str
) -> None:
    await prepare(conn)
    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    async with await _connect(dsn) as caller:
        await caller.execute(sql.SQL("SET TIME ZONE {}").format(sql.Literal(zone)))
        enqueued = await jobpool.enqueue(caller, tenant_id=tenant, kind="test_record",
                                         available_at=when)
    assert (await job(conn, enqueued.id))["available_at"] == when


async def test_a_nul_in_an_idempotency_key_is_refused_before_any_write(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    with pytest.raises(ValueError,
                       match="idempotency_key of a job of kind test_record contains a NUL"):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", idempotency_key="a\x00b")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("priority", 1.5, "priority must be a whole number from -32768 to 32767, got 1.5"),
    ("priority", True, "priority must be a whole number from -32768 to 32767, got True"),
    ("max_attempts", 2**40, "max_attempts must be a whole number from 1 to 2147483647, got "
                            "1099511627776"),
    ("max_attempts", 2.0, "max_attempts must be a whole number from 1 to 2147483647, got 2.0"),
    ("idempotency_key", 5, "idempotency_key must be a string of 1 to 512 characters, got 5"),
    ("kind", 5, "kind must be a string, got int"),
])
async def test_fields_of_the_wrong_type_or_size_are_refused_naming_the_field(
    conn: Conn, tenant: uuid.UUID, field: str, value: Any, problem: str
) -> None:
    """A ValueError before anything is sent, not a psycopg error (which would abort the
    caller's transaction) or a TypeError from deep inside; the transaction goes on."""
    await prepare(conn)
    fields: dict[str, Any] = {"tenant_id": tenant, "kind": "test_record", field: value}
    with pytest.raises(ValueError) as refused:
        await jobpool.enqueue(conn, **fields)
    assert str(refused.value) == problem
    with pytest.raises(ValueError) as refused:
        await jobpool.enqueue_many(conn, [jobpool.NewJob(**fields)])
    assert str(refused.value) == problem
    good = jobpool.NewJob(tenant, "test_record", {})
    with pytest.raises(ValueError) as refused:  # in a batch, the job's place too
        await jobpool.enqueue_many(conn, [good, good, jobpool.NewJob(**fields)])
    assert str(refused.value) == f"job 3 of 3 in the batch: {problem}"
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_batch_sets_each_jobs_own_fields_audits_and_notifies_each_kind(
    conn: Conn, dsn: str, tenant: uuid.UUID, keyed: bool
) -> None:
    """Fields given on some jobs only land on those jobs; the others take the kind's
    defaults. Ids follow the batch order; one audit row per job, one NOTIFY per kind. With
    and without idempotency keys (two statements)."""
    await prepare(conn)
    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

    class Level(enum.IntEnum):
        HIGH = 7

    as_text = str(tenant).upper()
    jobs = [
        jobpool.NewJob(tenant, "test_record", {"n": 0}),
        jobpool.NewJob(as_text, "test_record", {"n": 1}, priority=Level.HIGH),
        jobpool.NewJob(tenant.hex, "test_record", {"n": 2}, available_at=when),
        jobpool.NewJob(str(tenant), "test_noop", {"n": 3}, max_attempts=9,
                       idempotency_key="k" if keyed else None),
        jobpool.NewJob(tenant, "test_record", {"n": 4}),
    ]
    async with await _connect(dsn) as listener:
        await listener.execute("LISTEN jobpool")
        results = await jobpool.enqueue_many(conn, jobs, actor="batch-test")
        notes = sorted([n.payload async for n in listener.notifies(timeout=2.0, stop_after=2)])
    assert notes == ["test_noop", "test_record"]
    assert all(r.created for r in results)
    assert [r.id for r in results] == sorted(r.id for r in results)
    rows = [await job(conn, r.id) for r in results]
    assert [row["payload"] for row in rows] == [{"n": n} for n in range(5)]
    assert {row["tenant_id"] for row in rows} == {tenant}
    assert [row["priority"] for row in rows] == [100, 7, 100, 100, 100]
    assert rows[2]["available_at"] == when
    assert all(row["available_at"] < when for row in rows if row is not rows[2])
    assert [row["max_attempts"] for row in rows] == [3, 3, 3, 9, 3]
    assert [row["idempotency_key"] for row in rows] == [None, None, None,
                                                        "k" if keyed else None, None]
    cur = await conn.execute(
        "SELECT job_id, tenant_id, actor_principal_id, payload FROM mdm.aa_audit_log"
        " WHERE action = 'job_enqueued' ORDER BY job_id")
    assert await cur.fetchall() == [
        {"job_id": r.id, "tenant_id": tenant, "actor_principal_id": "batch-test",
         "payload": {"kind": job_.kind}} for r, job_ in zip(results, jobs, strict=True)]


async def test_a_big_batch_of_one_tenant_and_kind_comes_back_in_order(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    jobs = [jobpool.NewJob(tenant, "test_record", {"n": n}) for n in range(5000)]
    results = await jobpool.enqueue_many(conn, jobs)
    cur = await conn.execute("SELECT id, (payload->>'n')::int AS n FROM mdm.aa_job ORDER BY id")
    assert [(row["id"], row["n"]) for row in await cur.fetchall()] == [
        (r.id, n) for n, r in enumerate(results)]
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log") == 5000
