"""Where the server's CPU goes in a job whose handler writes one row: each part of what the
worker sends, priced by adding it to the one before, on concurrent connections.

    python3 bench/writing_job_cost.py --jobs 500 --rounds 3   # with jobpool installed

On a throw-away migrated database of the benchmark server (`common.server_dsn`: a private
cluster with PostgreSQL's defaults unless JOBPOOL_BENCH_DSN is set), 16 connections
(`CONNECTIONS`, a worker's slots between its default and best setting) each run `--jobs`
job-shaped transactions per variant, the variants alternating, `--rounds` times. Every
variant writes the handler's row (an INSERT with a parameter into a table with a bigserial
key); the jobs it finishes are running rows of `mdm.aa_job` made for it, claimed by one
worker id:

- `insert-alone`: the row's INSERT committed by itself, what a peer's writing handler sends
  (PgQueuer's and graphile-worker's handlers commit their write apart from the job's
  acknowledgement, which they batch);
- `transaction`: BEGIN sent with the INSERT (one pipeline, as a worker's slot connection
  sends a job's first statement), then COMMIT;
- `done`: the job's `done` before that COMMIT, in one query (`mdm.aa_job_done`: the job row's
  compare-and-set UPDATE and its audit row, `QueueStore.done_statement`);
- `worker`: what a worker sends: the same, with the session reset between the `done` and the
  COMMIT, the handler's deferred constraints checked first (`jobpool.db.connect.job_end_query`),
  in the job's transaction;
- `one-call-end`: what a worker sends, with the `done` and the session reset in one function
  call (`bench_job_end`: the statements of `mdm.aa_job_end` and `mdm.aa_reset_session` as
  one function, made from the migrated ones) instead of two; it prices merging them;
- `lock-done`: not a way the worker takes: the `done` as a row lock with the same
  compare-and-set (`FOR NO KEY UPDATE`) and the audit row, without the UPDATE, no reset; it
  prices a design that leaves the status change to the batched `done` of the next claim.

Prints, per job, medians over the rounds (with their range): the server's CPU (every process
of the server, from /proc: run it on a quiet server; NaN for a server of another host), this
client's CPU, jobs per second, and SQL transactions (`pg_stat_database`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg.generators import execute

from jobpool.db.connect import END_PREAMBLE, job_end_query
from jobpool.db.migrate import migrate
from jobpool.db.store import COMPLETE_JOB_OR_RAISE, escaped_literal

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchdb import bench_database
from common import per_round_arguments, server_cpu, transactions
from table import print_variants

CONNECTIONS = 16
WORKER = "bench-writing-worker"
BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""A worker's job transaction starts so (`jobpool.db.store.OWN_ISOLATION`)."""
INSERT = "INSERT INTO bench_writing_rows (n) VALUES (%s)"
SETUP = [
    "CREATE TABLE bench_writing_rows (id bigserial PRIMARY KEY, n int)",
    "INSERT INTO mdm.aa_tenant (key) VALUES ('bench-writing')",
    "INSERT INTO mdm.aa_job_kind (name) VALUES ('bench_writing')",
    """CREATE FUNCTION bench_lock_done(p_id bigint, p_attempts integer, p_worker_id text,
                                       p_actor text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    done_tenant uuid;
    done_kind text;
BEGIN
    SELECT tenant_id, job_kind INTO done_tenant, done_kind
      FROM mdm.aa_job
     WHERE id = p_id AND status = 'running' AND claimed_by = p_worker_id
       AND attempts = p_attempts
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % is not held', p_id USING ERRCODE = 'JP001';
    END IF;
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    VALUES (p_actor, done_tenant, p_id, 'job_done',
            pg_catalog.jsonb_build_object('kind', done_kind));
    RETURN true;
END $$""",
]
"""The handler's table, the jobs' tenant and kind, and `lock-done`'s function (written as
`mdm.aa_job_done` is, its UPDATE replaced by the row lock)."""
ONE_CALL_END = """CREATE FUNCTION bench_job_end(p_id bigint, p_attempts integer,
                                 p_worker_id text, p_actor text, p_result jsonb)
RETURNS TABLE (prepared integer, handler_made text[]) LANGUAGE plpgsql AS $bench$
{declare}BEGIN{job_end}{reset}END $bench$"""
"""`one-call-end`'s function: the statements of `mdm.aa_job_end`, then those of
`mdm.aa_reset_session` (with its DECLARE), as the migrated database holds them
(`create_one_call_end`)."""
FUNCTION_SOURCES = """SELECT p.proname, p.prosrc FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'mdm' AND p.proname IN ('aa_job_end', 'aa_reset_session')"""
RUNNING_JOBS = """INSERT INTO mdm.aa_job (tenant_id, job_kind, status, claimed_by, claimed_at,
                                          attempts, max_attempts, heartbeat_at, lease_expires_at)
SELECT (SELECT id FROM mdm.aa_tenant WHERE key = 'bench-writing'), 'bench_writing', 'running',
       %s, now(), 1, 5, now(), now() + interval '1 hour'
  FROM generate_series(1, %s)
RETURNING id"""

Job = Callable[[AsyncConnection[Any], int, int], Awaitable[None]]


def done_text(job_id: int) -> bytes:
    """A writing job's `done` as the worker sends it (`QueueStore.done_statement`)."""
    return COMPLETE_JOB_OR_RAISE.text.format(
        id=job_id, attempts=1, worker_id=escaped_literal(WORKER),
        actor=escaped_literal("bench"), result="NULL").encode("ascii")


async def query(conn: AsyncConnection[Any], text: bytes) -> None:
    """Send `text` (statements without parameters) as one simple-protocol query, as the
    worker's `end_job` does; raises on the first failed statement."""
    async with conn.lock:
        conn.pgconn.send_query(text)
        results = await conn.wait(execute(conn.pgconn))
    for result in results:
        if result.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result)


async def begin_with_insert(conn: AsyncConnection[Any], n: int) -> None:
    async with conn.pipeline():
        await conn.execute(BEGIN)
        await conn.execute(INSERT, (n,))


def variants() -> dict[str, Job]:
    """Each variant's job, as a function of the connection, the job's id and a number."""
    async def insert_alone(conn: AsyncConnection[Any], job_id: int, n: int) -> None:
        await conn.execute(INSERT, (n,))

    async def transaction(conn: AsyncConnection[Any], job_id: int, n: int) -> None:
        await begin_with_insert(conn, n)
        await query(conn, b"COMMIT")

    async def done(conn: AsyncConnection[Any], job_id: int, n: int) -> None:
        await begin_with_insert(conn, n)
        await query(conn, done_text(job_id) + b"\nCOMMIT")

    async def worker(conn: AsyncConnection[Any], job_id: int, n: int) -> None:
        await begin_with_insert(conn, n)
        await query(conn, job_end_query(done_text(job_id)))

    async def one_call_end(conn: AsyncConnection[Any], job_id: int, n: int) -> None:
        await begin_with_insert(conn, n)
        await query(conn, END_PREAMBLE + f"SELECT * FROM bench_job_end({job_id}, 1, "
                          f"{escaped_literal(WORKER)}, 'bench', NULL);\nCOMMIT".encode())

    async def lock_done(conn: AsyncConnection[Any], job_id: int, n: int) -> None:
        await begin_with_insert(conn, n)
        await query(conn, f"SELECT bench_lock_done({job_id}, 1, {escaped_literal(WORKER)}, "
                          f"'bench');\nCOMMIT".encode())

    return {"insert-alone": insert_alone, "transaction": transaction, "done": done,
            "worker": worker, "one-call-end": one_call_end, "lock-done": lock_done}


async def measure(dsn: str, job: Job, connections: int, jobs: int
                  ) -> tuple[float, float, float, float]:
    """Per job of `connections` x `jobs` runs of `job`: server and client CPU (µs), jobs/s
    and SQL transactions (`common.transactions`: every connection's counts reach
    `pg_stat_database` when it closes, and the warm-up's when it asks for them after it)."""
    database = conninfo_to_dict(dsn)["dbname"]
    async with await AsyncConnection.connect(dsn, autocommit=True) as admin:
        cur = await admin.execute(RUNNING_JOBS, (WORKER, connections * (jobs + 1)))
        ids = [row[0] for row in await cur.fetchall()]
    conns = [await AsyncConnection.connect(dsn, autocommit=True) for _ in range(connections)]
    try:
        for k, conn in enumerate(conns):  # warm-up: each connection's plans and caches
            await job(conn, ids[connections * jobs + k], 0)
            await conn.execute("SELECT pg_stat_force_next_flush()")

        async def run(k: int) -> None:
            for n in range(jobs):
                await job(conns[k], ids[k * jobs + n], n)

        before = transactions(database, settle=0.2)
        server, client, wall = server_cpu(), time.process_time(), time.perf_counter()
        await asyncio.gather(*(run(k) for k in range(connections)))
        wall = time.perf_counter() - wall
        client = time.process_time() - client
        server = (server_cpu() or float("nan")) - (server or float("nan"))
    finally:
        for conn in conns:
            await conn.close()
    xacts = transactions(database, settle=0.2) - before
    total = connections * jobs
    return server / total * 1e6, client / total * 1e6, total / wall, xacts / total


def plpgsql_block(source: str) -> tuple[str, str]:
    """(its DECLARE section, the statements between BEGIN and END) of a PL/pgSQL body of one
    block; ValueError for another shape."""
    declare, begin, rest = source.partition("BEGIN")
    body, end, _ = rest.rpartition("END")
    if not begin or not end:
        raise ValueError(f"not a PL/pgSQL body of one block: {source!r}")
    return declare, body


async def create_one_call_end(conn: AsyncConnection[Any]) -> None:
    """Create `ONE_CALL_END` from the functions the worker's end calls."""
    cur = await conn.execute(FUNCTION_SOURCES)
    sources = dict(await cur.fetchall())
    _, job_end = plpgsql_block(sources["aa_job_end"])
    declare, reset = plpgsql_block(sources["aa_reset_session"])
    await conn.execute(ONE_CALL_END.format(declare=declare, job_end=job_end,
                                           reset=reset).encode())


async def run_all(dsn: str, connections: int, jobs: int, rounds: int
                  ) -> dict[str, list[tuple[float, float, float, float]]]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn)
        for statement in SETUP:
            await conn.execute(statement)
        await create_one_call_end(conn)
    figures: dict[str, list[tuple[float, float, float, float]]] = {}
    for _ in range(rounds):
        for name, job in variants().items():
            figures.setdefault(name, []).append(await measure(dsn, job, connections, jobs))
    return figures


def main() -> None:
    args = per_round_arguments(__doc__.splitlines()[0], count="jobs", default=500,
                               what="jobs per connection, variant and round", rounds=3)
    with bench_database() as dsn:
        figures = asyncio.run(run_all(dsn, CONNECTIONS, args.jobs, args.rounds))
    print(f"{CONNECTIONS} connections x {args.jobs} writing jobs per variant and round, "
          f"{args.rounds} rounds: per job, median (range)")
    print_variants(["server CPU µs", "client CPU µs", "jobs/s", "transactions"], figures)


if __name__ == "__main__":
    main()
