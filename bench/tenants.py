"""Multi-tenant scale: claims next to other lanes' backlog, throttled floods, fair turns,
and the operator's count and the queue gauges, at 10k, 100k and 1M pending jobs.

    python3 bench/tenants.py foreign-backlog     # claim of a lane whose work is not there
    python3 bench/tenants.py throttled-flood     # B's drain behind a throttled tenant A
    python3 bench/tenants.py fairness            # B's single jobs while A's backlog drains
    python3 bench/tenants.py counts              # operator lane count; gauges, 1/4/16 workers

Options: `--sizes 10000,100000,1000000` (pending jobs N), `--repeat 3`, `--synchronous-commit
on|off` (every database's, as `run.py` sets it; default the server's). Runs in bench/.venv
like `bench/run.py`. Databases `<prefix>tenants_*` (`JOBPOOL_BENCH_PREFIX`) are made and
dropped; raw figures go to bench/results/tenants-<scenario>-<time>.json.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # into bench/.venv before the imports that need it
    from run import bootstrap

    bootstrap()

import asyncio
import json
import re
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from jobpool.core.crd import API_VERSION
from jobpool.db.queries import Many, One
from jobpool.db.store import claim_parameters

CLAIM_JOBS = Many("claim_jobs")
CLAIM_SESSION = One("claim_session")
COUNT_LANE_JOBS = Many("count_lane_jobs")
QUEUE_GAUGE_SNAPSHOT = One("queue_gauge_snapshot")

SCENARIOS = ("foreign-backlog", "throttled-flood", "fairness", "counts")
KINDS = [f"bench_k{i}" for i in range(8)]
TENANTS = 50
B_JOBS = 10_000
A = uuid.UUID("00000000-0000-0000-0000-0000000000a1")
B = uuid.UUID("00000000-0000-0000-0000-0000000000b2")

FILL_BACKLOG = """
INSERT INTO mdm.aa_tenant (key) SELECT 'bench-' || t FROM generate_series(1, %(tenants)s) t;
INSERT INTO mdm.aa_tenant (key) VALUES ('quiet');
INSERT INTO mdm.aa_job_kind (name) SELECT unnest(%(kinds)s::text[]);
INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at, max_attempts)
SELECT t.id, (%(kinds)s::text[])[1 + g %% 8], '{}'::jsonb, 100,
       now() - make_interval(secs => random() * 3600), 20
  FROM generate_series(1, %(jobs)s) g
  JOIN (SELECT id, row_number() OVER (ORDER BY key) - 1 AS n FROM mdm.aa_tenant
         WHERE key LIKE 'bench-%%') t ON t.n = (g / 8) %% %(tenants)s
"""
"""N pending jobs over 50 tenants x 8 kinds (every pair), none for tenant `quiet` or for the
heavy kinds."""

ADD_JOBS = """
INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, priority, available_at, max_attempts)
SELECT %(tenant)s, 'bench_noop', '{}'::jsonb, 100,
       now() - make_interval(secs => %(age)s) + make_interval(secs => g * 0.000001), 3
  FROM generate_series(1, %(jobs)s) g
"""


def _explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any],
             plan_claim: bool = False) -> dict[str, Any]:
    """Execution ms, shared buffers and temp blocks of one EXPLAIN (ANALYZE, BUFFERS), rolled
    back."""

    with conn.transaction(force_rollback=True):
        if plan_claim:
            CLAIM_SESSION.sync(conn)
        lines = [row["QUERY PLAN"] for row in conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + sql.SQL(query), params).fetchall()]
    text = "\n".join(lines)
    top = next((line for line in lines if "Buffers:" in line), "")
    hit, read = re.search(r"shared hit=(\d+)", top), re.search(r" read=(\d+)", top)
    temp = re.findall(r"temp (?:read|written)=(\d+)", text)
    ms = re.search(r"Execution Time: ([\d.]+) ms", text)
    return {"exec_ms": float(ms[1]) if ms else float("nan"),
            "buffers": (int(hit[1]) if hit else 0) + (int(read[1]) if read else 0),
            "temp_blocks": sum(int(t) for t in temp)}


def _spread(values: Sequence[float], digits: int = 3) -> str:
    """`median (min-max)` of a sample."""
    return (f"{round(statistics.median(values), digits)} "
            f"({round(min(values), digits)}-{round(max(values), digits)})")


def _database(label: str) -> tuple[str, str]:
    """A fresh migrated database `<prefix>tenants_<label>`: (name, dsn)."""
    from common import PREFIX, recreate_database

    from jobpool.db.migrate import migrate

    name = f"{PREFIX}tenants_{label}"
    dsn = recreate_database(name)

    async def _migrate() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await migrate(conn)

    asyncio.run(_migrate())
    return name, dsn


def _fill_backlog(dsn: str, size: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in FILL_BACKLOG.strip().split(";\n"):
            conn.execute(statement, {"tenants": TENANTS, "kinds": KINDS, "jobs": size})
        conn.execute("VACUUM ANALYZE mdm.aa_job")


def _claim_params(conn: psycopg.Connection[Any], lane: str) -> dict[str, Any]:
    quiet = conn.execute("SELECT id FROM mdm.aa_tenant WHERE key = 'quiet'").fetchone()
    assert quiet is not None
    kinds, tenants = {"heavy": (["index_sync", "gin_backfill"], None),
                      "tenant": (KINDS, [quiet["id"]])}[lane]
    return claim_parameters(kinds=kinds, tenants=tenants, limit=4, worker_id="bench/1/claim",
                            lease=30.0)


def foreign_backlog(sizes: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    """EXPLAIN of the claim of a lane with nothing ready (the heavy lane; a tenant lane of a
    tenant without jobs), on an empty queue and next to N pending jobs of other kinds/tenants."""
    from common import drop_database


    rows = []
    name, dsn = _database("foreign")
    try:
        _fill_backlog(dsn, 0)
        for size in [0, *sizes]:
            if size:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("TRUNCATE mdm.aa_job CASCADE")
                    conn.execute("DELETE FROM mdm.aa_tenant WHERE key LIKE 'bench-%' "
                                 "OR key = 'quiet'")
                    conn.execute("DELETE FROM mdm.aa_job_kind WHERE name LIKE 'bench_k%'")
                _fill_backlog(dsn, size)
            with psycopg.connect(dsn, row_factory=dict_row) as conn:
                for lane in ("heavy", "tenant"):
                    params = _claim_params(conn, lane)
                    samples = [_explain(conn, CLAIM_JOBS.text, params, True)
                               for _ in range(max(5, repeat))]
                    row = {"pending": size, "lane": lane,
                           "exec_ms": [s["exec_ms"] for s in samples],
                           "buffers": [s["buffers"] for s in samples]}
                    rows.append(row)
                    print(f"| {size:>9,} | {lane} lane | {_spread(row['exec_ms'])} ms | "
                          f"{_spread(row['buffers'], 0)} buffers |", flush=True)
    finally:
        drop_database(name)
    return rows


def _worker(dsn: str, slots: int = 4) -> subprocess.Popen[str]:
    from common import child_env, python

    return subprocess.Popen(
        [python(), "-m", "jobpool", "run", "--dsn", dsn, "--kinds", "bench_noop",
         "--slots", str(slots), "--import", "bench_kinds", "--log-level", "warning",
         "--metrics-port", "0"],
        env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _install(dsn: str, a_limit: dict[str, Any] | None) -> None:
    import bench_kinds

    from jobpool.db.store import register_kinds
    from jobpool.registry import REGISTRY

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            metadata = json.dumps({"rate_limit": {"bench_noop": a_limit}} if a_limit else {})
            await conn.execute("INSERT INTO mdm.aa_tenant (id, key, metadata) VALUES "
                               "(%s, 'tenant-a', %s::jsonb), (%s, 'tenant-b', '{}')",
                               (A, metadata, B))
            await register_kinds(conn, [REGISTRY.get("bench_noop")])

    assert bench_kinds.LATENCY_FILE  # its kinds register on import
    asyncio.run(run())


def _b_drain_rate(dsn: str, timeout: float = 600.0) -> dict[str, float]:
    """Fresh B jobs (B_JOBS), one worker until they are all done: B's jobs/s from the
    worker's first claim (its start-up is not measured), and what the worker did with A's
    jobs meanwhile: `a_done` ran, `a_requeued` sent back to pending for want of a token (each
    once at most: a requeued job goes to the back of A's line)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM mdm.aa_job WHERE tenant_id = %s", (B,))
        # A's jobs the last run requeued for want of a token are ahead of B again
        conn.execute("UPDATE mdm.aa_job SET available_at = now() - interval '2 hours' "
                     "WHERE tenant_id = %s AND status = 'pending' AND available_at > now() "
                     "- interval '2 hours'", (A,))
        # B's jobs are the ids above this one: the probes below read them by the primary key,
        # as cheap next to A's million jobs as in an empty queue (a probe by tenant would scan
        # the whole table every 50 ms, and take the drain's CPU)
        first = conn.execute("SELECT coalesce(max(id), 0) FROM mdm.aa_job").fetchone()
        after = int(first[0]) if first else 0
        conn.execute(ADD_JOBS, {"tenant": B, "jobs": B_JOBS, "age": 0})
        conn.execute("VACUUM ANALYZE mdm.aa_job")
        a_done_before = _a_done(conn)
        worker = _worker(dsn)
        try:
            _wait_for_first_claim(conn, after)
            started = time.monotonic()
            row = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE id > %s "
                               "AND status = 'done'", (after,)).fetchone()
            before = int(row[0]) if row else 0
            while time.monotonic() - started < timeout:
                row = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE id > %s "
                                   "AND status <> 'done'", (after,)).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("B's jobs did not drain in time")
            rate = (B_JOBS - before) / (time.monotonic() - started)
        finally:
            _stop(worker)
        row = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s AND status = "
                           "'pending' AND available_at > now() - interval '2 hours'",
                           (A,)).fetchone()
        return {"rate": rate, "a_done": _a_done(conn) - a_done_before,
                "a_requeued": int(row[0]) if row else 0}


def _a_done(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s AND status = "
                       "'done'", (A,)).fetchone()
    return int(row[0]) if row else 0


def throttled_flood(sizes: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    """Tenant A limited to 1 job/s with N jobs queued ahead of B's 10,000; B's drain rate
    against B alone (same run, interleaved), alone in an empty queue and alone next to N jobs
    of a kind the worker does not serve (the same table size, so what differs is the
    throttled tenant alone); and A's jobs run and requeued during B's drain."""
    from common import drop_database

    rows = []
    alone_name, alone = _database("alone")
    _install(alone, None)
    try:
        for size in sizes:
            name, dsn = _database(f"flood_{size}")
            sized_name, sized = _database(f"sized_{size}")
            try:
                _install(dsn, {"rps": 1, "burst": 1})
                _install(sized, None)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(ADD_JOBS, {"tenant": A, "jobs": size, "age": 7200})
                with psycopg.connect(sized, autocommit=True) as conn:
                    conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('bench_other')")
                    conn.execute(ADD_JOBS.replace("'bench_noop'", "'bench_other'"),
                                 {"tenant": A, "jobs": size, "age": 7200})
                flood, solo, same_size = [], [], []
                a_done, a_requeued = [], []
                for _ in range(repeat):
                    run = _b_drain_rate(dsn)
                    flood.append(run["rate"])
                    a_done.append(run["a_done"])
                    a_requeued.append(run["a_requeued"])
                    solo.append(_b_drain_rate(alone)["rate"])
                    same_size.append(_b_drain_rate(sized)["rate"])
                row = {"pending": size, "b_behind_flood": flood, "b_alone": solo,
                       "b_alone_same_size": same_size, "a_done": a_done,
                       "a_requeued": a_requeued,
                       "ratio": statistics.median(flood) / statistics.median(solo),
                       "ratio_same_size": statistics.median(flood) / statistics.median(same_size)}
                rows.append(row)
                print(f"| {size:>9,} | B behind A's flood {_spread(flood, 0)} jobs/s | "
                      f"B alone {_spread(solo, 0)} jobs/s ({row['ratio']:.0%}) | B alone next to "
                      f"N other jobs {_spread(same_size, 0)} jobs/s "
                      f"({row['ratio_same_size']:.0%}) | A ran {_spread(a_done, 0)}, requeued "
                      f"{_spread(a_requeued, 0)} |", flush=True)
            finally:
                drop_database(name)
                drop_database(sized_name)
    finally:
        drop_database(alone_name)
    return rows


def _drain_window(dsn: str, size: int, seconds: float, with_b: bool) -> dict[str, Any]:
    """A topped up to `size` pending jobs, one worker for `seconds` (or until A is empty);
    B enqueues one job every 0.5 s if `with_b`. A's jobs/s and B's enqueue-to-start."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM mdm.aa_job WHERE status = 'done'")
        row = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s AND "
                           "status = 'pending'", (A,)).fetchone()
        missing = size - int(row[0]) if row else size
        if missing > 0:
            conn.execute(ADD_JOBS, {"tenant": A, "jobs": missing, "age": 3600})
        conn.execute("VACUUM ANALYZE mdm.aa_job")
        first_b = conn.execute("SELECT coalesce(max(id), 0) FROM mdm.aa_job").fetchone()
        worker = _worker(dsn)
        try:
            _wait_for_first_claim(conn)
            done_before = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s "
                                       "AND status = 'done'", (A,)).fetchone()
            started = time.monotonic()
            next_b = started
            while (elapsed := time.monotonic() - started) < seconds:
                if with_b and time.monotonic() >= next_b:
                    conn.execute(ADD_JOBS, {"tenant": B, "jobs": 1, "age": 0})
                    next_b += 0.5
                left = conn.execute("SELECT EXISTS (SELECT 1 FROM mdm.aa_job WHERE tenant_id"
                                    " = %s AND status = 'pending')", (A,)).fetchone()
                if left is not None and not left[0]:
                    break
                time.sleep(0.02)
            a_done = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s AND "
                                  "status = 'done'", (A,)).fetchone()
        finally:
            time.sleep(0.5 if with_b else 0)
            _stop(worker)
        latencies = [float(r[0]) * 1000 for r in conn.execute(
            "SELECT extract(epoch FROM claimed_at - created_at) FROM mdm.aa_job "
            "WHERE tenant_id = %s AND id > %s AND claimed_at IS NOT NULL",
            (B, first_b[0] if first_b else 0)).fetchall()]
        unclaimed = conn.execute("SELECT count(*) FROM mdm.aa_job WHERE tenant_id = %s AND "
                                 "claimed_at IS NULL", (B,)).fetchone()
        conn.execute("DELETE FROM mdm.aa_job WHERE tenant_id = %s", (B,))
    done = int(a_done[0] if a_done else 0) - int(done_before[0] if done_before else 0)
    return {"a_rate": done / elapsed, "b_ms": latencies,
            "b_unclaimed": int(unclaimed[0]) if unclaimed else 0}


def _wait_for_first_claim(conn: psycopg.Connection[Any], after: int = 0,
                          timeout: float = 60.0) -> None:
    """Until the worker that just started has claimed a job whose id is above `after` (its
    start is not measured; jobs an earlier run claimed do not count)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM mdm.aa_job WHERE id > %s AND "
                           "claimed_at IS NOT NULL)", (after,)).fetchone()
        if row is not None and row[0]:
            return
        time.sleep(0.02)
    raise RuntimeError("the worker claimed nothing")


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def fairness(sizes: Sequence[int], repeat: int, seconds: float = 15.0) -> list[dict[str, Any]]:
    """Tenant A with N jobs queued first, B enqueueing one job every 0.5 s: B's
    enqueue-to-start (claimed_at - created_at, the database's clock) p50/p99 while A drains,
    and A's drain rate against A alone (same run, interleaved)."""
    from common import drop_database

    rows = []
    for size in sizes:
        name, dsn = _database(f"fair_{size}")
        try:
            _install(dsn, None)
            shared, alone, b_ms, unclaimed = [], [], [], 0
            for _ in range(repeat):
                run = _drain_window(dsn, size, seconds, with_b=True)
                shared.append(run["a_rate"])
                b_ms += run["b_ms"]
                unclaimed += run["b_unclaimed"]
                alone.append(_drain_window(dsn, size, seconds, with_b=False)["a_rate"])
            row = {"pending": size, "a_with_b": shared, "a_alone": alone, "b_ms": b_ms,
                   "b_p50_ms": _percentile(b_ms, 0.5), "b_p99_ms": _percentile(b_ms, 0.99),
                   "b_unclaimed": unclaimed,
                   "ratio": statistics.median(shared) / statistics.median(alone)}
            rows.append(row)
            print(f"| {size:>9,} | B p50 {row['b_p50_ms']:.1f} ms, p99 {row['b_p99_ms']:.1f} "
                  f"ms ({len(b_ms)} jobs, {unclaimed} never started) | A {_spread(shared, 0)} "
                  f"jobs/s vs alone {_spread(alone, 0)} | {row['ratio']:.0%} |", flush=True)
        finally:
            drop_database(name)
    return rows


LANES = [
    {"name": "default", "kinds": None, "exclude_kinds": ["index_sync", "gin_backfill",
                                                         "bench_k6", "bench_k7"],
     "tenants": [], "cap": 40},
    {"name": "bulk", "kinds": ["bench_k6", "bench_k7"], "exclude_kinds": [], "tenants": [],
     "cap": 40},
    {"name": "heavy", "kinds": ["index_sync", "gin_backfill"], "exclude_kinds": [],
     "tenants": [], "cap": 1},
    {"name": "tenant", "kinds": None, "exclude_kinds": [], "tenants": ["bench-1"], "cap": 40},
]
"""Four lanes as the operator sends them (caps: 10 replicas x 4 workers x 1.0; heavy 1 x 1)."""


async def _gauge_workers(dsn: str, workers: int, seconds: float) -> dict[str, Any]:
    """`workers` gauge readers (a connection each), each scraped every second for `seconds`
    with the default 5 s interval: snapshots taken and database seconds spent."""
    from jobpool.metrics import QueueGauges

    readers = [QueueGauges(dsn) for _ in range(workers)]
    taking: list[float] = []
    reading: list[float] = []

    async def scrape(gauges: QueueGauges) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started, before = time.monotonic(), gauges.computed
            gauges.fetched_at = None  # every scrape reaches the database
            await gauges.refresh()
            (taking if gauges.computed > before else reading).append(
                time.monotonic() - started)
            await asyncio.sleep(1.0)

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE mdm.aa_queue_gauges SET taken_at = 'epoch'")
        await asyncio.gather(*(scrape(gauges) for gauges in readers))
    finally:
        for gauges in readers:
            await gauges.close()
    return {"workers": workers, "snapshots": len(taking), "snapshot_seconds": sum(taking),
            "reads": len(reading), "read_ms_median": statistics.median(reading) * 1000}


def counts(sizes: Sequence[int], repeat: int, seconds: float = 20.0) -> list[dict[str, Any]]:
    """The operator's lane count (4 lanes) and the queue gauges at N pending; the gauges with
    1, 4 and 16 workers reading them."""
    from common import drop_database

    from jobpool.db.lane_counts import LaneCounter

    rows = []
    for size in sizes:
        name, dsn = _database(f"counts_{size}")
        try:
            _fill_backlog(dsn, size)
            lanes = json.dumps(LANES)
            # the operator's and the gauges' sessions turn JIT off, as here
            with psycopg.connect(dsn, row_factory=dict_row, options="-c jit=off") as conn:
                count = [_explain(conn, COUNT_LANE_JOBS.text, {"lanes": lanes})
                         for _ in range(max(5, repeat))]
                gauge = [_explain(conn, QUEUE_GAUGE_SNAPSHOT.text, {"max_age": 0})
                         for _ in range(repeat)]
            from jobpool.core.poolspec import load_pool

            pool = load_pool({"apiVersion": API_VERSION, "kind": "JobWorkerPool",
                              "metadata": {"name": "bench"},
                              "spec": {"image": "i", "database": {"secretName": "s"},
                                       "lanes": [{"name": "default"},
                                                 {"name": "bulk", "kinds": KINDS[6:]},
                                                 {"name": "tenant", "kinds": KINDS[:6],
                                                  "tenants": ["bench-1"]}]}})

            async def ticks(dsn: str = dsn, pool: Any = pool) -> list[float]:
                counter, walls = LaneCounter(), []
                try:
                    for _ in range(max(5, repeat)):
                        started = time.perf_counter()
                        await counter(dsn, pool.lanes)
                        walls.append((time.perf_counter() - started) * 1000)
                finally:
                    await counter.close()
                return walls[1:]  # the first tick opens the connection

            walls = asyncio.run(ticks())
            readers = [asyncio.run(_gauge_workers(dsn, n, seconds)) for n in (1, 4, 16)]
            row = {"pending": size, "count_exec_ms": [c["exec_ms"] for c in count],
                   "count_buffers": [c["buffers"] for c in count],
                   "count_temp_blocks": max(c["temp_blocks"] for c in count),
                   "tick_wall_ms": walls, "gauge_exec_ms": [g["exec_ms"] for g in gauge],
                   "gauge_temp_blocks": max(g["temp_blocks"] for g in gauge),
                   "gauge_workers": readers}
            rows.append(row)
            shown = ", ".join(f"{r['workers']} workers: {r['snapshots']} snapshots "
                              f"({r['snapshot_seconds']:.2f} s), {r['reads']} reads "
                              f"(median {r['read_ms_median']:.1f} ms)" for r in readers)
            print(f"| {size:>9,} | count {_spread(row['count_exec_ms'])} ms, "
                  f"{_spread(row['count_buffers'], 0)} buffers, temp "
                  f"{row['count_temp_blocks']} | tick {_spread(walls)} ms | gauges "
                  f"{_spread(row['gauge_exec_ms'], 1)} ms | {shown} |", flush=True)
        finally:
            drop_database(name)
    return rows


def main() -> int:
    import argparse

    from common import BENCH, DURABILITIES, conditions, machine, set_durability

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synchronous-commit", choices=DURABILITIES, default=None)
    args = parser.parse_args()
    set_durability(args.synchronous_commit)
    sizes = [int(n) for n in args.sizes.split(",")]
    run = {"foreign-backlog": foreign_backlog, "throttled-flood": throttled_flood,
           "fairness": fairness, "counts": counts}[args.scenario]
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows = run(sizes, args.repeat)
    out = BENCH / "results" / f"tenants-{args.scenario}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "argv": sys.argv[1:], "started": started,
                               "rows": rows}, indent=2, default=str), encoding="utf-8")
    print(f"raw: {out}")
    print(conditions(machine(), args.synchronous_commit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
