"""Rate limits hold for the whole pool: several worker processes share one bucket per limit.

The limits are so slow (one token in 100 s) that only the burst can be spent while a test
runs: the counts below are exact whatever the machine's speed. Buckets kept in each process
would let every process spend its own burst.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
from integration.helpers import prepare, scalar

import jobpool
from acceptance.cli import jobpool as cli
from acceptance.cli import start, worker_args

Conn = psycopg.AsyncConnection[dict[str, Any]]

SLOW = {"rps": 0.01, "burst": 3}


async def run_processes(dsn: str, argvs: list[list[str]], **env: str) -> None:
    """Start every worker at once and wait until each found nothing runnable left."""
    workers = [start(dsn, *argv, **env) for argv in argvs]
    for worker in workers:
        _, err = await asyncio.to_thread(worker.communicate, timeout=120)
        assert worker.returncode == 0, err


async def counts(conn: Conn, kinds: tuple[str, ...]) -> dict[tuple[str, int], int]:
    """(status, attempts) -> number of jobs of `kinds`."""
    cur = await conn.execute(
        "SELECT status::text AS status, attempts, count(*) AS n FROM mdm.aa_job"
        " WHERE job_kind = ANY(%s) GROUP BY 1, 2", (list(kinds),))
    return {(row["status"], row["attempts"]): row["n"] for row in await cur.fetchall()}


async def test_four_processes_spend_one_tenant_burst_between_them(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await conn.execute("UPDATE mdm.aa_tenant SET metadata = %s::jsonb WHERE id = %s",
                       (json.dumps({"rate_limit": {"test_record": SLOW}}), tenant))
    other = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('free') RETURNING id")
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 24)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(other, "test_record")] * 24)

    await run_processes(dsn, [worker_args("test_record", until_empty=True)] * 4)

    # 3 tokens for the pool, not 3 per process; the others wait, their attempt not used
    cur = await conn.execute(
        "SELECT tenant_id, status::text AS status, attempts, count(*) AS n FROM mdm.aa_job"
        " GROUP BY 1, 2, 3")
    found = {(row["tenant_id"], row["status"], row["attempts"]): row["n"]
             for row in await cur.fetchall()}
    assert found == {(tenant, "done", 1): 3, (tenant, "pending", 0): 21, (other, "done", 1): 24}
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 27
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_rate_bucket") == 1


async def test_a_provider_cap_is_shared_by_two_lanes_of_two_processes(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 12)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_noop")] * 12)
    caps = {"providers": {"ses": {"rps": 0.01, "burst": 5}},
            "kinds": {"test_record": "ses", "test_noop": "ses"}}

    lanes = [worker_args("test_record", until_empty=True)] * 2
    lanes += [worker_args("test_noop", until_empty=True)] * 2
    await run_processes(dsn, lanes, JOBPOOL_RATE_LIMITS=json.dumps(caps))

    found = await counts(conn, ("test_record", "test_noop"))
    assert found[("done", 1)] == 5
    assert found[("pending", 0)] == 19
    assert set(found) == {("done", 1), ("pending", 0)}


CAPPED_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: capped}
spec:
  image: jobpool:test
  database: {secretName: db}
  lanes:
    - name: records
      kinds: [test_record]
      minReplicas: 2
      rateLimits: &caps
        providers: {relay: {rps: 0.01, burst: 4}}
        kinds: {test_record: relay, test_noop: relay}
    - name: noops
      kinds: [test_noop]
      minReplicas: 2
      rateLimits: *caps
"""


async def test_a_local_pool_applies_its_lanes_rate_limits_as_the_cluster_does(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """Four local processes in two lanes spend one provider burst, as four pods would."""
    await prepare(conn)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 10)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_noop")] * 10)
    pool = tmp_path / "pool.yaml"
    pool.write_text(CAPPED_POOL)

    result = cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
                 "--metrics-port", "0", "--log-level", "warning")

    assert "lane records: 2 process(es)" in result.stdout
    assert "lane noops: 2 process(es)" in result.stdout
    found = await counts(conn, ("test_record", "test_noop"))
    assert found == {("done", 1): 4, ("pending", 0): 16}
