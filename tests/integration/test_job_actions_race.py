"""Replay and discard of a job whose status changes while they run.

Each is one statement that matches the job in its status (`status = 'dlq'`); a worker moving
the job to the DLQ after that statement read it, but before the refusal read it back, made
the action refuse a job it applies to, with a message saying the job was in the DLQ.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from integration.helpers import add_tenant, prepare, scalar
from jobpool import admin
from jobpool.errors import JobStateError

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _running_job(conn: Conn) -> int:
    tenant = await add_tenant(conn, "acme")
    return int(await scalar(
        conn, "INSERT INTO mdm.aa_job (tenant_id, job_kind, status, claimed_by, claimed_at,"
              " attempts, max_attempts) VALUES (%s, 'test_record', 'running', 'w', now(), 1, 1)"
              " RETURNING id", (tenant,)))


async def _to_the_dlq(dsn: str, job_id: int) -> None:
    """What a worker's last failed attempt commits: the job in the DLQ."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        await other.execute("UPDATE mdm.aa_job SET status = 'dlq', completed_at = now(),"
                            " last_error = 'gave up' WHERE id = %s", (job_id,))


@pytest.mark.parametrize(("action", "query", "after"), [
    (admin.replay, "REPLAY_JOB", "pending"),
    (admin.discard, "DISCARD_JOB", None),
])
async def test_an_action_that_meets_the_job_reaching_the_dlq_applies_to_it(
        conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch, action: Any, query: str,
        after: str | None) -> None:
    await prepare(conn)
    job_id = await _running_job(conn)
    first = getattr(admin, query)
    calls = 0

    async def read_then_moved(c: Conn, params: Any) -> Any:
        """The action's statement, then the job's move to the DLQ (committed by another
        session) before anything reads the job again."""
        nonlocal calls
        row = await first(c, params)
        calls += 1
        if calls == 1:
            assert row is None  # it read the job as running
            await _to_the_dlq(dsn, job_id)
        return row

    monkeypatch.setattr(admin, query, read_then_moved)
    await action(conn, job_id, actor="user:oncall")
    cur = await conn.execute("SELECT status::text FROM mdm.aa_job WHERE id = %s", (job_id,))
    found = await cur.fetchone()
    assert (found["status"] if found else None) == after
    assert calls == 2


async def test_an_action_the_status_never_allows_is_refused_naming_it(
        conn: Conn, dsn: str) -> None:
    await prepare(conn)
    job_id = await _running_job(conn)
    with pytest.raises(JobStateError,
                       match=rf"cannot replay job {job_id}: it is running, only dlq jobs"):
        await admin.replay(conn, job_id, actor="user:oncall")
