"""The registry of live workers: a worker registers, beats with its state, and leaves at exit;
dead ones are ignored by readers and deleted by the next worker that notices."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from integration.helpers import prepare, worker
from jobpool import settings
from jobpool.api.overview import gather_overview
from jobpool.db.live_workers import live_workers
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.metrics import QueueGauges
from jobpool.worker import heartbeat
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]
LANE = {"name": "default", "kinds": None, "exclude_kinds": [], "tenants": []}


@pytest.fixture(autouse=True)
def lane_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Workers of pool mdm-jobs, lane default, beating every 0.1 s."""
    monkeypatch.setattr(heartbeat, "HEARTBEAT_EVERY", 0.1)
    previous = settings.current()
    settings.configure(replace(previous, pool="mdm-jobs", lane="default"))
    yield
    settings.configure(previous)


@pytest.fixture
async def ready(conn: Conn) -> Conn:
    await prepare(conn)
    return conn


async def rows(conn: Conn) -> list[dict[str, Any]]:
    cur = await conn.execute("SELECT * FROM mdm.aa_worker ORDER BY worker_id")
    return list(await cur.fetchall())


async def eventually(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """The first truthy value of `await check()` (a deadline only bounds a hung test)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"never saw {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def running_worker(dsn: str, ready: Conn) -> AsyncIterator[Worker]:
    """A worker with 2 slots, both busy with 30-second test_sleep jobs, the third one left
    ready (no prefetch), stopped at the end (its grace period hands them back)."""
    w = worker(dsn, ("test_sleep",), slots=2, prefetch=0, until_empty=False, grace=0.1)
    await enqueue_many(ready, [NewJob(await _tenant(ready), "test_sleep", {"seconds": 30})
                               for _ in range(3)])
    task = asyncio.create_task(w.run())
    yield w
    w.stop()
    await task


async def test_a_worker_registers_and_beats_with_its_busy_slots_and_claims(
    running_worker: Worker, ready: Conn
) -> None:
    async def busy() -> list[dict[str, Any]]:
        found = await rows(ready)
        return found if found and found[0]["busy_slots"] == 2 else []

    [row] = await eventually(busy, "both slots busy in the heartbeat")
    assert (row["worker_id"], row["host"], row["pid"]) == (
        running_worker.worker_id, socket.gethostname(), os.getpid())
    assert (row["pool"], row["lane"], row["kinds"], row["tenants"], row["slots"]) == (
        "mdm-jobs", "default", ["test_sleep"], [], 2)
    assert row["claims_last_minute"] == 2
    assert row["completions_last_minute"] == 0
    assert row["last_claim_at"] is not None
    assert row["started_at"] <= row["last_claim_at"] <= row["heartbeat_at"]
    first = row["heartbeat_at"]
    await eventually(lambda: _beat_after(ready, first), "a later heartbeat")


async def test_the_overview_shows_the_lane_its_running_jobs_and_why_its_backlog_waits(
    running_worker: Worker, ready: Conn
) -> None:
    async def stuck() -> dict[str, Any] | None:
        view = await gather_overview(ready, tenants=None, lanes=[LANE])
        [lane] = view["activity"]
        return view if lane["busy"] == 2 and lane["ready"] == 1 else None

    view = await eventually(stuck, "the lane's slots busy with one job ready")
    [lane] = view["activity"]
    assert (lane["lane"], lane["workers"], lane["slots"], lane["free"]) == ("default", 1, 2, 0)
    assert lane["oldest_ready"]["kind"] == "test_sleep"
    assert lane["explanation"].startswith("all 2 slots busy with `test_sleep` for ")
    assert [w["worker_id"] for w in view["workers"]] == [running_worker.worker_id]
    assert [(j["kind"], j["holder"], j["lane"], j["holder_live"]) for j in view["running"]] == [
        ("test_sleep", running_worker.worker_id, "default", True)] * 2


async def test_a_clean_exit_deletes_the_workers_row(dsn: str, ready: Conn) -> None:
    w = worker(dsn, ("test_noop",), until_empty=False)
    task = asyncio.create_task(w.run())
    await eventually(lambda: rows(ready), "the worker's row")
    w.stop()
    await task
    assert await rows(ready) == []


async def test_dead_workers_are_ignored_then_deleted_and_their_jobs_show_a_dead_holder(
    dsn: str, ready: Conn
) -> None:
    dead = "gone-host/4242/" + str(uuid.uuid4())
    await ready.execute(
        "INSERT INTO mdm.aa_worker (worker_id, host, pid, lane, kinds, tenants, slots, "
        "busy_slots, heartbeat_at) VALUES (%s, 'gone-host', 4242, 'default', "
        "'{test_sleep}', '{}', 4, 1, now() - interval '5 minutes')", (dead,))
    [job] = await enqueue_many(ready, [NewJob(await _tenant(ready), "test_sleep", {})])
    await ready.execute("UPDATE mdm.aa_job SET status = 'running', claimed_by = %s, "
                        "claimed_at = now() - interval '10 minutes', attempts = 1 "
                        "WHERE id = %s", (dead, job.id))
    assert await live_workers(ready) == []
    view = await gather_overview(ready, tenants=None, lanes=[LANE])
    assert [(j["id"], j["holder_live"], j["lane"]) for j in view["running"]] == [
        (job.id, False, None)]
    assert view["activity"][0]["workers"] == 0

    w = worker(dsn, ("test_noop",), until_empty=False)
    task = asyncio.create_task(w.run())
    try:
        async def only_the_new_one() -> bool:
            return [r["worker_id"] for r in await rows(ready)] == [w.worker_id]

        await eventually(only_the_new_one, "the dead row deleted by the new worker")
    finally:
        w.stop()
        await task


async def test_a_worker_whose_row_was_deleted_registers_again(dsn: str, ready: Conn) -> None:
    w = worker(dsn, ("test_noop",), until_empty=False)
    task = asyncio.create_task(w.run())
    try:
        await eventually(lambda: rows(ready), "the worker's row")
        await ready.execute("DELETE FROM mdm.aa_worker")
        await eventually(lambda: rows(ready), "the worker's row again")
    finally:
        w.stop()
        await task


async def _beat_after(conn: Conn, first: Any) -> bool:
    return any(r["heartbeat_at"] > first for r in await rows(conn))


async def _tenant(conn: Conn) -> uuid.UUID:
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme') "
                             "ON CONFLICT (key) DO UPDATE SET key = excluded.key RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


async def test_the_gauges_count_live_workers_per_lane_and_jobs_without_a_live_holder(
    dsn: str, ready: Conn
) -> None:
    await ready.execute(
        "INSERT INTO mdm.aa_worker (worker_id, host, pid, pool, lane, kinds, tenants, slots, "
        "busy_slots, heartbeat_at) VALUES "
        "('a/1/x', 'a', 1, 'mdm-jobs', 'default', '{test_sleep}', '{}', 4, 3, now()), "
        "('b/2/y', 'b', 2, 'mdm-jobs', 'default', '{test_sleep}', '{}', 4, 1, now()), "
        "('c/3/z', 'c', 3, NULL, NULL, '{test_sleep}', '{}', 2, 0, now()), "
        "('d/4/w', 'd', 4, 'mdm-jobs', 'default', '{test_sleep}', '{}', 8, 8, "
        " now() - interval '5 minutes')")
    jobs = await enqueue_many(ready, [NewJob(await _tenant(ready), "test_sleep", {})
                                      for _ in range(3)])
    for job, holder in zip(jobs, ("a/1/x", "d/4/w", "gone/5/v"), strict=True):
        await ready.execute("UPDATE mdm.aa_job SET status = 'running', claimed_by = %s, "
                            "claimed_at = now(), attempts = 1 WHERE id = %s", (holder, job.id))
    gauges = QueueGauges(dsn, max_age=0)
    try:
        await gauges.refresh()
    finally:
        await gauges.close()
    samples = {(family.name, tuple(sample.labels.values())): sample.value
               for family in gauges.collect() for sample in family.samples}
    assert {key: value for key, value in samples.items()
            if key[0].startswith("mdm_worker")} == {
        ("mdm_workers_live", ("", "")): 1, ("mdm_workers_live", ("mdm-jobs", "default")): 2,
        ("mdm_worker_slots", ("", "")): 2, ("mdm_worker_slots", ("mdm-jobs", "default")): 8,
        ("mdm_worker_slots_busy", ("", "")): 0,
        ("mdm_worker_slots_busy", ("mdm-jobs", "default")): 4}
    assert samples[("mdm_jobs_running_without_live_holder", ())] == 2
