"""Soak (not in CI): steady enqueue and drain with done-job retention on.

    python3 bench/soak.py --minutes 30 --rate 200

One jobpool worker (default slots) drains `bench_noop` jobs enqueued at `--rate` per second
(in batches every 100 ms). Every `--every` seconds the script deletes done jobs older than
`--retention` seconds (the maintenance retention step with a short period, since its
default is 7 days) and samples the table size, live and dead tuples, the pending backlog and
the claim latency (claimed_at - created_at) of the jobs claimed since the last sample.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from run import bootstrap

if __name__ == "__main__":
    bootstrap()  # into bench/.venv before the imports below

import psycopg
from common import BENCH, PREFIX, child_env, drop_database, recreate_database
from psycopg.rows import dict_row
from systems import BENCH_TENANT, SYSTEMS

import jobpool
from jobpool.worker.maintenance import delete_expired_done_jobs

SAMPLE = """
SELECT pg_total_relation_size('mdm.aa_job') AS bytes, s.n_live_tup AS live,
       s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums,
       (SELECT count(*) FROM mdm.aa_job WHERE status = 'pending') AS pending,
       (SELECT count(*) FROM mdm.aa_job WHERE status = 'done') AS done,
       (SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM claimed_at - created_at))
          FROM mdm.aa_job WHERE claimed_at > now() - make_interval(secs => %(every)s))
           AS claim_latency
  FROM pg_stat_user_tables s WHERE s.relid = 'mdm.aa_job'::regclass
"""


async def soak(dsn: str, minutes: float, rate: float, every: float,
               retention: float) -> list[dict[str, Any]]:
    system = SYSTEMS["jobpool"]
    await system.install(dsn)
    worker = subprocess.Popen(system.worker(dsn, "serve", system.default_concurrency),
                              env=child_env(), stderr=subprocess.PIPE, text=True)
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=dict_row) as conn:
            next_sample = started + every
            tick = 0
            while time.monotonic() - started < minutes * 60:
                tick += 1
                await jobpool.enqueue_many(
                    conn, [jobpool.NewJob(BENCH_TENANT, "bench_noop")] * max(1, int(rate / 10)))
                if time.monotonic() >= next_sample:
                    next_sample += every
                    deleted = 0
                    while True:
                        async with conn.transaction():
                            batch = await delete_expired_done_jobs(conn, retention=retention,
                                                                   batch=5000)
                        deleted += batch
                        if batch < 5000:
                            break
                    cur = await conn.execute(SAMPLE, {"every": every})
                    row = dict(await cur.fetchone() or {})
                    latency = row.pop("claim_latency") or [None, None]
                    row.update(minute=round((time.monotonic() - started) / 60, 1),
                               deleted=deleted, claim_p50_ms=_ms(latency[0]),
                               claim_p99_ms=_ms(latency[1]))
                    samples.append(row)
                    print(json.dumps(row), flush=True)
                delay = started + tick * 0.1 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)
    return samples


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--retention", type=float, default=60.0,
                        help="seconds a done job is kept")
    args = parser.parse_args()
    name = f"{PREFIX}soak"
    dsn = recreate_database(name)
    try:
        samples = asyncio.run(soak(dsn, args.minutes, args.rate, args.every, args.retention))
    finally:
        drop_database(name)
    out = BENCH / "results" / f"soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    Path(out).parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv[1:], "samples": samples}, indent=2,
                              default=str), encoding="utf-8")
    if samples:
        first, last = samples[0], samples[-1]
        print(f"start: {first}\nend:   {last}\nclaim p50 {first['claim_p50_ms']} -> "
              f"{last['claim_p50_ms']} ms; table {first['bytes']:,} -> {last['bytes']:,} bytes; "
              f"median dead tuples {statistics.median(s['dead'] for s in samples):,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
