"""Jobs through a transaction-pooling PgBouncer: attempts burned, DLQ, enqueue-to-start.

    python bench/pooler.py [--jobs 20000] [--rate 400] [--listen-direct]

Starts Debian's pgbouncer (transaction mode, tests/pgbouncer_server.py) in front of the
server of JOBPOOL_BENCH_DSN (a throw-away database on it), runs 2 workers x 8 slots in this
process with JOBPOOL_POOLER=transaction, enqueues `--jobs` jobs at `--rate` jobs/s (half of
them writing a row in the job's transaction, half writing nothing, so their `done` is
batched; both kinds allow one attempt, so a burned attempt shows in the DLQ), then prints
the jobs retried, dead-lettered and the enqueue-to-start (claimed_at - created_at) p50/p99.
`--listen-direct` gives the workers a LISTEN connection straight to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from _benchdb import bench_database
from pgbouncer_server import PgBouncer, find_pgbouncer

import jobpool
from jobpool.db.connect import connect
from jobpool.db.migrate import migrate
from jobpool.job import Job
from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker


@jobpool.kind("bench_pooler_write", max_attempts=1, stale_ttl=3600.0)
async def pooler_write(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    await tx.execute("INSERT INTO bench_pooler_runs (job_id) VALUES (%s)", (job.id,))


@jobpool.kind("bench_pooler_noop", max_attempts=1, stale_ttl=3600.0)
async def pooler_noop(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    return None


KINDS = ("bench_pooler_write", "bench_pooler_noop")


async def main(jobs: int, rate: float, listen_direct: bool) -> None:
    binary = find_pgbouncer()
    if binary is None:
        raise SystemExit("no pgbouncer: apt-get install -y pgbouncer")
    with bench_database() as dsn:
        params = conninfo_to_dict(dsn)
        async with await connect(dsn, autocommit=True) as conn:
            await migrate(conn)
            await conn.execute("CREATE TABLE bench_pooler_runs (job_id bigint NOT NULL)")
            cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('bench') "
                                     "RETURNING id")
            tenant = (await cur.fetchone() or {})["id"]
        bouncer = PgBouncer(binary, server_port=int(params.get("port") or 5432),
                            run_as="postgres" if os.geteuid() == 0 else None)
        bouncer.start()
        try:
            pooled = make_conninfo(bouncer.dsn(params["dbname"]))
            config = WorkerConfig(kinds=KINDS, slots=8, pooler="transaction",
                                  listen_dsn=dsn if listen_direct else None)
            workers = [Worker(pooled, load_kind_modules(), config, actor="bench")
                       for _ in range(2)]
            tasks = [asyncio.create_task(w.run()) for w in workers]
            while not all(w.started for w in workers):
                await asyncio.sleep(0.1)
            started = time.monotonic()
            async with await connect(dsn, autocommit=True) as conn:
                batch = 20
                for sent in range(0, jobs, batch):
                    await jobpool.enqueue_many(conn, [
                        jobpool.NewJob(tenant, KINDS[(sent + i) % 2])
                        for i in range(min(batch, jobs - sent))])
                    lag = started + (sent + batch) / rate - time.monotonic()
                    if lag > 0:
                        await asyncio.sleep(lag)
                while True:
                    cur = await conn.execute("SELECT count(*) FILTER (WHERE status IN "
                                             "('done', 'dlq')) AS n FROM mdm.aa_job "
                                             "WHERE job_kind LIKE 'bench_pooler%%'")
                    if (await cur.fetchone() or {})["n"] >= jobs:
                        break
                    await asyncio.sleep(0.5)
                elapsed = time.monotonic() - started
                cur = await conn.execute("""
                    SELECT count(*) FILTER (WHERE attempts > 1) AS retried,
                           count(*) FILTER (WHERE status = 'dlq') AS dlq,
                           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM
                               claimed_at - created_at)) AS p50,
                           percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM
                               claimed_at - created_at)) AS p99
                      FROM mdm.aa_job WHERE job_kind LIKE 'bench_pooler%%'""")
                row = await cur.fetchone() or {}
                cur = await conn.execute("SELECT count(*) AS n, count(DISTINCT job_id) AS d"
                                         " FROM bench_pooler_runs")
                runs = await cur.fetchone() or {}
            for w in workers:
                w.stop()
            await asyncio.gather(*tasks)
        finally:
            bouncer.remove()
    print(f"{jobs} jobs at {rate:g}/s through PgBouncer (transaction mode), 2 workers x 8 "
          f"slots, {'LISTEN direct' if listen_direct else 'poll-only'}: {elapsed:.1f}s; "
          f"retried {row['retried']}, DLQ {row['dlq']}, writes {runs['n']} "
          f"({runs['d']} distinct); enqueue-to-start p50 {row['p50'] * 1000:.0f} ms, "
          f"p99 {row['p99'] * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--listen-direct", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(args.jobs, args.rate, args.listen_direct))
