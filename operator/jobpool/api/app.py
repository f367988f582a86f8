"""The admin REST API (aiohttp): DLQ, jobs, stats over `jobpool.admin`, pauses over
`jobpool.pauses`, and the console.

Every /v1 route needs a Bearer token with `manage_metadata` (`jobpool.api.auth`) and acts
only on the tenants of the token's `tenants` claim: another tenant's job is a 404, as if it
did not exist, so that ids do not leak. Errors are `application/problem+json` (RFC 9457)
naming the problem; bad input is a 4xx, never a 500.

The operations console (`/console/`, static files from `api/console/`) is a page that calls
this same API with the same token; its files hold no data, so they need no token. Every
response carries a Content-Security-Policy that allows scripts, styles and requests from
this server only, and no inline script or style.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from http import HTTPStatus
from pathlib import Path
from typing import Any

import psycopg
from aiohttp import web
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobpool import admin, pauses
from jobpool.admin import DEFAULT_PAGE, MAX_JOB_ID, MAX_PAGE
from jobpool.api.auth import AuthError, Principal, TokenVerifier
from jobpool.api.database import DatabaseAwayError, DatabaseLink
from jobpool.api.openapi import KIND_NAME, document
from jobpool.api.overview import audit_entry, gather_overview, job_history
from jobpool.core.actors import token_subject
from jobpool.core.pause_scopes import check_reason, check_scope
from jobpool.core.tenants import tenant_ref
from jobpool.errors import (
    JobNotFoundError,
    JobpoolError,
    JobStateError,
    UnknownKindError,
    UnknownTenantError,
)
from jobpool.pauses import PauseScopeError

log = logging.getLogger("jobpool.api")

MAX_BODY = 64 * 1024
"""Bytes; no endpoint takes a body, so anything larger is refused with 413."""
PUBLIC_PATHS = frozenset({"/", "/console", "/openapi.json", "/healthz", "/readyz"})
CONSOLE_PATH = "/console/"
"""Where the console is served; its static files need no token (the API calls do)."""
CONSOLE_FILES = Path(__file__).with_name("console")
PROBLEM_TYPE = "application/problem+json"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
"""On every response: the console runs only this server's files (no inline script or style,
nothing from elsewhere), so injected markup cannot run, and no page may frame it."""

DATABASE = web.AppKey("database", DatabaseLink)
VERIFIER = web.AppKey("verifier", TokenVerifier)
LANES: web.AppKey[tuple[Mapping[str, Any], ...]] = web.AppKey("lanes")
"""The lanes of the pool file given to `jobpool api --pool` (plain dicts), or ()."""
PRINCIPAL = web.RequestKey("principal", Principal)
"""The token's subject (the audit actor of the request's changes) and tenant scope."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequestError(JobpoolError):
    """A bad path or query parameter, or a body that cannot be read (400)."""


class AuditEntryNotFoundError(JobpoolError):
    """No audit row with that id among the token's tenants (404)."""


def problem(status: int, detail: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """An RFC 9457 problem response."""
    body = {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
            "detail": detail}
    return web.json_response(body, status=status, content_type=PROBLEM_TYPE,
                             headers=dict(headers or {}))


def _default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID | timedelta):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def ok(body: Any, status: int = 200) -> web.Response:
    """A JSON response; datetimes as ISO 8601, uuids as text."""
    return web.json_response(body, status=status, dumps=lambda v: json.dumps(v, default=_default))


# -- middlewares ---------------------------------------------------------------------------


@web.middleware
async def problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into a problem response; log what is our fault."""
    try:
        return await handler(request)
    except AuthError as exc:
        headers = {"WWW-Authenticate": 'Bearer error="invalid_token"'} if exc.status == 401 else {}
        return problem(exc.status, exc.message, headers)
    except BadRequestError as exc:
        return problem(400, str(exc))
    except (JobNotFoundError, UnknownTenantError, UnknownKindError,
            AuditEntryNotFoundError) as exc:
        return problem(404, str(exc))
    except PauseScopeError as exc:
        return problem(403, str(exc))
    except JobStateError as exc:
        return problem(409, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
        if exc.status == 413:
            return problem(413, f"the request body is larger than {MAX_BODY} bytes; no "
                                "endpoint takes one")
        return problem(exc.status, exc.reason, allow)
    except DatabaseAwayError as exc:
        return problem(503, f"{exc}; try again later")
    except (psycopg.OperationalError, PoolTimeout) as exc:
        log.warning("database unreachable: %s", exc)
        return problem(503, "the database is unreachable; try again later")
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        log.warning("database refuses writes: %s", exc)
        return problem(503, "the database refuses writes now (a read-only transaction: "
                            "default_transaction_read_only, or a standby); try again later")
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return problem(500, "unexpected error; the server log has the details")


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Require a valid token with manage_metadata on every non-public path; refuse big bodies
    and bodies that cannot be decoded (a bad Content-Encoding)."""
    if request.path not in PUBLIC_PATHS and not request.path.startswith(CONSOLE_PATH):
        request[PRINCIPAL] = request.app[VERIFIER].principal(
            request.headers.get("Authorization"))
    if request.body_exists:
        try:
            await request.read()  # raises 413 beyond client_max_size
        except web.RequestPayloadError as exc:
            raise BadRequestError(f"the request body cannot be read: {_first_line(exc)}") from None
    return await handler(request)


async def _security_headers(_: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


def _first_line(exc: Exception) -> str:
    cause = exc.__cause__ or exc
    return (getattr(cause, "message", None) or str(cause)).strip().splitlines()[0][:200]


# -- parameters ----------------------------------------------------------------------------


def _integer(text: str, name: str, low: int, high: int) -> int:
    if not re.fullmatch(r"-?[0-9]{1,20}", text):
        raise BadRequestError(f"{name} must be an integer, got {text[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        raise BadRequestError(f"{name} must be between {low} and {high}, got {value}")
    return value


def job_id(request: web.Request) -> int:
    """The {id} path parameter; raises BadRequestError."""
    return _integer(request.match_info["id"], "job id", 1, MAX_JOB_ID)


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    return default if text is None else _integer(text, name, low, high)


def _query_match(request: web.Request, name: str, pattern: str, what: str) -> str | None:
    text = request.query.get(name)
    if text is not None and not re.fullmatch(pattern, text):
        raise BadRequestError(f"{name} must be {what}, got {text[:80]!r}")
    return text


def _query_tenant(request: web.Request) -> str | None:
    """The `tenant` filter in canonical form (a uuid in any case is accepted)."""
    text = request.query.get("tenant")
    try:
        return None if text is None else tenant_ref(text)
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


# -- handlers ------------------------------------------------------------------------------


def _tenants(request: web.Request) -> tuple[str, ...] | None:
    """The tenant keys the request's token may act for; None: every tenant."""
    return request[PRINCIPAL].tenants


async def list_dlq(request: web.Request) -> web.Response:
    """GET /v1/dlq?tenant&kind&after&limit (a tenant outside the token's scope is a 404)."""
    after = _query_int(request, "after", 0, 0, MAX_JOB_ID)
    limit = _query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    kind = _query_match(request, "kind", KIND_NAME, "a kind name (lower-case identifier)")
    tenant = _query_tenant(request)
    scope = _tenants(request)
    async with request.app[DATABASE].connection() as conn:
        tenant_id = None
        if tenant:
            tenant_id = (await admin.resolve_tenant(conn, tenant, tenants=scope))["id"]
        rows = await admin.list_dlq(conn, tenant_id=tenant_id, kind=kind, after=after,
                                    limit=limit, tenants=scope)
    return ok({"items": rows, "next_after": rows[-1]["id"] if len(rows) == limit else None})


async def get_job(request: web.Request) -> web.Response:
    """GET /v1/jobs/{id}."""
    ident = job_id(request)
    async with request.app[DATABASE].connection() as conn:
        return ok(await admin.get_job(conn, ident, tenants=_tenants(request)))


async def get_job_history(request: web.Request) -> web.Response:
    """GET /v1/audit/jobs/{id}: the job's audit rows, also after a discard (a path of the
    audit log, not of /v1/jobs/{id}: the rows outlive the job); 404 when the
    token may see none."""
    ident = job_id(request)
    async with request.app[DATABASE].connection() as conn:
        rows = await job_history(conn, ident, tenants=_tenants(request))
    if not rows:
        raise JobNotFoundError(ident)
    return ok({"items": rows})


async def get_audit_entry(request: web.Request) -> web.Response:
    """GET /v1/audit/entries/{id}: one audit row with its whole payload (a discard's snapshot
    of the job); the history lists previews. 404 when the token may not see it."""
    ident = _integer(request.match_info["id"], "audit entry id", 1, MAX_JOB_ID)
    async with request.app[DATABASE].connection() as conn:
        row = await audit_entry(conn, ident, tenants=_tenants(request))
    if row is None:
        raise AuditEntryNotFoundError(f"no audit entry with id {ident}")
    return ok(row)


def _action(action: Callable[..., Awaitable[None]]) -> Handler:
    """A POST handler: run `action` as the token's subject within its tenant scope, answer
    with the job after it."""

    async def handle(request: web.Request) -> web.Response:
        ident = job_id(request)
        principal = request[PRINCIPAL]
        async with request.app[DATABASE].connection() as conn:
            await action(conn, ident, actor=token_subject(principal.subject),
                         tenants=principal.tenants)
            return ok(await admin.get_job(conn, ident, tenants=principal.tenants))

    return handle


async def discard_job(request: web.Request) -> web.Response:
    """DELETE /v1/jobs/{id}: 204, or 409 for a running job."""
    ident = job_id(request)
    principal = request[PRINCIPAL]
    async with request.app[DATABASE].connection() as conn:
        await admin.discard(conn, ident, actor=token_subject(principal.subject),
                            tenants=principal.tenants)
    return web.Response(status=204)


def _pause_scope(request: web.Request) -> dict[str, str | None]:
    """The tenant and kind query parameters of a pause or resume, checked: BadRequestError for a
    bad name, PauseScopeError (403) for neither, a scope of everything, which is refused as
    a kind for every tenant is refused to a scoped token (both are well-formed requests)."""
    kind = _query_match(request, "kind", KIND_NAME, "a kind name (lower-case identifier)")
    tenant = _query_tenant(request)
    try:
        check_scope(tenant, kind)
    except ValueError as exc:
        raise PauseScopeError(f"{exc}: give the tenant and/or kind query parameters") from None
    return {"tenant": tenant, "kind": kind}


async def list_pauses(request: web.Request) -> web.Response:
    """GET /v1/pauses: the paused scopes holding the token's tenants."""
    async with request.app[DATABASE].connection() as conn:
        return ok({"items": await pauses.list_pauses(conn, tenants=_tenants(request))})


async def pause(request: web.Request) -> web.Response:
    """POST /v1/pauses?tenant&kind&reason: 201 paused, 200 when it was paused already."""
    scope = _pause_scope(request)
    try:
        reason = check_reason(request.query.get("reason"))
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None
    principal = request[PRINCIPAL]
    async with request.app[DATABASE].connection() as conn:
        row, created = await pauses.pause(
            conn, **scope, reason=reason, actor=token_subject(principal.subject),
            tenants=principal.tenants)
    return ok(row, status=201 if created else 200)


async def resume(request: web.Request) -> web.Response:
    """DELETE /v1/pauses?tenant&kind: the pause that ended; 409 when it was not paused."""
    scope = _pause_scope(request)
    principal = request[PRINCIPAL]
    async with request.app[DATABASE].connection() as conn:
        row = await pauses.resume(conn, **scope, actor=token_subject(principal.subject),
                                  tenants=principal.tenants)
    return ok(row)


async def overview(request: web.Request) -> web.Response:
    """GET /v1/overview: live counts with the ready backlog's age, lanes, rate-limited pairs."""
    lanes = request.app[LANES]
    async with request.app[DATABASE].connection() as conn:
        return ok(await gather_overview(conn, tenants=_tenants(request), lanes=lanes))


async def whoami(request: web.Request) -> web.Response:
    """GET /v1/me: the token's subject and tenant scope (the console's sign-in check)."""
    principal = request[PRINCIPAL]
    return ok({"sub": principal.subject, "tenants": principal.scope})


async def stats(request: web.Request) -> web.Response:
    """GET /v1/stats: counts per (tenant, kind, status) and totals per status."""
    async with request.app[DATABASE].connection() as conn:
        rows = await admin.job_counts(conn, tenants=_tenants(request))
    counts = [{"tenant": r["tenant_key"], "tenant_id": r["tenant_id"], "kind": r["job_kind"],
               "status": r["status"], "jobs": int(r["jobs"])} for r in rows]
    totals: dict[str, int] = {}
    for row in counts:
        totals[row["status"]] = totals.get(row["status"], 0) + row["jobs"]
    return ok({"counts": counts, "totals": totals})


async def openapi(_: web.Request) -> web.Response:
    """GET /openapi.json (no token needed)."""
    return ok(document())


async def healthz(_: web.Request) -> web.Response:
    """GET /healthz for the API's own liveness probe (no token needed): 200 while the process
    answers, also while the database is away (a restart would not bring it back)."""
    return ok({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz (no token needed): 200 when the database answers and is migrated, else
    503 with the reasons, as a worker's /readyz."""
    problems = await request.app[DATABASE].check()
    if problems:
        return ok({"status": "not ready", "problems": problems}, status=503)
    return ok({"status": "ready"})


async def console_page(_: web.Request) -> web.FileResponse:
    """GET /console/: the console's page (its scripts then call the API with a token)."""
    return web.FileResponse(CONSOLE_FILES / "index.html",
                            headers={"Cache-Control": "no-cache"})


CONSOLE_ASSETS = ("console.css", "console.js", "favicon.svg")
"""The files the console's page loads, each served by a route of its own: any other path
under /console/ is the router's 404, a problem response like every error (a static route
answers a missing file with an empty body of its own)."""


def _console_asset(name: str) -> Handler:
    async def serve(_: web.Request) -> web.FileResponse:
        return web.FileResponse(CONSOLE_FILES / name, headers={"Cache-Control": "no-cache"})

    serve.__doc__ = f"GET /console/{name}: a file of the console."
    return serve


async def to_console(_: web.Request) -> web.Response:
    """GET / and /console: to the console."""
    raise web.HTTPFound(CONSOLE_PATH)


def build_app(database: DatabaseLink | AsyncConnectionPool[Any], verifier: TokenVerifier,
              lanes: Sequence[Mapping[str, Any]] = ()) -> web.Application:
    """The admin API and console on `database` (a link the caller started, or a pool it
    opened: dict rows), verifying with `verifier`; `lanes` describe the pool's lanes for the
    overview (plain dicts with name, kinds, exclude_kinds, tenants, workers_per_pod,
    min_replicas, max_replicas). The caller closes `database`."""
    app = web.Application(middlewares=[problems, authenticate], client_max_size=MAX_BODY)
    app[DATABASE] = (database if isinstance(database, DatabaseLink)
                     else DatabaseLink.serving(database))
    app[VERIFIER] = verifier
    app[LANES] = tuple(lanes)
    app.on_response_prepare.append(_security_headers)
    routes = app.router
    routes.add_get("/v1/me", whoami, allow_head=False)
    routes.add_get("/v1/overview", overview, allow_head=False)
    routes.add_get("/v1/dlq", list_dlq, allow_head=False)
    routes.add_get("/v1/jobs/{id}", get_job, allow_head=False)
    routes.add_get("/v1/audit/jobs/{id}", get_job_history, allow_head=False)
    routes.add_get("/v1/audit/entries/{id}", get_audit_entry, allow_head=False)
    routes.add_delete("/v1/jobs/{id}", discard_job)
    routes.add_post("/v1/jobs/{id}/replay", _action(admin.replay))
    routes.add_post("/v1/jobs/{id}/stop", _action(admin.stop))
    routes.add_get("/v1/pauses", list_pauses, allow_head=False)
    routes.add_post("/v1/pauses", pause)
    routes.add_delete("/v1/pauses", resume)
    routes.add_get("/v1/stats", stats, allow_head=False)
    routes.add_get("/openapi.json", openapi, allow_head=False)
    routes.add_get("/healthz", healthz, allow_head=False)
    routes.add_get("/readyz", readyz, allow_head=False)
    routes.add_get("/", to_console, allow_head=False)
    routes.add_get("/console", to_console, allow_head=False)
    routes.add_get(CONSOLE_PATH, console_page, allow_head=False)
    for name in CONSOLE_ASSETS:
        routes.add_get(CONSOLE_PATH + name, _console_asset(name), allow_head=False)
    return app
