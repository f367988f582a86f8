"""What the job table's checks on job times cost each single-row write of a job: the range
tests of migration 0019 against the calls of `mdm.jobpool_time_in_range` they replaced.

    python3 bench/check_cost.py --rows 3000 --rounds 4   # with jobpool installed

PostgreSQL prepares a table's CHECK expressions anew for every statement that writes to it,
and inlines a call of a SQL function by parsing the function's body each time. On two
throw-away migrated databases of the benchmark server (`common.server_dsn`: a private
cluster with PostgreSQL's defaults unless JOBPOOL_BENCH_DSN is set), one with the five time
checks as migrated and one with them put back as function calls, one connection each runs,
the variants alternating, `--rounds` times:

- `enqueue`: `--rows` single-row INSERTs into `mdm.aa_job` (prepared, autocommit,
  `synchronous_commit` off for the session, so that the WAL flush does not blur the CPU);
- `done`: `--rows` calls of `mdm.aa_job_done` (a writing job's `done`: the job's UPDATE and
  its audit row) in one transaction, rolled back, so every round finds the jobs running.

Prints the server backend's CPU per row (from /proc, NaN for a server of another host),
median (range) over the rounds.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from jobpool.db.migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchdb import bench_database
from common import per_round_arguments, process_cpu
from table import spread

TIME_COLUMNS = ("available_at", "created_at", "claimed_at", "heartbeat_at", "completed_at")
FUNCTION_CHECKS = "ALTER TABLE mdm.aa_job " + ", ".join(
    f"DROP CONSTRAINT aa_job_{c}_in_range, ADD CONSTRAINT aa_job_{c}_in_range"
    f" CHECK (mdm.jobpool_time_in_range({c})) NOT VALID" for c in TIME_COLUMNS)
"""The five checks as they were before migration 0019 (NOT VALID: the rows are not read)."""
ENQUEUE = ("INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, payload)"
           " VALUES (%s, 'cleanup_jobs', 3, '{}')")
DONE = "SELECT mdm.aa_job_done(%s, 1, 'w', 'bench', NULL, false)"

Conn = psycopg.Connection[Any]


async def _migrate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn)


def prepare(dsn: str, rows: int, function_checks: bool) -> tuple[Conn, Any, list[int]]:
    """A connection to a migrated database with a tenant and `rows` running jobs: (connection,
    tenant id, job ids)."""
    asyncio.run(_migrate(dsn))
    conn = psycopg.connect(dsn, autocommit=True)
    if function_checks:
        conn.execute(FUNCTION_CHECKS)
    conn.execute("SET synchronous_commit = off")
    row = conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('bench') RETURNING id"
                       ).fetchone()
    assert row is not None
    tenant = row[0]
    ids = [row[0] for row in conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, status, attempts,"
        " claimed_by, claimed_at) SELECT %s, 'cleanup_jobs', 3, 'running', 1, 'w', now()"
        " FROM generate_series(1, %s) RETURNING id", (tenant, rows)).fetchall()]
    conn.execute("VACUUM ANALYZE mdm.aa_job")
    return conn, tenant, ids


def per_row(conn: Conn, work: Callable[[], None], rows: int) -> float:
    """The server backend's CPU per row (µs) of `work`."""
    before = process_cpu(conn.info.backend_pid)
    work()
    return (process_cpu(conn.info.backend_pid) - before) / rows * 1e6


def enqueue(conn: Conn, tenant: Any, rows: int) -> float:
    def work() -> None:
        for _ in range(rows):
            conn.execute(ENQUEUE, (tenant,), prepare=True)
    return per_row(conn, work, rows)


def done(conn: Conn, ids: list[int]) -> float:
    def work() -> None:
        with conn.transaction(force_rollback=True):
            for job in ids:
                conn.execute(DONE, (job,), prepare=True)
    return per_row(conn, work, len(ids))


def main() -> None:
    args = per_round_arguments(__doc__.splitlines()[0], count="rows", default=3000,
                               what="rows per measure and round", rounds=4)
    variants = {"range tests (0019)": False, "function calls (before)": True}
    figures: dict[str, dict[str, list[float]]] = {
        name: {"enqueue": [], "done": []} for name in variants}
    with bench_database() as ranges_dsn, bench_database() as functions_dsn:
        conns = {name: prepare(dsn, args.rows, function_checks) for (name, function_checks),
                 dsn in zip(variants.items(), (ranges_dsn, functions_dsn), strict=True)}
        try:
            for _ in range(args.rounds):
                for name, (conn, tenant, ids) in conns.items():
                    figures[name]["enqueue"].append(enqueue(conn, tenant, args.rows))
                    figures[name]["done"].append(done(conn, ids))
        finally:
            for conn, _, _ in conns.values():
                conn.close()
    print(f"{args.rows} rows per measure and round, {args.rounds} rounds: the server "
          "backend's CPU per row (µs), median (range)")
    print(f"  {'checks':<25} {'single-row enqueue':<22} mdm.aa_job_done")
    for name, measures in figures.items():
        print(f"  {name:<25} {spread(measures['enqueue']):<22} {spread(measures['done'])}")


if __name__ == "__main__":
    main()
