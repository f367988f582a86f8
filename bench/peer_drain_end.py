"""When a PgQueuer drain exits, against when its last job was logged.

    bench/.venv/bin/python bench/peer_drain_end.py BATCH_SIZE REPEATS      # e.g. 10 4

(`python3 bench/run.py` creates bench/.venv.) Per repeat: a fresh database with 20,000 no-op
jobs, PgQueuer's drain worker alone, then its wall time and the seconds between its last
`pgqueuer_log` row and its exit (a fixed wait at the end of a drain would show there).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import psycopg
from common import child_env, drop_database
from scenarios import fresh, template
from systems import SYSTEMS


def main() -> None:
    system = SYSTEMS["pgqueuer"]
    tpl = template(system)
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):
        name, dsn = fresh(system, tpl, "tail")
        asyncio.run(system.enqueue(dsn, "bench_noop", [{}] * 20000, 5000))
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            db_start = row[0]
        started = time.monotonic()
        subprocess.run(system.worker(dsn, "drain", batch), env=child_env(), check=True,
                       capture_output=True)
        wall = time.monotonic() - started
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT max(created) FROM pgqueuer_log").fetchone()
            assert row is not None
            last = (row[0] - db_start).total_seconds()
        print(f"batch {batch}: wall {wall:.2f}s; last job logged {last:.2f}s after start; "
              f"exit {wall - last:.2f}s after the last", flush=True)
        drop_database(name)
    drop_database(tpl)


if __name__ == "__main__":
    main()
