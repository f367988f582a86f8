"""What the console's DLQ page costs over large payloads: bytes, time and the API's memory.

    .venv/bin/python bench/dlq_page_size.py [--dsn postgresql://postgres@127.0.0.1/postgres]
        [--jobs 50] [--payload-mb 20] [--repeat 5]

Creates a scratch database (named dlq_page_size) on the given server, puts `--jobs` DLQ jobs
there whose payloads hold `--payload-mb` MB of hex text (random, so that compression cannot
shrink them much) and last errors of 4,000 characters, starts `jobpool api` on it, and asks
`GET /v1/dlq?limit=50` (what the console's DLQ page asks) `--repeat` times, printing the
bytes, the wall time of each and the API process's resident memory before and after. Drops
the database at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import jwt
import psycopg
from common import free_port
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobpool.db.migrate import migrate

DATABASE = "dlq_page_size"
SECRET = "bench-secret-bench-secret-bench-secret!"
AUDIENCE = "jobpool-admin"


async def seed(dsn: str, jobs: int, payload_mb: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn)
        await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme')")
        await conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('big')")
        for _ in range(jobs):
            blob = os.urandom(payload_mb * 1024 * 1024 // 2).hex()
            await conn.execute(
                "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, status, attempts, "
                "max_attempts, completed_at, last_error) SELECT id, 'big', "
                "jsonb_build_object('blob', %s::text), 'dlq', 1, 1, now(), repeat('E', 4000) "
                "FROM mdm.aa_tenant WHERE key = 'acme'", (blob,))


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


async def measure(dsn: str, repeat: int) -> None:
    port = free_port()
    env = {**os.environ, "JOBPOOL_DSN": dsn, "JOBPOOL_API_JWT_SECRET": SECRET,
           "JOBPOOL_API_JWT_AUDIENCE": AUDIENCE}
    api = subprocess.Popen([sys.executable, "-m", "jobpool", "api", "--port", str(port),
                            "--log-level", "warning"], env=env)
    bearer = jwt.encode({"sub": "bench", "aud": AUDIENCE, "exp": int(time.time()) + 3600,
                         "permissions": ["manage_metadata"], "tenants": "*"}, SECRET)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(600):
                try:
                    async with session.get(f"{base}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            before = rss_mb(api.pid)
            for n in range(repeat):
                started = time.perf_counter()
                async with session.get(f"{base}/v1/dlq?limit=50",
                                       headers={"Authorization": f"Bearer {bearer}"}) as response:
                    body = await response.read()
                took = time.perf_counter() - started
                print(f"request {n + 1}: {response.status}, {len(body):,} bytes, "
                      f"{took * 1000:.0f} ms")
            print(f"API resident memory: {before:.0f} MB before, {rss_mb(api.pid):.0f} MB after")
    finally:
        api.terminate()
        api.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1/postgres")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--payload-mb", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    scratch = make_conninfo(args.dsn, dbname=DATABASE)
    admin_dsn = make_conninfo(args.dsn, dbname=conninfo_to_dict(args.dsn).get("dbname",
                                                                              "postgres"))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    try:
        asyncio.run(seed(scratch, args.jobs, args.payload_mb))
        asyncio.run(measure(scratch, args.repeat))
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(DATABASE)))


if __name__ == "__main__":
    main()
