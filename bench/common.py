"""Shared plumbing of the benchmark: databases, transaction counters, timing, medians."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PREFIX = os.environ.get("JOBPOOL_BENCH_PREFIX") or "jobpool_bench_"
"""Names of the databases the bench creates and drops (`JOBPOOL_BENCH_PREFIX`: runs that share
a server at the same time need different prefixes)."""


PRIVATE_SETTINGS = {"max_connections": "300"}
"""The private cluster's settings beyond PostgreSQL's defaults (autovacuum on, fsync on,
synchronous_commit on, shared_buffers 128MB): room for 64-slot workers beside the peers."""

_private: Any = None

DURABILITIES = ("on", "off")
"""The `synchronous_commit` variants a run can measure (`--synchronous-commit`)."""
_durability: list[str] = []


def set_durability(value: str | None) -> None:
    """Make every database created from now on (`recreate_database`) commit with
    `synchronous_commit = value` (`ALTER DATABASE ... SET`, so that every connection of every
    system to it gets the same, as a DBA would set it for a role), or with the server's own
    setting for None. Raises ValueError for anything but `on` or `off`."""
    if value is not None and value not in DURABILITIES:
        raise ValueError(f"synchronous_commit {value!r}: the bench measures one of "
                         f"{', '.join(DURABILITIES)}")
    _durability[:] = [] if value is None else [value]


def durability() -> str | None:
    """The `synchronous_commit` that `set_durability` set, or None (the server's)."""
    return _durability[0] if _durability else None


def server_dsn() -> str:
    """The maintenance DSN: `JOBPOOL_BENCH_DSN`, else a private cluster started for this run.

    Every benchmark runs on a server with production defaults, not on whatever server answers
    (a development server may run with fsync or autovacuum off, which changes the race). The
    first call starts the cluster (a throw-away folder, removed when the process exits) and
    sets `JOBPOOL_BENCH_DSN`, so that child processes reach the same one.
    """
    if not os.environ.get("JOBPOOL_BENCH_DSN"):
        os.environ["JOBPOOL_BENCH_DSN"] = _start_private_cluster()
    return os.environ["JOBPOOL_BENCH_DSN"]


def _tests_on_path() -> None:
    """Make the test suite's helper modules (tests/ports.py, tests/private_postgres.py)
    importable, once."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a server the bench starts (a worker's probes, the admin
    API): below the kernel's ephemeral range, as the test suite's servers take theirs
    (tests/ports.py)."""
    _tests_on_path()
    from ports import free_port as pick

    return pick()


def _start_private_cluster() -> str:
    global _private
    import atexit

    _tests_on_path()
    from private_postgres import PrivateServer, find_bin

    bin_dir = find_bin()
    if bin_dir is None:
        raise SystemExit("bench: no PostgreSQL server binaries (initdb, pg_ctl) found for the "
                         "private cluster: install them (Debian: postgresql), set "
                         "JOBPOOL_TEST_PG_BIN to their folder, or JOBPOOL_BENCH_DSN to a server")
    _private = PrivateServer(bin_dir, PRIVATE_SETTINGS)
    atexit.register(_private.remove)
    _private.start()
    dsn = str(_private.dsn())
    with psycopg.connect(dsn, autocommit=True) as conn:
        settings = dict(conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s) "
            "ORDER BY name", (list(SHOWN_SETTINGS),)).fetchall())
    print(f"bench: private PostgreSQL cluster {dsn} from {bin_dir}: "
          + ", ".join(f"{name}={value}" for name, value in settings.items()), flush=True)
    return dsn


SHOWN_SETTINGS = ("server_version", "autovacuum", "fsync", "synchronous_commit",
                  "shared_buffers", "max_connections", "wal_level", "checkpoint_timeout")
"""The server settings printed with every run and recorded with its figures (`machine`)."""


def dsn_for(database: str) -> str:
    """The DSN of `database` on the benchmark server, as a URL (asyncpg takes no other)."""
    params = {k: str(v) for k, v in conninfo_to_dict(server_dsn()).items()}
    user = quote(params.pop("user", "postgres"), safe="")
    password = params.pop("password", None)
    host = params.pop("host", "127.0.0.1")
    port = params.pop("port", "5432")
    params.pop("dbname", None)
    auth = f"{user}:{quote(password, safe='')}" if password else user
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}@{host}:{port}/{database}{query}"


def admin() -> psycopg.Connection[Any]:
    """An autocommit connection to the maintenance database."""
    return psycopg.connect(server_dsn(), autocommit=True)


def recreate_database(name: str, template: str | None = None) -> str:
    """Drop and create `name` (a copy of `template` if given), with the `synchronous_commit`
    of `set_durability` if one was set; return its DSN."""
    with admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template))
        conn.execute(query)
        if _durability:  # a database's own settings are not copied from its template
            conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                sql.Identifier(name), sql.Literal(_durability[0])))
    return dsn_for(name)


def drop_database(name: str) -> None:
    """Drop `name` if it exists (connections are terminated)."""
    with admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def transactions(database: str, settle: float = 1.0) -> int:
    """Committed plus rolled-back transactions of `database` so far (pg_stat_database).

    Backends flush their counters when they exit or go idle for a second, so wait `settle`.
    Read from the maintenance database, so the read itself does not count.
    """
    time.sleep(settle)
    with admin() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (database,)).fetchone()
    return int(row[0]) if row else 0


def per_round_arguments(description: str, *, count: str, default: int, what: str,
                        rounds: int) -> argparse.Namespace:
    """Parse `--<count> N` (`what` measured per round, 100 at least) and `--rounds R` (3 at
    least: every figure is a median of at least 3) for a script measuring in rounds; exits
    with argparse's usage error otherwise."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(f"--{count}", type=int, default=default, help=what)
    parser.add_argument("--rounds", type=int, default=rounds)
    args = parser.parse_args()
    if getattr(args, count) < 100 or args.rounds < 3:
        parser.error(f"need --{count} >= 100 and --rounds >= 3 (medians of at least 3)")
    return args


def median(values: Sequence[float]) -> float:
    """The median (0.0 of nothing)."""
    return statistics.median(values) if values else 0.0


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def load() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


def python() -> str:
    """The interpreter of the benchmark venv (the one running now)."""
    return sys.executable


def child_env(**extra: str) -> dict[str, str]:
    """Environment of worker subprocesses: bench/ on the path, no stray JOBPOOL_* settings
    (the bench's own, `JOBPOOL_BENCH_*`, are kept: children reach the same server), and
    bytecode cached as an installed package's is (with PYTHONDONTWRITEBYTECODE set every
    Python worker would compile its modules again at each start, a fixed cost of about 0.3 s
    that a drain of seconds counts against the Python systems)."""
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("JOBPOOL_") or k.startswith("JOBPOOL_BENCH_"))
           and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def run_child(argv: Sequence[str], env: dict[str, str], timeout: float) -> float:
    """Run a worker process to its end; return its wall time in seconds."""
    return run_children([argv], env, timeout)


def run_children(argvs: Sequence[Sequence[str]], env: dict[str, str],
                 timeout: float) -> float:
    """Run worker processes side by side until the last one ends; its wall time in seconds."""
    started = time.monotonic()
    children = [subprocess.Popen(list(argv), env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True) for argv in argvs]
    errors = [child.communicate(timeout=timeout)[1] for child in children]
    elapsed = time.monotonic() - started
    for argv, child, stderr in zip(argvs, children, errors, strict=True):
        if child.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}:\n{stderr[-3000:]}")
    return elapsed


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children: the worker processes
    of a run, once `run_children` has waited for them."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def server_cpu() -> float | None:
    """CPU seconds (user + system) of the benchmark server's processes so far, from /proc: its
    postmaster and every live child (backends, autovacuum, checkpointer, ...), plus the
    children that exited (the postmaster reaps them, and their CPU is added to its children's);
    None where they cannot be read (a server on another host or in a container). Other
    PostgreSQL servers of the host (other engineers' clusters) do not count; every database of
    this server does, so read it on a quiet one."""
    postmaster = _postmaster()
    if postmaster is None:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and (int(entry.name) == postmaster or int(fields[1]) == postmaster):
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` so far, from /proc; NaN if it is not
    visible (gone, or a server on another host)."""
    fields = _stat(pid)
    if fields is None:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (fields[0] is stat(5)'s field 3,
    the state; fields[1] the parent's pid), or None if the process is gone."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


_postmaster_pid: list[int | None] = []


def _postmaster() -> int | None:
    """The pid of the benchmark server's postmaster, the parent of a backend of ours; None if
    that backend is not visible in this host's /proc."""
    if not _postmaster_pid:
        with admin() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            fields = _stat(int(row[0])) if row else None
        _postmaster_pid.append(int(fields[1]) if fields else None)
    return _postmaster_pid[0]


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    with admin() as conn:
        row = conn.execute("SELECT version()").fetchone()
        settings = dict(conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            (list(SHOWN_SETTINGS),)).fetchall())
    assert row is not None
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    from importlib.metadata import version

    from peer_programs import versions

    return {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "postgres": row[0].split(",")[0], "server": "private cluster" if _private else
        "JOBPOOL_BENCH_DSN", **settings, "psycopg": version("psycopg"),
        "pgqueuer": version("pgqueuer"), "procrastinate": version("procrastinate"),
        "asyncpg": version("asyncpg"), **versions(),
    }


PEER_VERSIONS = (("PgQueuer", "pgqueuer", "asyncpg"), ("Procrastinate", "procrastinate", "psycopg"),
                 ("graphile-worker", "graphile-worker", "Node.js"), ("River", "river", "Go"))
"""How each peer's version is shown: (name, its fact, the fact of what runs it)."""


def conditions(facts: dict[str, Any], sync: str | None = None) -> str:
    """The lines for under a table: the machine, the server settings the figures hold for
    (`sync`: the `synchronous_commit` every system's databases were set to, if not the
    server's), and the version of each peer (with its driver or runtime)."""
    shown = ", ".join(
        f"synchronous_commit {sync} (set per database, the same for every system)"
        if name == "synchronous_commit" and sync else f"{name} {facts[name]}"
        for name in SHOWN_SETTINGS[1:] if name in facts)
    peers = ", ".join(f"{title} {facts.get(key, '?')} ({runtime} {facts.get(runtime, '?')})"
                      for title, key, runtime in PEER_VERSIONS)
    return (f"Conditions: {facts['cores']} cores ({facts['cpu']}), PostgreSQL "
            f"{facts.get('server_version', '?')} ({facts['server']}): {shown}.\n"
            f"Peers: {peers}; jobpool from this checkout (Python {facts.get('python', '?')}).")


def start_sleep_worker(dsn: str, slots: int, *flags: str) -> subprocess.Popen[str]:
    """Start a long-running worker of the `bench_sleep` kind on `dsn` with `slots` slots
    (quiet, no metrics port, a 5 s grace; `flags`: more `jobpool run` flags); the caller
    stops it (`stop_workers`)."""
    return subprocess.Popen(
        [python(), "-m", "jobpool", "run", "--kinds", "bench_sleep", "--slots", str(slots),
         "--import", "bench_kinds", "--log-level", "warning", "--metrics-port", "0",
         "--grace", "5", *flags],
        env=child_env(JOBPOOL_DSN=dsn), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        text=True)


def stop_workers(workers: Sequence[subprocess.Popen[str]], timeout: float = 60.0) -> None:
    """SIGTERM every worker at once, then wait for each, at most `timeout` seconds apiece."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(timeout=timeout)


def migrate_with_kinds(dsn: str, kinds_module: str) -> None:
    """Migrate the database at `dsn` and register the kinds of bench/`kinds_module` in it, as
    `jobpool migrate` and `jobpool kinds list --import` do for a user; raises
    subprocess.CalledProcessError if either fails."""
    for command in (["migrate"], ["kinds", "list", "--import", kinds_module]):
        subprocess.run([sys.executable, "-m", "jobpool", *command],
                       env=child_env(JOBPOOL_DSN=dsn), check=True, capture_output=True)
