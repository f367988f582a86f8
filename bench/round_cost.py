"""Where the server's time goes in one claim round: the claim (`claim_jobs`) and the batch
`done` (`complete_jobs`), per job.

    python3 bench/round_cost.py --batch 100 --running 132 --rounds 30   # with jobpool installed

On a throw-away migrated database of the benchmark server (`common.server_dsn`: a private
cluster with PostgreSQL's defaults unless JOBPOOL_BENCH_DSN is set), one tenant and one kind,
on a connection with the claim connection's settings (`claim_session`: no JIT, index scans),
each round claims `--running` jobs for one worker with `claim_jobs` under EXPLAIN (ANALYZE,
BUFFERS) (as a worker holds its slots plus its prefetch), runs `complete_jobs` for the first
`--batch` of them the same way in a transaction that is rolled back, and marks the claimed
jobs done by hand before the next round, so every round starts alike. Prints, per job and as
medians over the rounds after the first five (with their range), the execution time and the
shared buffers of each statement and of its parts: the claim's update of the jobs to
`running`; the `done`'s locking read of the jobs, its UPDATE to `done`
(without that read, which runs inside it) and its audit INSERT. Each statement runs as a
prepared statement under the claim connection's generic plan, as the worker runs it (a
plain EXPLAIN would plan it for the values given); EXPLAIN times every node, so compare the
parts with each other, not with a drain's rate. `--drop-index` drops indexes
first, to tell what each one costs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from jobpool.db.migrate import migrate
from jobpool.db.queries import Many, NamedQuery, One
from jobpool.db.store import claim_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchdb import bench_database

EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
FINISH_BY_HAND = """
UPDATE mdm.aa_job SET status = 'done', completed_at = now()
 WHERE status = 'running' AND claimed_by = 'bench'"""
DONE_PARTS = {"lock": "LockRows", "update": "Update", "audit": "Insert"}
"""Each part's plan node: its `Node Type`, or for a ModifyTable its `Operation`."""


async def migrated(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrate(conn)


def find_node(plan: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The first node of `plan` (depth first) whose `Node Type` or `Operation` is `kind`."""
    if kind in (plan["Node Type"], plan.get("Operation")):
        return plan
    for child in plan.get("Plans", ()):
        if (found := find_node(child, kind)) is not None:
            return found
    return None


def node_time(plan: dict[str, Any], kind: str) -> tuple[float, int]:
    """(total ms over all its loops, shared buffers hit or read) of the first `kind` node of
    `plan` (a lock taken row by row inside a nested loop runs once per row); raises
    ValueError naming `kind` when the plan has none (a statement whose shape changed)."""
    node = find_node(plan, kind)
    if node is None:
        raise ValueError(f"the plan has no {kind} node")
    return node["Actual Total Time"] * node.get("Actual Loops", 1), buffers(node)


def buffers(node: dict[str, Any]) -> int:
    """The shared buffers a plan node hit or read (its children's included)."""
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def explained(conn: psycopg.Connection[Any], query: NamedQuery, params: dict[str, Any]) -> Any:
    """EXPLAIN ANALYZE `query` (which runs it) as the worker runs it: a prepared statement
    under the claim connection's `plan_cache_mode` (the generic plan, planned without the
    values, where a plain EXPLAIN would plan for them); its plan, as EXPLAIN's JSON gives it."""
    prepare, execute = query.prepared("bench_stmt", params)
    conn.execute(prepare)
    try:
        row = conn.execute(sql.SQL(EXPLAIN) + execute).fetchone()
    finally:
        conn.execute("DEALLOCATE bench_stmt")
    assert row is not None
    return row[0][0]


def one_round(conn: psycopg.Connection[Any], batch: int,
              running: int) -> dict[str, tuple[float, int]]:
    """Claim `running` jobs, then the `done` of `batch` of them (rolled back), both under
    EXPLAIN ANALYZE; the figures of both, in ms and buffers for the whole batch."""
    claim = explained(conn, Many("claim_jobs"), claim_parameters(
        kinds=["reindex"], tenants=None, limit=running, worker_id="bench", lease=60.0))
    ids = [row[0] for row in conn.execute(
        "SELECT id FROM mdm.aa_job WHERE status = 'running' AND claimed_by = 'bench' "
        "ORDER BY id").fetchall()]
    if len(ids) != running:
        raise RuntimeError(f"the claim took {len(ids)} jobs, not {running}")
    params = {"ids": ids[:batch], "attempts": [1] * batch, "results": [None] * batch,
              "worker_id": "bench", "actor": "bench"}
    with conn.transaction(force_rollback=True):
        done = explained(conn, Many("complete_jobs"), params)
    conn.execute(FINISH_BY_HAND)
    parts = {f"done {name}": node_time(done["Plan"], kind) for name, kind in DONE_PARTS.items()}
    (lock, lock_buffers), (update, update_buffers) = parts["done lock"], parts["done update"]
    parts["done update"] = (update - lock, update_buffers - lock_buffers)  # the lock is inside
    claimed = node_time(claim["Plan"], "Update")
    return {"claim": (claim["Execution Time"], buffers(claim["Plan"])),
            "claim update": claimed,
            "done": (done["Execution Time"], sum(b for _, b in parts.values())), **parts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=100, help="jobs per `done` (default 100)")
    ap.add_argument("--running", type=int, default=132,
                    help="jobs the worker holds running when it sends the `done` (default 132)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=200_000, help="pending jobs in the table")
    ap.add_argument("--drop-index", action="append", default=[], metavar="NAME",
                    help="drop this index of mdm (say ix_aa_job_done) first, to see its cost")
    args = ap.parse_args()
    if not 0 < args.batch <= args.running or args.rounds <= 5:
        ap.error("need 0 < --batch <= --running and --rounds > 5")
    if args.jobs < args.running * args.rounds:
        ap.error(f"--jobs {args.jobs} is fewer than --running x --rounds "
                 f"({args.running * args.rounds}): each round claims jobs of its own")
    with bench_database() as dsn:
        asyncio.run(migrated(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(One("claim_session").text)
            tenant = conn.execute(
                "INSERT INTO mdm.aa_tenant (key) VALUES ('bench') RETURNING id").fetchone()
            assert tenant is not None
            conn.execute("INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts) "
                         "SELECT %s, 'reindex', 5 FROM generate_series(1, %s)",
                         (tenant[0], args.jobs))
            for index in args.drop_index:
                conn.execute(sql.SQL("DROP INDEX mdm.{}").format(sql.Identifier(index)))
            conn.execute("VACUUM ANALYZE mdm.aa_job")
            rounds = [one_round(conn, args.batch, args.running) for _ in range(args.rounds)][5:]
    dropped = f", without {', '.join(args.drop_index)}" if args.drop_index else ""
    print(f"a claim of {args.running} jobs and the done of {args.batch} of them{dropped}, "
          f"{len(rounds)} rounds: µs per job, median (range), and buffers per job")
    for part in rounds[0]:
        jobs = args.running if part.startswith("claim") else args.batch
        times = [r[part][0] * 1000 / jobs for r in rounds]
        buffers = statistics.median(r[part][1] for r in rounds) / jobs
        print(f"  {part:<12} {statistics.median(times):6.1f} ({min(times):.1f}-{max(times):.1f})"
              f"  {buffers:5.1f}")

if __name__ == "__main__":
    main()
