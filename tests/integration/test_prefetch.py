"""The prefetch buffer against the real server: jobs claimed beyond the free slots, not
started yet, are leased, handed back without an attempt at shutdown and when every slot stays
busy, dropped when stopped, left to the pause, and never run twice; at most `slots` handlers
run at once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

import jobpool
from integration.helpers import job, prepare, scalar, wait_until, worker
from jobpool import admin, pauses

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _statuses(conn: Conn, ids: list[int]) -> list[tuple[str, int]]:
    return [((row := await job(conn, i))["status"], row["attempts"]) for i in ids]


async def _sleepers(conn: Conn, tenant: uuid.UUID, count: int, seconds: float) -> list[int]:
    ids = []
    for _ in range(count):  # one by one: the claim takes them in this order
        ids.append((await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                          payload={"seconds": seconds})).id)
    return ids


async def test_sigterm_hands_back_the_buffer_at_once_without_an_attempt(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    first, *buffered = await _sleepers(conn, tenant, 3, 600)
    w = worker(dsn, ("test_sleep",), until_empty=False, slots=1, prefetch=2, grace=600.0)
    running = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: len(w.producer.buffer) == 2 and len(w.producer.in_flight) == 1,
                         "one job running, two buffered", 30)
        assert list(w.producer.in_flight) == [first]  # claim order
        assert await _statuses(conn, buffered) == [("running", 1)] * 2
        w.stop()  # the grace period of the running job begins; the buffer goes back now

        async def handed_back() -> bool:
            return await _statuses(conn, buffered) == [("pending", 0)] * 2
        await wait_until(handed_back, "the buffered jobs pending, their attempt not counted", 10)
        assert not running.done() and (await job(conn, first))["status"] == "running"
        assert [(await job(conn, i))["claimed_by"] for i in buffered] == [None, None]
    finally:
        w.stop()  # a second stop hands the running job back too
        await asyncio.wait_for(running, 30)
    assert await _statuses(conn, [first, *buffered]) == [("pending", 0)] * 3
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 0


async def test_a_buffered_job_behind_a_long_handler_is_handed_back_and_runs_later(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The one slot runs a 4 s sleep: the job claimed into the buffer beside it is handed
    back unrun after a second (another worker could run it), not claimed again while the
    slot stays busy, and runs once, here, when the slot frees."""
    await prepare(conn)
    first, second = await _sleepers(conn, tenant, 2, 4)
    w = worker(dsn, ("test_sleep",), slots=1, prefetch=1)
    running = asyncio.create_task(w.run())
    await wait_until(lambda: list(w.producer.buffer) == [second], "the second job buffered", 30)

    async def handed_back() -> bool:
        return await _statuses(conn, [second]) == [("pending", 0)]
    await wait_until(handed_back, "the buffered job pending, its attempt not counted", 30)
    assert (await job(conn, second))["claimed_by"] is None
    assert (await job(conn, first))["status"] == "running"
    await asyncio.wait_for(running, 60)
    assert await _statuses(conn, [first, second]) == [("done", 1)] * 2
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (second,)) == 1


async def _one_running_one_buffered(conn: Conn, dsn: str, tenant: uuid.UUID) -> tuple[
        Any, asyncio.Task[None], int]:
    """A worker of one slot running a 2 s sleep with a test_record job in its buffer."""
    await prepare(conn)
    await _sleepers(conn, tenant, 1, 2)
    buffered = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    w = worker(dsn, ("test_sleep", "test_record"), slots=1, prefetch=1)
    running = asyncio.create_task(w.run())
    await wait_until(lambda: list(w.producer.buffer) == [buffered], "test_record buffered", 30)
    return w, running, buffered


async def test_a_stopped_buffered_job_never_runs(conn: Conn, dsn: str,
                                                 tenant: uuid.UUID) -> None:
    w, running, buffered = await _one_running_one_buffered(conn, dsn, tenant)
    await admin.stop(conn, buffered, actor="alice@example.com")
    await wait_until(lambda: buffered not in w.producer.buffer, "the stop seen", 30)
    await asyncio.wait_for(running, 60)  # the slot frees: nothing left to start
    assert (await job(conn, buffered))["status"] == "failed"
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                        (buffered,)) == 0


async def test_a_buffered_job_of_a_paused_kind_is_handed_back_unrun(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    _, running, buffered = await _one_running_one_buffered(conn, dsn, tenant)
    await pauses.pause(conn, tenant=None, kind="test_record", actor="user:oncall",
                       reason="prefetch test")
    # the sleep outlasts the buffer's second: handed back, and the pause keeps it pending
    await asyncio.wait_for(running, 60)
    row = await job(conn, buffered)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 1  # the sleeper's only


async def test_a_drain_with_a_buffer_runs_each_job_once_within_the_slots(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 300)
    w = worker(dsn, ("test_record",), slots=3, prefetch=5)
    outcomes: list[str] = []
    w.on_outcome = lambda job, outcome: outcomes.append(outcome)  # a 4th handler: no slot
    most = 0

    async def watch() -> None:
        nonlocal most
        while True:
            most = max(most, w.producer.busy())
            await asyncio.sleep(0)
    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(w.run(), 120)
    finally:
        watcher.cancel()
    assert 1 <= most <= 3
    assert outcomes == ["done"] * 300  # none handed back for want of a slot connection
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 300
    assert await scalar(conn, "SELECT count(DISTINCT job_id) FROM test_runs") == 300
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done' "
                              "AND attempts = 1") == 300
