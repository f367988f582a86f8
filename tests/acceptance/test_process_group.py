"""`jobpool run --processes N`: several worker processes behind one health and metrics port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import uuid
from pathlib import Path
from typing import Any

import psycopg
from integration.helpers import prepare, scalar

import jobpool
from acceptance.cli import start, worker_args
from acceptance.test_start_up import free_port, probe, stop, wait_for_probe

Conn = psycopg.AsyncConnection[dict[str, Any]]


def done_count(exposition: str) -> float:
    """mdm_jobs_attempts_total{kind="test_sleep",outcome="done"} of a /metrics text."""
    found = re.search(r'^mdm_jobs_attempts_total\{kind="test_sleep",outcome="done"\} (\S+)$',
                      exposition, re.M)
    return float(found.group(1)) if found else 0.0


async def test_two_processes_share_the_jobs_one_port_sums_their_metrics_sigterm_stops_both(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    port = free_port()
    group = start(dsn, *worker_args("test_sleep", slots=1, processes=2, metrics_port=port))
    try:
        await wait_for_probe(port, "/readyz", 200, "ready")  # both children online
        await jobpool.enqueue_many(
            conn, [jobpool.NewJob(tenant, "test_sleep", {"seconds": 0.1})] * 20)
        for _ in range(600):
            if await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'") == 20:
                break
            await asyncio.sleep(0.1)
        pids = await scalar(conn, "SELECT count(DISTINCT worker_pid) FROM test_runs")
        assert pids == 2  # one slot each: both processes ran jobs
        claimers = await scalar(conn, "SELECT count(DISTINCT claimed_by) FROM mdm.aa_job")
        assert claimers == 2
        status, body = await probe(port, "/metrics")
        assert status == 200
        assert done_count(body) == 20  # the two processes' counters, summed
        assert (await probe(port, "/healthz"))[0] == 200
    finally:
        err = await stop(group)
    assert group.returncode == 0, err
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 20


async def test_the_worker_processes_stop_when_their_parent_is_killed(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """kill -9 of the parent (the OOM killer) left its children running, claiming jobs beside
    the set a restarted parent would start. Now each sees it is gone and stops as on SIGTERM."""
    await prepare(conn)
    port = free_port()
    group = start(dsn, *worker_args("test_sleep", slots=1, processes=2, metrics_port=port))
    try:
        await wait_for_probe(port, "/readyz", 200, "ready")  # both children online
        for _ in range(300):  # each registers itself with its pid
            cur = await conn.execute("SELECT array_agg(pid) AS pids FROM mdm.aa_worker")
            children = (await cur.fetchone() or {}).get("pids") or []
            if len(children) == 2:
                break
            await asyncio.sleep(0.1)
        assert len(children) == 2 and group.pid not in children
        os.kill(group.pid, signal.SIGKILL)
        group.wait()
        for _ in range(300):
            if not any(Path(f"/proc/{pid}").exists() and _running(pid) for pid in children):
                break
            await asyncio.sleep(0.1)
        assert not any(Path(f"/proc/{pid}").exists() and _running(pid) for pid in children)
        assert await scalar(conn, "SELECT count(*) FROM mdm.aa_worker") == 0  # deregistered
    finally:
        if group.poll() is None:
            await stop(group)


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, reaped by init soon, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
