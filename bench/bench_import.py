"""Rows per second of bulk_import: stage a CSV of N customers, run one worker until done.

    .venv/bin/python bench/bench_import.py [--rows 100000] [--batch-size 1000] [--bad-every 0]
        [--extra-columns 0]

`--extra-columns N` adds N columns that are no attribute (imported with unknown keys ignored):
a wide file, up to the header limit of 2,000 columns.

Uses the server of JOBPOOL_BENCH_DSN, else a private cluster the run starts (bench/common.py
`server_dsn`), and a throw-away database on it. Prints one line per phase; not asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).parent))
from _benchdb import bench_database

from jobpool.db.migrate import migrate
from jobpool.kinds.imports.staging import read_file, stage_import
from jobpool.registry import load_kind_modules
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

ATTRIBUTES = [("name", "string", True, True), ("age", "integer", False, False),
              ("birthday", "date", False, False), ("active", "boolean", False, False),
              ("seen", "timestamp", False, False)]


def write_csv(path: Path, rows: int, bad_every: int, extra_columns: int) -> None:
    extra_names = "".join(f",extra_{c}" for c in range(extra_columns))
    extra_values = ",x" * extra_columns
    with path.open("w", encoding="utf-8") as out:
        out.write(f"external_key,name,age,birthday,active,seen{extra_names}\n")
        for i in range(1, rows + 1):
            age = "not-a-number" if bad_every and i % bad_every == 0 else str(20 + i % 60)
            out.write(f"k{i},Customer {i},{age},1990-{1 + i % 12:02d}-{1 + i % 28:02d},"
                      f"{'true' if i % 2 else 'false'},2024-01-01T12:00:00+01:00"
                      f"{extra_values}\n")


async def run(rows: int, batch_size: int, bad_every: int, extra_columns: int) -> None:
    with bench_database() as dsn, tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "customers.csv"
        write_csv(path, rows, bad_every, extra_columns)
        async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
            await migrate(conn)
            cur = await conn.execute(
                "INSERT INTO mdm.aa_tenant (key) VALUES ('bench') RETURNING id")
            tenant = (await cur.fetchone() or {})["id"]
            cur = await conn.execute("INSERT INTO mdm.ddm_entity_type (tenant_id, type_key)"
                                     " VALUES (%s, 'customer') RETURNING id", (tenant,))
            type_id = (await cur.fetchone() or {})["id"]
            for key, data_type, required, searchable in ATTRIBUTES:
                await conn.execute(
                    "INSERT INTO mdm.ddm_entity_type_attribute (entity_type_id, attr_key,"
                    " data_type, required, searchable) VALUES (%s, %s, %s, %s, %s)",
                    (type_id, key, data_type, required, searchable))
            await conn.execute("DELETE FROM mdm.aa_job")  # the reindex the trigger enqueued
            started = time.perf_counter()
            async with conn.transaction():
                staged = await stage_import(conn, read_file(path, "csv"), tenant_id=tenant,
                                            type_key="customer", source_name=path.name,
                                            fmt="csv", batch_size=batch_size,
                                            unknown_keys="ignore" if extra_columns else "reject")
            staging = time.perf_counter() - started
            print(f"staging: {staged.rows} rows in {staging:.2f}s "
                  f"= {staged.rows / staging:,.0f} rows/s")
            started = time.perf_counter()
            await Worker(dsn, load_kind_modules(),
                         WorkerConfig(kinds=("bulk_import",), until_empty=True),
                         actor="bench").run()
            importing = time.perf_counter() - started
            cur = await conn.execute("SELECT status::text, result FROM mdm.aa_job")
            job = await cur.fetchone() or {}
            print(f"bulk_import (batch {batch_size}): {rows} rows in {importing:.2f}s "
                  f"= {rows / importing:,.0f} rows/s; status {job.get('status')}, "
                  f"result {job.get('result')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--bad-every", type=int, default=0, help="every Nth row invalid")
    parser.add_argument("--extra-columns", type=int, default=0,
                        help="columns that are no attribute (ignored on import)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args.rows, args.batch_size, args.bad_every, args.extra_columns))


if __name__ == "__main__":
    main()
