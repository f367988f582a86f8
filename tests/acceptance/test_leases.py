"""Leases as users meet them: a worker killed mid-job, a handler that blocks its event loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import urllib.request
import uuid
from typing import Any

import psycopg
from integration.helpers import job, prepare, scalar
from ports import free_port

import jobpool
from acceptance.cli import start, worker_args
from jobpool.db.live_workers import DEAD_AFTER, live_workers
from jobpool.worker.maintenance import recover_stale_claims

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _wait_for(conn: Conn, query: str, params: Any, seconds: float = 60) -> None:
    for _ in range(int(seconds * 10)):
        if await scalar(conn, query, params):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never true: {query} {params}")


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
        return response.status, response.read().decode()


async def _stop(worker: subprocess.Popen[str]) -> str:
    worker.send_signal(signal.SIGTERM)
    _, err = await asyncio.to_thread(worker.communicate, timeout=60)
    assert worker.returncode == 0, err
    return err


async def test_a_killed_workers_jobs_run_again_once_their_leases_lapse(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Leases of 2 s (test_sleep's stale TTL is 3 s, the kinds' default 15 min): the survivor
    takes back the dead worker's two claims by itself (no `jobpool recover`) and runs them,
    while its own long job keeps its claim throughout."""
    await prepare(conn)
    doomed = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                     payload={"seconds": 600, "retry_seconds": 0})).id
              for _ in range(2)]
    # no prefetch: its two busy slots must leave the survivor's job to the survivor
    victim = start(dsn, *worker_args("test_sleep", slots=2, prefetch=0), JOBPOOL_LEASE_TTL="2")
    await _wait_for(conn, "SELECT count(*) = 2 FROM mdm.aa_job WHERE status = 'running'", None)
    survivor = start(dsn, *worker_args("test_sleep", slots=2, grace=0.5), JOBPOOL_LEASE_TTL="2")
    live = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                  payload={"seconds": 600})).id
    await _wait_for(conn, "SELECT status = 'running' FROM mdm.aa_job WHERE id = %s", (live,))
    live_claim = (await job(conn, live))["claimed_by"]

    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    await _wait_for(conn, "SELECT count(*) = 2 FROM mdm.aa_job WHERE id = ANY(%s)"
                    " AND status = 'done'", (doomed,))
    live_row = await job(conn, live)
    err = await _stop(survivor)

    for job_id in doomed:
        row = await job(conn, job_id)
        assert (row["status"], row["attempts"]) == ("done", 2)
        assert f"recovered the lapsed claim of job {job_id} (test_sleep) -> pending" in err
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = ANY(%s)",
                        (doomed,)) == 2
    # the survivor's own job kept its claim while the dead worker's lapsed and ran again
    assert (live_row["status"], live_row["attempts"], live_row["claimed_by"]) == (
        "running", 1, live_claim)
    assert f"lapsed claim of job {live} " not in err and "lease lost" not in err


async def test_a_handler_blocking_the_event_loop_runs_once(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """test_block calls time.sleep in its async handler, four times its 1 s stale TTL, while
    recovery runs all the time: its lease is renewed meanwhile and the job runs once; /healthz
    answers meanwhile; the blocking is logged with the job, the kind and how long it lasted."""
    await prepare(conn)
    blocking = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_block",
                                      payload={"seconds": 4})).id
    port = free_port()
    w = start(dsn, *worker_args("test_block", metrics_port=port))
    await _wait_for(conn, "SELECT status = 'running' FROM mdm.aa_job WHERE id = %s",
                    (blocking,))
    leases: set[Any] = set()
    recovered: list[Any] = []
    health: list[tuple[int, str]] = []
    while (row := await job(conn, blocking))["status"] == "running":
        leases.add(row["lease_expires_at"])
        recovered += await recover_stale_claims(conn, actor="test")
        if len(leases) >= 2 and not health:  # renewed since the claim: the handler blocks
            health.append(await asyncio.to_thread(_get, port, "/healthz"))
        await asyncio.sleep(0.1)
    err = await _stop(w)

    assert recovered == []
    assert len(leases) >= 3  # renewed while the handler held the event loop
    # answered from its own thread meanwhile (naming the blocking job once it is seen)
    assert [(status, json.loads(body)["status"]) for status, body in health] == [(200, "ok")]
    row = await job(conn, blocking)
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                        (blocking,)) == 1
    assert f"job {blocking} (test_block) blocks it" in err
    assert "the event loop was blocked for" in err and f"by job {blocking} (test_block)" in err
    assert "lease lost" not in err


async def test_a_worker_blocked_longer_than_dead_after_stays_live(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """test_block holds the event loop for longer than `DEAD_AFTER` (30 s): the lease thread
    beats meanwhile, so the worker is listed live at every look (as `jobpool workers` and the
    console read it) and its row is never deleted and registered again; /healthz names the
    blocking job; the job runs once."""
    await prepare(conn)
    blocking = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_block",
                                      payload={"seconds": DEAD_AFTER + 5})).id
    port = free_port()
    w = start(dsn, *worker_args("test_block", metrics_port=port))
    await _wait_for(conn, "SELECT status = 'running' FROM mdm.aa_job WHERE id = %s",
                    (blocking,))
    holder = (await job(conn, blocking))["claimed_by"]
    looks: list[bool] = []
    beats: set[Any] = set()
    started: set[Any] = set()
    health: set[str] = set()
    while (await job(conn, blocking))["status"] == "running":
        live = [row for row in await live_workers(conn) if row["worker_id"] == holder]
        looks.append(bool(live))
        for row in live:
            beats.add(row["heartbeat_at"])
            started.add(row["started_at"])
        await recover_stale_claims(conn, actor="test")
        status, body = await asyncio.to_thread(_get, port, "/healthz")
        if status == 200 and "blocked" in json.loads(body):
            health.add(json.loads(body)["blocked"].split(" for ")[0])
        await asyncio.sleep(0.5)
    err = await _stop(w)

    assert looks and all(looks)  # live at every look, for longer than DEAD_AFTER
    assert len(beats) >= 4  # beaten while the loop was blocked (every 5 s)
    assert len(started) == 1  # never deleted as dead and registered again
    assert health == {"event loop blocked"}
    row = await job(conn, blocking)
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                        (blocking,)) == 1
    assert "registered again" not in err and "lease lost" not in err
