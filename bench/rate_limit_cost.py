"""What a rate-limited or paused tenant costs the others: tenant B's throughput with and
without a throttled or paused tenant A flooding the queue ahead of it.

    .venv/bin/python bench/rate_limit_cost.py [--dsn postgresql://postgres@127.0.0.1/postgres]
        [--flood 20000] [--jobs 2000] [--slots 4] [--scenarios alone,flooded,no-exclude,paused]

Creates and drops a scratch database on the given server. Scenarios, one worker each:
  alone      B's jobs only
  flooded    A's flood (rps 1, burst 1) enqueued before B's jobs, same priority
  no-exclude as flooded, but the claim does not leave throttled pairs out (the naive way)
  paused     A's flood (no rate limit) enqueued before B's jobs, the pair (A, kind) paused
             (`jobpool pause`): a_done must stay 0
alone and paused also report claim_buffers: the buffers one claim touches before the run
(EXPLAIN ANALYZE, BUFFERS), which the load of the machine does not change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import jobpool
from jobpool.db.migrate import migrate
from jobpool.db.queries import Many, One
from jobpool.db.store import claim_parameters, register_kinds
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.job import Job
from jobpool.pauses import pause
from jobpool.registry import REGISTRY
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker
from jobpool.worker.token_store import TokenStore

KIND = "bench_rl_job"
SCENARIOS = ("alone", "flooded", "no-exclude", "paused")
DONE: dict[str, int] = {}

CLAIM_JOBS = Many("claim_jobs")
CLAIM_SESSION = One("claim_session")


@jobpool.kind(KIND)
async def handler(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    DONE[str(job.tenant_id)] = DONE.get(str(job.tenant_id), 0) + 1


class NoExclusion(TokenStore):
    def throttled(self) -> list[str]:
        return []


async def scenario(dsn: str, name: str, flood: int, jobs: int, slots: int) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE mdm.aa_job, mdm.aa_audit_log")
        await conn.execute("DELETE FROM mdm.aa_pause")
        await conn.execute("DELETE FROM mdm.aa_tenant WHERE key IN ('a', 'b')")
        rows = {}
        limited = {"rate_limit": {KIND: {"rps": 1, "burst": 1}}}
        for key, meta in (("a", {} if name == "paused" else limited), ("b", {})):
            cur = await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES (%s, %s)"
                                     " RETURNING id", (key, json.dumps(meta)))
            row = await cur.fetchone()
            assert row is not None
            rows[key] = uuid.UUID(str(row[0]))
        await register_kinds(conn, [REGISTRY.get(KIND)])
        if name != "alone":
            for start in range(0, flood, 5000):
                await enqueue_many(conn, [NewJob(rows["a"], KIND)] * min(5000, flood - start))
        if name == "paused":
            await pause(conn, tenant="a", kind=KIND, actor="bench")
        await conn.execute("SELECT pg_sleep(0.01)")  # B's jobs come strictly after the flood
        await enqueue_many(conn, [NewJob(rows["b"], KIND)] * jobs)
        await conn.execute("ANALYZE mdm.aa_job")
    buffers = await claim_buffers(dsn) if name in ("alone", "paused") else None
    DONE.clear()
    limiter = NoExclusion() if name == "no-exclude" else None
    worker = Worker(dsn, REGISTRY, WorkerConfig(kinds=(KIND,), slots=slots, poll_interval=0.5),
                    actor="bench", limiter=limiter)
    task = asyncio.create_task(worker.run())
    started = time.monotonic()
    while DONE.get(str(rows["b"]), 0) < jobs and time.monotonic() - started < 600:
        await asyncio.sleep(0.02)
    elapsed = time.monotonic() - started
    worker.stop()
    await task
    hits = worker.metrics.registry.get_sample_value(
        "mdm_jobs_rate_limit_hits_total", {"tenant": "a", "kind": KIND, "limit": "tenant"}) or 0
    return {"scenario": name, "b_jobs": DONE.get(str(rows["b"]), 0), "seconds": round(elapsed, 2),
            "b_jobs_per_s": round(DONE.get(str(rows["b"]), 0) / elapsed, 1),
            "a_done": DONE.get(str(rows["a"]), 0), "a_requeues": int(hits),
            **({} if buffers is None else {"claim_buffers": buffers})}


async def claim_buffers(dsn: str) -> int:
    """Buffers (shared, hit or read) one claim of 4 jobs touches before the run, as EXPLAIN
    (ANALYZE, BUFFERS) counts them, in a transaction rolled back: what B's claim pays for A's
    backlog, independent of the machine's load."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(CLAIM_SESSION.text)
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_JOBS.text,
            claim_parameters(kinds=[KIND], tenants=None, limit=4, worker_id="bench", lease=30))
        row = await cur.fetchone()
        await conn.rollback()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1/postgres")
    parser.add_argument("--flood", type=int, default=20000)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated, of " + ", ".join(SCENARIOS))
    args = parser.parse_args()
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: use {', '.join(SCENARIOS)}")
    name = f"jobpool_bench_rl_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(**{**conninfo_to_dict(args.dsn), "dbname": name})
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await migrate(conn)
        for which in chosen:
            print(json.dumps(await scenario(dsn, which, args.flood, args.jobs, args.slots)),
                  flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                          .format(sql.Identifier(name)))


if __name__ == "__main__":
    asyncio.run(main())
