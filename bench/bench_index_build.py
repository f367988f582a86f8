"""Online index build time on N entities: index_sync (string, integer, unique) and gin_backfill.

    .venv/bin/python bench/bench_index_build.py [--entities 200000]

Each scenario toggles the flag (the trigger enqueues the job), runs one worker until empty
and prints the job's `ddl_seconds` (the CREATE INDEX CONCURRENTLY alone), the whole job
time, and whether EXPLAIN shows the index serving the canonical query. Uses the server of
JOBPOOL_BENCH_DSN, else a private cluster the run starts (bench/common.py `server_dsn`), and a
throw-away database on it. Not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).parent))
from _benchdb import bench_database

from jobpool.db.migrate import migrate
from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

SCENARIOS = [
    ("index_sync: searchable string (email)",
     "UPDATE mdm.ddm_entity_type_attribute SET searchable = true WHERE attr_key = 'email'"),
    ("index_sync: sortable integer (age)",
     "UPDATE mdm.ddm_entity_type_attribute SET sortable = true WHERE attr_key = 'age'"),
    ("index_sync: unique string (code)",
     "UPDATE mdm.ddm_entity_type_attribute SET sortable = true, is_unique = true"
     " WHERE attr_key = 'code'"),
    ("gin_backfill: attributes jsonb_path_ops",
     "UPDATE mdm.ddm_entity_type SET is_external_source_target = true"),
]


async def run(entities: int) -> None:
    with bench_database() as dsn:
        async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, row_factory=dict_row
        ) as conn:
            await migrate(conn)
            await conn.set_autocommit(True)
            cur = await conn.execute(
                "INSERT INTO mdm.aa_tenant (key) VALUES ('bench') RETURNING id")
            tenant = (await cur.fetchone() or {})["id"]
            cur = await conn.execute("INSERT INTO mdm.ddm_entity_type (tenant_id, type_key)"
                                     " VALUES (%s, 'customer') RETURNING id", (tenant,))
            type_id = (await cur.fetchone() or {})["id"]
            for key, data_type in (("email", "string"), ("age", "integer"), ("code", "string")):
                await conn.execute(
                    "INSERT INTO mdm.ddm_entity_type_attribute (entity_type_id, attr_key,"
                    " data_type) VALUES (%s, %s, %s)", (type_id, key, data_type))
            started = time.perf_counter()
            await conn.execute(
                "INSERT INTO mdm.ddm_entity (tenant_id, entity_type_id, external_key, attributes)"
                " SELECT %s, %s, 'k' || g, jsonb_build_object('email', 'user' || g ||"
                " '@example.com', 'age', g %% 90, 'code', 'C' || g, 'source', 'crm')"
                " FROM generate_series(1, %s) AS g", (tenant, type_id, entities))
            await conn.execute("VACUUM ANALYZE mdm.ddm_entity")
            print(f"loaded {entities} entities in {time.perf_counter() - started:.1f}s")
            for label, toggle in SCENARIOS:
                await conn.execute(toggle)
                started = time.perf_counter()
                await Worker(dsn, load_kind_modules(),
                             WorkerConfig(kinds=("index_sync", "gin_backfill"), until_empty=True),
                             actor="bench").run()
                total = time.perf_counter() - started
                cur = await conn.execute(
                    "SELECT status::text, result, last_error FROM mdm.aa_job"
                    " WHERE job_kind IN ('index_sync', 'gin_backfill') ORDER BY id DESC LIMIT 1")
                job = await cur.fetchone() or {}
                result = job.get("result") or {}
                print(f"{label}: DDL {result.get('ddl_seconds')}s, job {total:.2f}s, "
                      f"status {job.get('status')}, serves canonical queries "
                      f"{result.get('serves_canonical_queries')} "
                      f"{ {k: v['plan'] for k, v in result.get('explain', {}).items()} }"
                      f"{' ' + job['last_error'] if job.get('last_error') else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=200_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args.entities))


if __name__ == "__main__":
    main()
