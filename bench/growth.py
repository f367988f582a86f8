"""Growth: claim and pending-count cost with 10k, 100k, 1M pending jobs (50 tenants, 8 kinds).

Run alone: `python3 bench/run.py growth` (or `--growth-sizes 10000,100000`).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from typing import Any

import psycopg
from common import PREFIX, drop_database, recreate_database
from psycopg import sql
from psycopg.rows import dict_row

from jobpool.db.queries import Many, One
from jobpool.db.store import claim_parameters

CLAIM_JOBS = Many("claim_jobs")
CLAIM_SESSION = One("claim_session")
COUNT_LANE_JOBS = Many("count_lane_jobs")
QUEUE_GAUGE_SNAPSHOT = One("queue_gauge_snapshot")


KINDS = [f"bench_k{i}" for i in range(8)]
TENANTS = 50
FILL = """
INSERT INTO mdm.aa_tenant (key) SELECT 'bench-' || t FROM generate_series(1, %(tenants)s) t;
INSERT INTO mdm.aa_job_kind (name) SELECT unnest(%(kinds)s::text[]);
INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at, max_attempts)
SELECT t.id, (%(kinds)s::text[])[1 + g %% 8], '{}'::jsonb, 100,
       now() - make_interval(secs => random() * 3600), 20
  FROM generate_series(1, %(jobs)s) g
  JOIN (SELECT id, row_number() OVER (ORDER BY key) - 1 AS n FROM mdm.aa_tenant
         WHERE key LIKE 'bench-%%') t ON t.n = g %% %(tenants)s;
"""


def _explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any],
             claim: bool = False) -> dict[str, Any]:
    """Execution time (ms) and shared buffers of one EXPLAIN (ANALYZE, BUFFERS), rolled back
    (`claim`: planned as the worker plans its claim)."""
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + sql.SQL(query)
    with conn.transaction(force_rollback=True):
        if claim:
            CLAIM_SESSION.sync(conn)
        lines = [row["QUERY PLAN"] for row in conn.execute(explain, params).fetchall()]
    text = "\n".join(lines)
    top = next((line for line in lines if "Buffers:" in line), "")
    hit = re.search(r"shared hit=(\d+)", top)
    read = re.search(r"read=(\d+)", top)
    ms = re.search(r"Execution Time: ([\d.]+) ms", text)
    return {"exec_ms": float(ms[1]) if ms else None, "shared_hit": int(hit[1]) if hit else 0,
            "shared_read": int(read[1]) if read else 0,
            "plan": [line for line in lines if "Scan" in line or "Sort" in line][:4]}


def measure(size: int, repeat: int) -> dict[str, Any]:
    """Fill a fresh database with `size` pending jobs; time the claim and the counts."""
    from jobpool.db.migrate import migrate

    name = f"{PREFIX}growth"
    dsn = recreate_database(name)
    async def _migrate() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            await migrate(aconn)

    asyncio.run(_migrate())
    # no JIT, as in the worker's claim, the operator's count and the gauge snapshot sessions
    with psycopg.connect(dsn, row_factory=dict_row, options="-c jit=off") as conn:
        started = time.monotonic()
        for statement in FILL.strip().split(";\n"):
            conn.execute(statement, {"tenants": TENANTS, "kinds": KINDS, "jobs": size})
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE mdm.aa_job")
        fill_s = time.monotonic() - started
        conn.autocommit = False
        claim = claim_parameters(kinds=KINDS, tenants=None, limit=4,
                                 worker_id="bench/1/growth", lease=30.0)
        one_kind = {**claim, "kinds": KINDS[:1]}
        timings: dict[str, list[float]] = {"claim_all_kinds": [], "claim_one_kind": []}
        for _ in range(max(10, repeat * 10)):
            for label, params in (("claim_all_kinds", claim), ("claim_one_kind", one_kind)):
                t = time.perf_counter()
                CLAIM_SESSION.sync(conn)
                rows = CLAIM_JOBS.sync(conn, params)
                conn.commit()
                timings[label].append((time.perf_counter() - t) * 1000)
                assert len(rows) == 4
        lanes = ('[{"name": "all", "kinds": null, "exclude_kinds": [], "tenants": [],'
                 ' "cap": 40}]')
        result: dict[str, Any] = {
            "pending": size, "fill_s": round(fill_s, 1),
            **{f"{k}_ms_median": statistics.median(v) for k, v in timings.items()},
            "claim_explain": _explain(conn, CLAIM_JOBS.text, claim, claim=True),
            "claim_one_kind_explain": _explain(conn, CLAIM_JOBS.text, one_kind,
                                               claim=True),
            "queue_gauges_explain": _explain(conn, QUEUE_GAUGE_SNAPSHOT.text,
                                             {"max_age": 0}),
        }
        result["count_lane_jobs_explain"] = _explain(
            conn, COUNT_LANE_JOBS.text, {"lanes": lanes})
    drop_database(name)
    return result


def growth(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """`measure` for each size, printed as it goes."""
    results = []
    for size in sizes:
        row = measure(size, repeat)
        results.append(row)
        print(f"| growth {size:>9,} | claim {row['claim_all_kinds_ms_median']:.3f} ms "
              f"(exec {row['claim_explain']['exec_ms']} ms, hit "
              f"{row['claim_explain']['shared_hit']}) | one kind "
              f"{row['claim_one_kind_ms_median']:.3f} ms | gauges "
              f"{row['queue_gauges_explain']['exec_ms']} ms (hit "
              f"{row['queue_gauges_explain']['shared_hit']}, read "
              f"{row['queue_gauges_explain']['shared_read']}) | lanes "
              f"{row.get('count_lane_jobs_explain', {}).get('exec_ms')} ms |", flush=True)
    return results
