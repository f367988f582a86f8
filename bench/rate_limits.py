"""Cluster-wide rate limits: the rate several worker processes achieve together.

    python3 bench/rate_limits.py                      # every scenario, 60 s, 3 repetitions
    python3 bench/rate_limits.py tenant --seconds 20 --repeat 1

Like run.py, it first creates bench/.venv and re-executes itself there. Each run gets a
fresh database `jobpool_bench_rl_*` on JOBPOOL_BENCH_DSN's server, an ample backlog, and
real `jobpool run` worker processes (4 slots each) for `--seconds`, then SIGTERM. Each job
records its start (server clock) in its own transaction. Scenarios:

  tenant    one tenant limited to 5 rps (burst 5); 1, 4 and 16 processes
  provider  a provider cap of 14 rps (burst 14) shared by two lanes (two kinds); 1+1, 2+2
            and 8+8 processes
  fast      a provider cap of 100 rps (burst 100); 4 processes (the token store's cost at
            a rate >= 50/s)

Figures per run: jobs started within the first `--seconds` after the first start, their mean
rate, the most started in any 1 s window, the largest excess over burst + rps * t in any
window of t = 1, 10 and 60 s (<= 0: the limit held), attempts used by throttling, and token
statements per second and per token: writes to `mdm.aa_rate_bucket` (pg_stat_user_tables;
one per lease here, as each job needs one bucket). Raw figures: bench/results/rl-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from run import BENCH, bootstrap

WINDOWS = (1.0, 10.0, 60.0)
TAIL = 0.5
"""Seconds the workers run past the measured window."""


@dataclass(frozen=True)
class Scenario:
    name: str
    lanes: tuple[tuple[str, int], ...]
    """(kind, processes) per lane."""
    rps: float
    burst: int
    provider: bool
    """A provider cap over every lane's kind; else a limit of the tenant for bench_rl_a."""


SCENARIOS = {
    "tenant": [Scenario(f"tenant-5rps/{n}p", (("bench_rl_a", n),), 5, 5, False)
               for n in (1, 4, 16)],
    "provider": [Scenario(f"provider-14rps/{n}+{n}p", (("bench_rl_a", n), ("bench_rl_b", n)),
                          14, 14, True) for n in (1, 2, 8)],
    "fast": [Scenario("provider-100rps/4p", (("bench_rl_a", 4),), 100, 100, True)],
}


def caps(scenario: Scenario) -> str:
    kinds = {kind: "mail" for kind, _ in scenario.lanes}
    return json.dumps({"providers": {"mail": {"rps": scenario.rps, "burst": scenario.burst}},
                       "kinds": kinds})


async def prepare(dsn: str, scenario: Scenario, backlog: int) -> None:
    import bench_kinds
    import psycopg

    from jobpool.db.migrate import migrate
    from jobpool.db.store import register_kinds
    from jobpool.enqueue import NewJob, enqueue_many
    from jobpool.registry import REGISTRY

    limit = {} if scenario.provider else {
        "rate_limit": {"bench_rl_a": {"rps": scenario.rps, "burst": scenario.burst}}}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn)
        await conn.execute(bench_kinds.STARTS_DDL)
        kinds = [kind for kind, _ in scenario.lanes]
        await register_kinds(conn, [REGISTRY.get(kind) for kind in kinds])
        cur = await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES"
                                 " ('limited', %s) RETURNING id", (json.dumps(limit),))
        row = await cur.fetchone()
        assert row is not None
        tenant = uuid.UUID(str(row[0]))
        for kind in kinds:
            await enqueue_many(conn, [NewJob(tenant, kind)] * backlog)
        await conn.execute("VACUUM ANALYZE mdm.aa_job")


def run_workers(dsn: str, scenario: Scenario, seconds: float) -> None:
    from common import child_env, python

    env = child_env(JOBPOOL_DSN=dsn, **({"JOBPOOL_RATE_LIMITS": caps(scenario)}
                                       if scenario.provider else {}))
    workers = [
        subprocess.Popen([python(), "-m", "jobpool", "run", "--kinds", kind, "--slots", "4",
                          "--import", "bench_kinds", "--log-level", "warning",
                          "--metrics-port", "0"], env=env, stderr=subprocess.PIPE, text=True)
        for kind, count in scenario.lanes for _ in range(count)
    ]
    wait_for_first_start(dsn)
    time.sleep(seconds + TAIL)
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        _, err = worker.communicate(timeout=60)
        if worker.returncode != 0:
            raise RuntimeError(f"worker exited {worker.returncode}: {err[-2000:]}")


def wait_for_first_start(dsn: str) -> None:
    """Return once a job started: the window is measured from there (start-up excluded)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(600):
            if conn.execute("SELECT EXISTS (SELECT FROM bench_starts)").fetchone() == (True,):
                return
            time.sleep(0.2)
    raise RuntimeError("no job started within 120 s")


def max_in_window(times: list[float], width: float) -> int:
    """The most starts in any window [t, t + width) (t at a start: that is where maxima are)."""
    return max((bisect_left(times, t + width) - i for i, t in enumerate(times)), default=0)


def measure(dsn: str, scenario: Scenario, seconds: float) -> dict[str, Any]:
    import psycopg
    from common import median

    with psycopg.connect(dsn, autocommit=True) as conn:
        starts = [row[0] for row in conn.execute("SELECT at FROM bench_starts ORDER BY at")]
        first: datetime = starts[0]
        times = [(at - first).total_seconds() for at in starts]
        times = [t for t in times if t < seconds]
        row = conn.execute(
            "SELECT coalesce(sum(attempts), 0) - count(*) FILTER (WHERE status = 'done'),"
            " count(*) FILTER (WHERE status = 'done') FROM mdm.aa_job").fetchone()
        assert row is not None
        time.sleep(1.0)  # backends flush their table counters when they exit
        conn.execute("SELECT pg_stat_clear_snapshot()")
        writes = conn.execute(
            "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables"
            " WHERE relname = 'aa_rate_bucket'").fetchone()
    statements = int(writes[0]) if writes else 0
    done = int(row[1])
    excess = {f"excess_{w:g}s": max_in_window(times, w) - (scenario.burst + scenario.rps * w)
              for w in WINDOWS if w <= seconds}
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "scenario": scenario.name, "rps": scenario.rps, "burst": scenario.burst,
        "processes": sum(count for _, count in scenario.lanes),
        "started_in_window": len(times), "mean_rps": round(len(times) / seconds, 3),
        "mean_vs_limit_pct": round(100 * (len(times) / seconds / scenario.rps - 1), 2),
        "max_1s": max_in_window(times, 1.0), **excess,
        "attempts_used_by_throttling": int(row[0]), "jobs_done": done,
        "token_statements": statements,
        "token_statements_per_s": round(statements / (seconds + TAIL), 2),
        "token_statements_per_token": round(statements / done, 3) if done else None,
        "median_gap_ms": round(1000 * median(gaps), 1),
    }


def run_one(scenario: Scenario, seconds: float) -> dict[str, Any]:
    from common import drop_database, load, recreate_database

    name = f"jobpool_bench_rl_{uuid.uuid4().hex[:6]}"
    dsn = recreate_database(name)
    try:
        backlog = int(scenario.rps * (seconds + 10) * 2) + 100
        asyncio.run(prepare(dsn, scenario, backlog))
        before = load()
        run_workers(dsn, scenario, seconds)
        return {**measure(dsn, scenario, seconds), "load": [round(before, 1), round(load(), 1)]}
    finally:
        drop_database(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"any of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for _ in range(args.repeat):  # repetitions interleaved: a noisy minute hits every scenario
        for group in args.scenarios:
            for scenario in SCENARIOS[group]:
                rows.append(run_one(scenario, args.seconds))
                print(json.dumps(rows[-1]), flush=True)
    out = BENCH / "results" / f"rl-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv[1:], "runs": rows}, indent=2), "utf-8")
    print(summary(rows))
    print(f"\nraw: {out}")
    return 0


def summary(rows: list[dict[str, Any]]) -> str:
    """A markdown table: the median of each figure per scenario, with [min-max]."""
    from common import median

    fields = ("mean_rps", "max_1s", "excess_1s", "excess_10s", "excess_60s", "jobs_done",
              "attempts_used_by_throttling", "token_statements_per_s",
              "token_statements_per_token")
    lines = ["| scenario | runs | " + " | ".join(fields) + " |",
             "| --- | --- |" + " --- |" * len(fields)]
    for name in dict.fromkeys(row["scenario"] for row in rows):
        runs = [row for row in rows if row["scenario"] == name]
        cells = []
        for field in fields:
            values = [float(row[field]) for row in runs if row.get(field) is not None]
            cells.append(f"{median(values):g} [{min(values):g}-{max(values):g}]"
                         if values else "-")
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    bootstrap()
    sys.exit(main())
