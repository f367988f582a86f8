"""What the session reset after a writing job costs, and what the ways of saving its
transaction or its round trips would cost instead, per job.

    python3 bench/reset_cost.py --jobs 3000 --rounds 5   # with jobpool installed

A job whose handler wrote ends with one query, its `done`, the session reset and its COMMIT
(`jobpool.db.connect.end_job`), one transaction. Until the reset moved before the COMMIT it
ran after it, a transaction of its own, the second of every writing job in
`pg_stat_database` (`after-commit`). On a throw-away migrated database
of the benchmark server (`common.server_dsn`: a private cluster with PostgreSQL's defaults
unless JOBPOOL_BENCH_DSN is set), one connection runs `--jobs` job-shaped transactions per
variant (the handler's INSERT sent with the BEGIN in one round trip, as a worker's slot
connection sends it; an UPDATE of one row by key standing in for the `done`; then the
variant's end), the variants alternating, `--rounds` times:

- `one-query`: what a worker sends (`jobpool.db.connect.job_end_query`): the deferred
  constraints checked, the `done` (the same UPDATE in a PL/pgSQL function, as
  `mdm.aa_job_done` runs it), the reset (`mdm.aa_reset_session()`) and COMMIT in one query;
- `after-commit`: what a worker sent before: the `done`, COMMIT, then the reset
  (`COMMIT_AND_RESET`), two transactions per job;
- `done-apart`: the `done` a round trip of its own (a prepared statement), then COMMIT and
  the reset in one query;
- `text-reset`: the same, the reset as the statements `mdm.aa_reset_session` runs, sent as
  text (`RESET_STATEMENTS`);
- `before-commit`: those statements before the COMMIT, as text, one transaction per job;
- `carried`: the reset carried into the next job's BEGIN (one simple query: `BEGIN ... READ
  WRITE` and the reset), the handler's INSERT in a round trip of its own, the
  prepared-statement check and `UNLISTEN *` before the COMMIT;
- `carried-pipeline`: the same reset sent in the pipeline of the BEGIN and the INSERT, one
  statement at a time (a pipeline takes no multi-statement query);
- `carried-do`: the same, the reset as one DO block.

Prints, per job, medians over the rounds (with their range): the client's CPU (this
process), the server backend's CPU (from /proc, NaN for a server of another host), wall
time and SQL transactions (`pg_stat_database`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from jobpool.db.connect import RESET_BEFORE_COMMIT, RESET_SESSION, job_end_query
from jobpool.db.migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchdb import bench_database
from common import per_round_arguments, process_cpu
from table import print_variants

BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""A worker's job transaction starts so (`jobpool.db.store.OWN_ISOLATION`)."""
CARRIED_BEGIN = BEGIN + " READ WRITE"
"""A carried reset's BEGIN: a handler's `SET default_transaction_read_only` would otherwise
make the next job's transaction read-only before the reset undoes it."""
INSERT = "INSERT INTO bench_reset_rows (n) VALUES (%s)"
DONE = "UPDATE bench_reset_done SET n = n + 1 WHERE id = %s"
DONE_FUNCTION = """CREATE FUNCTION bench_done(row_id int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE bench_reset_done SET n = n + 1 WHERE id = row_id;
    RETURN FOUND;
END $$"""
"""`DONE` as `mdm.aa_job_done` runs it: inside a PL/pgSQL function, its plan cached."""
DONE_ROWS = 10_000
COMMIT_AND_RESET = "COMMIT;\n" + RESET_SESSION.text
"""A writing job's end after its `done` until the reset moved before the COMMIT."""

RESET_STATEMENTS = ["SET SESSION AUTHORIZATION DEFAULT", "RESET ALL", "UNLISTEN *",
                    "CLOSE ALL", "SELECT pg_advisory_unlock_all()", "DISCARD TEMP",
                    "DISCARD SEQUENCES"]
"""What the worker's reset undoes (`jobpool.db.connect.RESET_SESSION`, and
`mdm.aa_reset_session`), statement by statement, as a text reset would send them."""
PREPARED_CHECK = ("SELECT pg_catalog.count(*) FILTER (WHERE NOT from_sql) AS prepared, "
                  "pg_catalog.array_agg(name) FILTER (WHERE from_sql) AS handler_made "
                  "FROM pg_catalog.pg_prepared_statements")
"""What `mdm.aa_reset_session` returns, as a statement of its own."""


def split_reset() -> tuple[list[str], str]:
    """The text reset: the statements that undo what a handler left, and the read of what
    is left of the prepared statements."""
    return list(RESET_STATEMENTS), PREPARED_CHECK


def do_block(undo: list[str]) -> str:
    """`undo` as one DO block (PL/pgSQL runs CLOSE and a SELECT only through EXECUTE and
    PERFORM)."""
    body = []
    for statement in undo:
        if statement.upper().startswith("SELECT "):
            body.append("PERFORM " + statement[len("SELECT "):] + ";")
        elif statement.upper().startswith("CLOSE "):
            body.append(f"EXECUTE '{statement}';")
        else:
            body.append(statement + ";")
    return "DO $reset$BEGIN " + " ".join(body) + " END$reset$"


def variants(undo: list[str], check: str) -> dict[str, Callable[[psycopg.Connection[Any], int],
                                                                None]]:
    """Each variant's job, as a function of the connection and the job's number."""
    carried_simple = ";\n".join([CARRIED_BEGIN, *undo])
    check_and_commit = check + ";\nUNLISTEN *;\nCOMMIT"
    do = do_block(undo)

    def drain(cur: psycopg.Cursor[Any]) -> None:
        while cur.nextset():
            pass

    def begin_with_insert(conn: psycopg.Connection[Any], i: int, reset: list[str],
                          begin: str = BEGIN) -> None:
        with conn.pipeline():
            conn.execute(begin)
            for statement in reset:
                conn.execute(statement, prepare=False)
            conn.execute(INSERT, (i,))

    def one_query(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, [])
        drain(conn.execute(job_end_query(f"SELECT bench_done({i % DONE_ROWS});".encode()),
                           prepare=False))

    def after_commit(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, [])
        drain(conn.execute(f"SELECT bench_done({i % DONE_ROWS});\n{COMMIT_AND_RESET}",
                           prepare=False))

    def done_apart(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, [])
        conn.execute(DONE, (i % DONE_ROWS,))
        drain(conn.execute(RESET_BEFORE_COMMIT.text + "\nCOMMIT", prepare=False))

    def text_reset(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, [])
        conn.execute(DONE, (i % DONE_ROWS,))
        drain(conn.execute(";\n".join(["COMMIT", *undo, check]), prepare=False))

    def before_commit(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, [])
        conn.execute(DONE, (i % DONE_ROWS,))
        drain(conn.execute(";\n".join([*undo, check, "COMMIT"]), prepare=False))

    def carried(conn: psycopg.Connection[Any], i: int) -> None:
        drain(conn.execute(carried_simple, prepare=False))
        conn.execute(INSERT, (i,))
        conn.execute(DONE, (i % DONE_ROWS,))
        drain(conn.execute(check_and_commit, prepare=False))

    def carried_pipeline(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, undo, CARRIED_BEGIN)
        conn.execute(DONE, (i % DONE_ROWS,))
        drain(conn.execute(check_and_commit, prepare=False))

    def carried_do(conn: psycopg.Connection[Any], i: int) -> None:
        begin_with_insert(conn, i, [do], CARRIED_BEGIN)
        conn.execute(DONE, (i % DONE_ROWS,))
        drain(conn.execute(check_and_commit, prepare=False))

    return {"one-query": one_query, "after-commit": after_commit, "done-apart": done_apart,
            "text-reset": text_reset, "before-commit": before_commit, "carried": carried,
            "carried-pipeline": carried_pipeline, "carried-do": carried_do}


async def migrate_database(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrate(conn)


def transactions(conn: psycopg.Connection[Any]) -> int:
    """The database's committed and rolled-back transactions so far, this session's pending
    counts flushed first (`pg_stat_force_next_flush`, PostgreSQL 15 and later)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                       "WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def measure(conn: psycopg.Connection[Any], job: Callable[[psycopg.Connection[Any], int], None],
            jobs: int) -> tuple[float, float, float, float]:
    """Per job of `jobs` runs of `job`: client CPU, server backend CPU and wall time (µs),
    and SQL transactions."""
    pid = conn.info.backend_pid
    before = transactions(conn)
    client, server, wall = time.process_time(), process_cpu(pid), time.perf_counter()
    for i in range(jobs):
        job(conn, i)
    client = time.process_time() - client
    server = process_cpu(pid) - server
    wall = time.perf_counter() - wall
    # the three statements of `transactions` above ran in transactions of their own
    xacts = transactions(conn) - before - 3
    return client / jobs * 1e6, server / jobs * 1e6, wall / jobs * 1e6, xacts / jobs


def main() -> None:
    args = per_round_arguments(__doc__.splitlines()[0], count="jobs", default=3000,
                               what="jobs per variant and round", rounds=5)
    undo, check = split_reset()
    jobs = variants(undo, check)
    figures: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in jobs}
    with bench_database() as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        asyncio.run(migrate_database(dsn))  # mdm.aa_reset_session, which the reset calls
        conn.execute(DONE_FUNCTION)
        conn.execute("CREATE TABLE bench_reset_rows (id bigserial PRIMARY KEY, n int)")
        conn.execute("CREATE TABLE bench_reset_done (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO bench_reset_done SELECT g, 0 FROM generate_series(0, %s) g",
                     (DONE_ROWS - 1,))
        conn.set_autocommit(False)
        conn.commit()
        for job in jobs.values():  # warm-up: plans, caches
            job(conn, 0)
        conn.set_autocommit(True)
        for _ in range(args.rounds):
            for name, job in jobs.items():
                figures[name].append(measure(conn, job, args.jobs))
    print(f"{args.jobs} writing jobs per variant and round, {args.rounds} rounds, one "
          "connection: per job, median (range)")
    print_variants(["client CPU µs", "server CPU µs", "wall µs", "transactions"], figures)


if __name__ == "__main__":
    main()
