"""`jobpool api`: serve the admin REST API until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import TYPE_CHECKING, Any

from jobpool.cli_arguments import add_common_arguments, add_settings
from jobpool.settings import Settings

if TYPE_CHECKING:
    from jobpool.core.poolspec import PoolSpec

log = logging.getLogger("jobpool.api")

POOL_SIZE = 4


def add_api_command(subparsers: Any, settings: Settings) -> None:
    """Add `jobpool api` to the CLI's subcommands; its flags default to `settings`."""
    p = subparsers.add_parser(
        "api", help="serve the admin REST API (DLQ, jobs, stats) and the console at /console/")
    add_common_arguments(p, settings)
    add_settings(p, settings, "api")
    p.set_defaults(func=cmd_api, extra="api")


async def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    """Check the token keys and the pool file, then serve until a signal.

    The database need not answer yet: the API serves at once, its /v1 calls and /readyz
    answering 503 with the reason until the database answers and is migrated
    (`jobpool.api.database`), because exiting would only make Kubernetes restart it in a
    crash loop.
    """
    from aiohttp import web
    from psycopg.conninfo import conninfo_to_dict

    from jobpool.api.app import build_app
    from jobpool.api.auth import load_verifier
    from jobpool.api.database import DatabaseLink
    from jobpool.db.connect import resolve_dsn

    verifier = load_verifier(secret=settings.api_jwt_secret,
                             public_key=settings.api_jwt_public_key,
                             audience=settings.api_jwt_audience)
    lanes = lane_summaries(_load_pool(settings.api_pool)) if settings.api_pool else []
    dsn = resolve_dsn(settings.dsn, settings.data_dir)
    conninfo_to_dict(dsn)  # a malformed DSN is a mistake to report, not an outage to wait out
    database = DatabaseLink(dsn, size=POOL_SIZE, name="jobpool-api",
                            transaction_pooler=settings.pooler == "transaction")
    runner = web.AppRunner(build_app(database, verifier, lanes), access_log=log)
    await runner.setup()
    host, port = settings.api_host, settings.api_port
    try:
        await web.TCPSite(runner, host, port).start()
        database.start()
        log.info("admin API on http://%s:%d (console at /console/, OpenAPI at /openapi.json)",
                 host, port)
        await _wait_for_signal()
    except OSError as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                         "set --port / JOBPOOL_API_PORT") from None
    finally:
        await runner.cleanup()
        await database.close()
    return 0


def _load_pool(path: str, given_by: str = "--pool / JOBPOOL_API_POOL") -> PoolSpec:
    """The pool file's plan; reading it needs PyYAML and jsonschema (the worker extra).
    `given_by`: the flag (and variable) that named the file, for the message.

    Raises ValueError naming the file and the problem.
    """
    try:
        from jobpool.core.poolspec import load_pool_file
    except ImportError as exc:
        raise ValueError(f"--pool needs PyYAML and jsonschema: pip install 'jobpool[worker]' "
                         f"(missing: {exc.name})") from None
    try:
        return load_pool_file(path)
    except ValueError as exc:
        message = str(exc)
        named = message if message.startswith(path) else f"{path}: {message}"
        raise ValueError(f"{given_by}: {named}") from None


def pool_file_lanes(path: str, given_by: str) -> list[dict[str, Any]]:
    """`lane_summaries` of the pool file at `path`, which `given_by` (a flag) named (raises
    ValueError naming both and the problem)."""
    return lane_summaries(_load_pool(path, given_by))


def lane_summaries(spec: PoolSpec) -> list[dict[str, Any]]:
    """What the console shows of each lane of `spec`: the jobs it serves and its sizes.

    kinds None means every kind that `exclude_kinds` does not name; tenants [] means every
    tenant.
    """
    return [{"name": lane.name, "kinds": None if lane.kinds is None else list(lane.kinds),
             "exclude_kinds": list(lane.exclude_kinds), "tenants": list(lane.tenants),
             "workers_per_pod": lane.workers_per_pod, "min_replicas": lane.min_replicas,
             "max_replicas": lane.max_replicas, "autoscaling": lane.autoscaling.mode}
            for lane in spec.lanes]


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("admin API stopping")
