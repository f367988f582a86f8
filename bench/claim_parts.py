"""What each part of the fair-turn claim costs a queue of one tenant: the claim statement as
shipped, the same without one part at a time, and a plain claim.

    python3 bench/claim_parts.py --limit 512 --rounds 40   # with jobpool installed

On a throw-away migrated database of the benchmark server (`common.server_dsn`: a private
cluster with PostgreSQL's defaults unless JOBPOOL_BENCH_DSN is set), `--jobs` pending jobs of
one tenant and one kind, whose tenant already has its turn row (as during a drain), on a
connection with the claim connection's settings (`claim_session`). Each round runs every
variant once, in turn, as a prepared statement under the generic plan (as the worker runs
it) claiming `--limit` jobs under `EXPLAIN (ANALYZE, TIMING OFF)` in a transaction that is
rolled back, so every round starts alike. The variants, each made from `claim_jobs`'s text
(ValueError when its shape changed and a part cannot be found):

- `fair`: `claim_jobs` as the worker sends it;
- `no-ranking`: the claimed rows numbered as the locking read returned them, without ranking
  them by priority, turn, the tenant's last turn and age (`next`);
- `no-ordering`: the rows returned as the UPDATE wrote them (in id order), without the join
  that puts them in claim order;
- `no-turns`: without writing the tenants' turns (`served`, `turned`, `first_turns`);
- `no-ranking-ordering-turns`: without all three;
- `plain`: the plain claim: the rows of the kind in ix_aa_job_lane order, LIMIT, FOR NO KEY
  UPDATE SKIP LOCKED, the same UPDATE by primary key and the same columns, no heads, turns,
  caps or pauses. A measuring device, not a claim to ship: it serves one tenant in the order
  of the index, whatever the others wait for.

Only `fair` is a claim the worker may send: the others drop what the rules ask for (the
order jobs start in, tenants' turns). Prints each variant's execution time per claim and per
job, median (quartiles) over the rounds after the first three, and its difference to `fair`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg

from jobpool.db.migrate import migrate
from jobpool.db.queries import Many, One
from jobpool.db.store import claim_parameters
from jobpool.sql import Query

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchdb import bench_database

WARM_UP = 3
"""Rounds left out of the figures: the first executions of a prepared statement plan it."""

EXPLAIN = "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "

PLAIN_NEXT = """
WITH next AS (
    SELECT id FROM mdm.aa_job
     WHERE status = 'pending' AND job_kind = (%(kinds)s::text[])[1] AND available_at <= now()
     ORDER BY job_kind, tenant_id, priority, available_at, id
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
)
"""
"""The plain claim's locking read; its UPDATE is `claim_jobs`'s own (`plain`)."""
HEADS_COLUMN = "(SELECT count(*) FROM heads) heads"

UNRANKED_NEXT = """next AS (
    SELECT id, row_number() OVER () AS ord FROM locked LIMIT %(limit)s
),
"""
ORDERED_END = "SELECT claimed.* FROM claimed JOIN next USING (id) ORDER BY ord;"


def _between(text: str, start: str, end: str) -> tuple[int, int]:
    """Where the part of `text` from `start` up to `end` lies; ValueError naming the part
    when `claim_jobs` no longer has it."""
    first, last = text.find(start), text.find(end)
    if first < 0 or last < first:
        raise ValueError(f"claim_jobs has no part from {start!r} to {end!r}: its shape changed")
    return first, last


def without_ranking(text: str) -> str:
    first, last = _between(text, "next AS (", "claimed AS (")
    return text[:first] + UNRANKED_NEXT + text[last:]


def without_ordering(text: str) -> str:
    _between(text, ORDERED_END, ORDERED_END)
    return text.replace(ORDERED_END, "SELECT claimed.* FROM claimed;")


def without_turns(text: str) -> str:
    first, last = _between(text, "served AS (", ORDERED_END)
    return text[:first].rstrip().rstrip(",") + "\n" + text[last:]


def plain(text: str) -> str:
    """The plain claim: `PLAIN_NEXT`, then the UPDATE of `claim_jobs` (`text`), its `heads`
    column a constant 1 (it finds no heads)."""
    first, last = _between(text, "claimed AS (", "served AS (")
    update = text[first + len("claimed AS ("):last].rstrip().rstrip(",").rstrip()
    if not update.endswith(")") or HEADS_COLUMN not in update:
        raise ValueError("claim_jobs's UPDATE has no heads column: its shape changed")
    return PLAIN_NEXT + update[:-1].replace(HEADS_COLUMN, "1::bigint heads")


def variants() -> dict[str, str]:
    """Each variant's text (see the module's docstring)."""
    fair = Many("claim_jobs").text
    return {
        "fair": fair,
        "no-ranking": without_ranking(fair),
        "no-ordering": without_ordering(fair),
        "no-turns": without_turns(fair),
        "no-ranking-ordering-turns": without_ordering(without_turns(without_ranking(fair))),
        "plain": plain(fair),
    }


def as_query(name: str, text: str) -> Many:
    """A handle on `text`, a variant of `claim_jobs` that no `.sql` file holds (made without
    the constructor, which looks the name up there), for its `prepared` statement."""
    handle = Many.__new__(Many)
    handle.query = Query(name=f"bench_claim_{name}", shape="many", doc="",
                         text=text)  # type: ignore[arg-type]
    return handle


def execution_ms(conn: psycopg.Connection[Any], execute: psycopg.sql.Composed) -> float:
    """Run the prepared claim under EXPLAIN ANALYZE in a transaction rolled back; its ms."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(psycopg.sql.SQL(EXPLAIN) + execute).fetchone()
    assert row is not None
    return float(row[0][0]["Execution Time"])


def measure(dsn: str, jobs: int, limit: int, rounds: int) -> dict[str, list[float]]:
    asyncio.run(_migrated(dsn))
    params = claim_parameters(kinds=["bench_claim"], tenants=None, limit=limit,
                              worker_id="bench", lease=60.0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(One("claim_session").text)
        tenant = conn.execute(
            "INSERT INTO mdm.aa_tenant (key) VALUES ('bench') RETURNING id").fetchone()
        assert tenant is not None
        conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('bench_claim')")
        conn.execute("INSERT INTO mdm.aa_tenant_turn (tenant_id, turn_at) VALUES (%s, now())",
                     (tenant[0],))
        conn.execute("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts) "
                     "SELECT %s, 'bench_claim', '{\"n\": 1}', 5 FROM generate_series(1, %s)",
                     (tenant[0], jobs))
        conn.execute("VACUUM ANALYZE mdm.aa_job")
        executes = {}
        for index, (name, text) in enumerate(variants().items()):
            prepare, executes[name] = as_query(name, text).prepared(f"claim_{index}", params)
            conn.execute(prepare)
        times: dict[str, list[float]] = {name: [] for name in executes}
        for round_ in range(rounds + WARM_UP):
            for name, execute in executes.items():
                took = execution_ms(conn, execute)
                if round_ >= WARM_UP:
                    times[name].append(took)
    return times


async def _migrated(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrate(conn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000, help="pending jobs (default 50,000)")
    ap.add_argument("--limit", type=int, default=512, help="jobs per claim (default 512)")
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    if not 0 < args.limit <= args.jobs or args.rounds < 3:
        ap.error("need 0 < --limit <= --jobs and --rounds >= 3")
    with bench_database() as dsn:
        times = measure(dsn, args.jobs, args.limit, args.rounds)
    fair = statistics.median(times["fair"])
    print(f"a claim of {args.limit} of {args.jobs:,} pending jobs of one tenant, {args.rounds} "
          "rounds: execution ms per claim, median (quartiles); µs per job; difference to fair")
    for name, values in times.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(f"  {name:<26} {median:6.3f} ({q1:.3f}-{q3:.3f})  {median * 1000 / args.limit:5.2f}"
              f"  {median - fair:+.3f} ms")


if __name__ == "__main__":
    main()
