"""`jobpool status` per lane: live workers, busy slots, running jobs and why a backlog waits."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
from integration.helpers import prepare

import jobpool
from acceptance.cli import jobpool as cli

Conn = psycopg.AsyncConnection[dict[str, Any]]
EXAMPLE_POOL = Path(__file__).resolve().parents[2] / "examples" / "pool.yaml"
HOLDER = "node-1/77/5b1c"


async def _stuck_default_lane(conn: Conn, tenant: uuid.UUID) -> list[int]:
    """A live worker of lane default with both slots held by 4-minute test_sleep jobs, and
    three ready test_record jobs waiting 5 minutes; the running job ids."""
    await prepare(conn)
    await conn.execute(
        "INSERT INTO mdm.aa_worker (worker_id, host, pid, pool, lane, kinds, tenants, slots, "
        "busy_slots, claims_last_minute) VALUES (%s, 'node-1', 77, 'mdm-jobs', 'default', "
        "'{test_sleep,test_record}', '{}', 2, 2, 0)", (HOLDER,))
    running = []
    for _ in range(2):
        job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep", payload={})
        running.append(job.id)
    await conn.execute("UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = %s,"
                       " claimed_at = now() - interval '4 minutes' WHERE id = ANY(%s)",
                       (HOLDER, running))
    for _ in range(3):
        job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", payload={})
        await conn.execute("UPDATE mdm.aa_job SET available_at = now() - interval '5 minutes'"
                           " WHERE id = %s", (job.id,))
    return running


async def test_status_explains_a_lane_whose_slots_are_all_busy(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    running = await _stuck_default_lane(conn, tenant)
    shown = cli(dsn, "status", "--pool", str(EXAMPLE_POOL)).stdout
    assert ("  default: all 2 slots busy with `test_sleep` for 4 min; acme test_record: 3 ready,"
            " the oldest waiting 5 min") in shown
    assert "  acme: no live worker serves this lane" not in shown  # it serves no test_record
    for job_id in running:
        assert any(line.split()[:3] == [str(job_id), "test_sleep", "acme"]
                   and line.rstrip().endswith(HOLDER) for line in shown.splitlines()), shown

    document = json.loads(cli(dsn, "status", "--json").stdout)
    [lane] = document["lanes"]  # without a pool file: the lanes of live workers
    assert (lane["lane"], lane["workers"], lane["busy"], lane["free"], lane["ready"]) == (
        "default", 1, 2, 0, 3)
    assert [w["worker_id"] for w in document["workers"]] == [HOLDER]
    assert sorted(j["id"] for j in document["running"]) == running


async def test_status_marks_running_jobs_whose_holder_no_longer_beats(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    running = await _stuck_default_lane(conn, tenant)
    await conn.execute("UPDATE mdm.aa_worker SET heartbeat_at = now() - interval '1 minute'")
    document = json.loads(cli(dsn, "status", "--json").stdout)
    assert (document["lanes"], document["workers"]) == ([], [])
    assert {(j["id"], j["holder_live"]) for j in document["running"]} == {
        (job_id, False) for job_id in running}
    assert f"{HOLDER} (not live)" in cli(dsn, "status").stdout


async def test_status_names_its_own_flag_for_a_pool_file_it_cannot_read(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """`status --pool` named the API's variable JOBPOOL_API_POOL, which status never reads."""
    missing = tmp_path / "no-such-pool.yaml"
    result = cli(dsn, "status", "--pool", str(missing), check=False)
    assert result.returncode == 2
    assert f"jobpool: error: --pool: {missing}: cannot read the pool file" in result.stderr
    assert "JOBPOOL_API_POOL" not in result.stderr


async def test_status_says_when_no_live_worker_claims_the_ready_jobs(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Without a pool file and without a live worker, the lanes table was an empty header."""
    await prepare(conn)
    for _ in range(3):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record", payload={})
    await conn.commit()
    shown = cli(dsn, "status").stdout
    assert "  no live worker: nothing claims the 3 ready job(s) (start one with `jobpool run`" \
        in shown
