"""Where a drain's SQL transactions come from, counted in the server's statement log.

    bench/.venv/bin/python bench/transactions_by_source.py --jobs 10000   # both settings

Starts a private cluster (PostgreSQL's defaults, every statement logged), runs
`bench/run.py drain-write --systems jobpool --repeat 1` against it, and prints, for each drain,
its transactions per job grouped by what they ran. A backend numbers its transactions (the
local part of the virtual transaction id in each log line), so a number that no logged
statement carries is a transaction a multi-statement query ran after its first statement
(say the statements after a COMMIT): those are counted as "after <that query>" (a
backend's last such transaction, with no logged one after it, is not seen).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PREFIX = "%m|%p|%a|%v|%d|"
LINE = re.compile(r"^[^|]+\|(\d+)\|([^|]*)\|\d+/(\d+)\|([^|]*)\|LOG:  "
                  r"(?:statement|execute [^:]*): (.*)$")
DRAIN = re.compile(r'CREATE DATABASE "(\w+_drain)"')


def label(app: str, text: str) -> str:
    """A statement's source: its connection's name and the start of its text."""
    return f"{app or '-'}: {' '.join(text.split())[:60]}"


def drains(log: Iterable[str]) -> list[tuple[str, list[str]]]:
    """The log's lines, cut at each drain database's creation: (database, lines)."""
    cut: list[tuple[str, list[str]]] = []
    for line in log:
        made = DRAIN.search(line)
        if made:
            cut.append((made.group(1), []))
        elif cut:
            cut[-1][1].append(line)
    return cut


def by_source(lines: Iterable[str], database: str) -> collections.Counter[str]:
    """Transactions of `database` in `lines`, by the statements each ran."""
    per_backend: dict[str, dict[int, list[str]]] = collections.defaultdict(dict)
    for line in lines:
        m = LINE.match(line.rstrip("\n"))
        if m and m.group(4) == database:
            pid, app, local, _, text = m.groups()
            per_backend[pid].setdefault(int(local), []).append(label(app, text))
    counts: collections.Counter[str] = collections.Counter()
    for transactions in per_backend.values():
        numbers = sorted(transactions)
        for number, following in zip(numbers, [*numbers[1:], None], strict=True):
            counts[" + ".join(dict.fromkeys(transactions[number]))] += 1
            if following is not None and following - number > 1:
                counts[f"after {transactions[number][-1]}"] += following - number - 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    sys.path.insert(0, str(BENCH.parent / "tests"))
    from private_postgres import PrivateServer, find_bin

    bin_dir = find_bin()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL server binaries (initdb, pg_ctl) found")
    server = PrivateServer(bin_dir, {"max_connections": "300", "log_statement": "all",
                                     "log_line_prefix": f"'{PREFIX}'"})
    try:
        server.start()
        subprocess.run([sys.executable, str(BENCH / "run.py"), "drain-write", "--systems",
                        "jobpool", "--repeat", "1", "--jobs", str(args.jobs)], check=True,
                       env={**os.environ, "JOBPOOL_BENCH_DSN": server.dsn()})
        with (server.folder / "log").open(errors="replace") as log:
            cut = drains(log)
    finally:
        server.remove()
    for (database, lines), setting in zip(cut, ("default", "best"), strict=False):
        counts = by_source(lines, database)
        total = sum(counts.values())
        print(f"\n{setting}: {total} transactions, {total / args.jobs:.3f} per job")
        for source, n in counts.most_common(12):
            print(f"{n:8d} {n / args.jobs:7.3f}  {source[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
