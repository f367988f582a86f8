"""`jobpool api`: serve the admin REST API until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from jobpool.settings import Settings

log = logging.getLogger("jobpool.api")

DEFAULT_PORT = 8080
POOL_SIZE = 4


def add_api_command(subparsers: Any) -> None:
    """Add `jobpool api` to the CLI's subcommands."""
    from jobpool.cli import EnvDefault, add_common_arguments, whole_number

    p = subparsers.add_parser("api", help="serve the admin REST API (DLQ, jobs, stats)")
    add_common_arguments(p)
    p.add_argument("--host", action=EnvDefault, envvar="JOBPOOL_API_HOST", default="0.0.0.0",
                   help="address to listen on")
    p.add_argument("--port", type=whole_number(0, 65535), action=EnvDefault,
                   envvar="JOBPOOL_API_PORT", default=DEFAULT_PORT, help="port to listen on")
    p.add_argument("--jwt-secret", action=EnvDefault, envvar="JOBPOOL_API_JWT_SECRET",
                   help="HS256 secret, >= 32 bytes (prefer the variable: flags show in ps)")
    p.add_argument("--jwt-public-key", action=EnvDefault, envvar="JOBPOOL_API_JWT_PUBLIC_KEY",
                   help="RS256/ES256: a PEM public key file, a JWKS file, or inline PEM")
    p.add_argument("--jwt-audience", action=EnvDefault, envvar="JOBPOOL_API_JWT_AUDIENCE",
                   help="the aud every token must carry")
    p.set_defaults(func=cmd_api, extra="api")


async def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    """Check the token keys and the schema, then serve until a signal arrives."""
    from aiohttp import web

    from jobpool.api.app import build_app
    from jobpool.api.auth import load_verifier
    from jobpool.db.connect import connect, open_pool, resolve_dsn
    from jobpool.db.migrate import check_schema

    verifier = load_verifier(secret=args.jwt_secret, public_key=args.jwt_public_key,
                             audience=args.jwt_audience)
    dsn = resolve_dsn(settings.dsn, settings.data_dir)
    async with await connect(dsn) as conn:
        await check_schema(conn)
    pool = open_pool(dsn, size=POOL_SIZE, name="jobpool-api")
    await pool.open(wait=True, timeout=30)
    runner = web.AppRunner(build_app(pool, verifier), access_log=log)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
        log.info("admin API on http://%s:%d (OpenAPI at /openapi.json)", args.host, args.port)
        await _wait_for_signal()
    except OSError as exc:
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
                         "set --port / JOBPOOL_API_PORT") from None
    finally:
        await runner.cleanup()
        await pool.close()
    return 0


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("admin API stopping")
