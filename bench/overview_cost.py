"""What one refresh of the console's overview costs, next to a full count of every job.

    .venv/bin/python bench/overview_cost.py [--dsn postgresql://postgres@127.0.0.1/postgres]
        [--done 1000000] [--pending 50000] [--dlq 1000] [--running 200] [--repeat 5]

Creates a scratch database (named console_overview_cost) on the given server with 20 tenants,
3 kinds and the given numbers of jobs per status, then runs `overview_counts` (what
/v1/overview reads every 5 s per open console) and `job_counts` (/v1/stats: every status,
done included) interleaved, and prints the median, min and max wall time and the shared
buffers each touches. Drops the database at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobpool.db.migrate import migrate
from jobpool.db.queries import Many

MEASURED = (Many("overview_counts"), Many("job_counts"))

DATABASE = "console_overview_cost"


def _dsn(server: str, database: str) -> str:
    params = conninfo_to_dict(server)
    params["dbname"] = database
    return make_conninfo(**params)


def _seed(conn: psycopg.Connection[Any], args: argparse.Namespace) -> None:
    conn.execute("INSERT INTO mdm.aa_tenant (key) SELECT 't' || g FROM generate_series(1, 20) g")
    conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('k1'), ('k2'), ('k3')")
    bounds = [args.done, args.done + args.pending, args.done + args.pending + args.dlq]
    total = bounds[-1] + args.running
    conn.execute(
        """
        WITH tt AS (SELECT id, (row_number() OVER (ORDER BY key) - 1)::int AS n
                      FROM mdm.aa_tenant)
        INSERT INTO mdm.aa_job (tenant_id, job_kind, status, max_attempts, completed_at,
                                claimed_by, claimed_at)
        SELECT tt.id, 'k' || (1 + g %% 3), s.status::mdm.job_status, 5,
               CASE WHEN s.status IN ('done', 'dlq') THEN now() END,
               CASE WHEN s.status = 'running' THEN 'w' END,
               CASE WHEN s.status = 'running' THEN now() END
          FROM generate_series(1, %(total)s) g
          JOIN tt ON tt.n = g %% 20
          CROSS JOIN LATERAL (SELECT CASE WHEN g <= %(b0)s THEN 'done'
                                          WHEN g <= %(b1)s THEN 'pending'
                                          WHEN g <= %(b2)s THEN 'dlq'
                                          ELSE 'running' END AS status) s
        """, {"total": total, "b0": bounds[0], "b1": bounds[1], "b2": bounds[2]})
    conn.execute("VACUUM ANALYZE mdm.aa_job")


def _buffers(conn: psycopg.Connection[Any], query: Many) -> int:
    plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + sql.SQL(query.text),
                        {"tenants": None}).fetchall()
    for (line,) in plan:  # the top node's line comes first: the whole query's buffers
        found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", line)
        if found:
            return int(found[1]) + int(found[2] or 0)
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1/postgres")
    parser.add_argument("--done", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=50_000)
    parser.add_argument("--dlq", type=int, default=1_000)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    dsn = _dsn(args.dsn, DATABASE)
    try:
        asyncio.run(_migrate(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            _seed(conn, args)
            times: dict[Many, list[float]] = {query: [] for query in MEASURED}
            for _ in range(args.repeat):
                for query, runs in times.items():
                    start = time.perf_counter()
                    query.sync(conn, {"tenants": None})
                    runs.append((time.perf_counter() - start) * 1000)
            for query, runs in times.items():
                print(f"{query.name:16} median {statistics.median(runs):8.1f} ms  "
                      f"(min {min(runs):.1f}, max {max(runs):.1f}; {args.repeat} runs)  "
                      f"shared buffers {_buffers(conn, query)}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(DATABASE)))


async def _migrate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrate(conn)


if __name__ == "__main__":
    main()
