"""Pause and resume work per (tenant, kind), per kind and per tenant (`mdm.aa_pause`).

A paused scope's ready jobs stay pending where they are: the claim leaves them out as it
leaves out rate-limited pairs (no attempt used, the rows untouched), the scaler does not
count them as demand, and jobs already running finish. Scopes and what they hold:
`jobpool.core.pause_scopes`. Each function takes a connection with dict rows and runs in the
caller's transaction; each change writes its audit row (`work_paused`, `work_resumed`)
with `actor`.

`tenants` restricts a call as in `jobpool.admin`: the tenant keys an admin token is scoped
to (None: every tenant). A scoped caller may pause and resume its tenants' scopes only, not
a kind for every tenant, and sees the kind-wide pauses that hold its tenants.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from jobpool import admin
from jobpool.core.pause_scopes import check_reason, check_scope, scope_text, with_held_jobs
from jobpool.db.queries import Many, One
from jobpool.errors import JobpoolError, JobStateError

GET_PAUSE = One("get_pause")
LIST_PAUSES = Many("list_pauses")
OVERVIEW_COUNTS = Many("overview_counts")
PAUSE_SCOPE = One("pause_scope")
RESUME_SCOPE = One("resume_scope")

Row = dict[str, Any]


class PauseScopeError(JobpoolError):
    """A caller scoped to some tenants named a kind for every tenant (the API's 403)."""


class NotPausedError(JobStateError):
    """Resume of a scope that is not paused (the API's 409)."""


async def pause(conn: AsyncConnection[Any], *, tenant: str | None, kind: str | None,
                actor: str, reason: str | None = None,
                tenants: admin.Tenants = None) -> tuple[Row, bool]:
    """Pause the scope of `tenant` (a key or id; None: every tenant) and `kind` (None: every
    kind); audit `work_paused`. Returns the pause row (tenant, tenant_id, kind, paused_by,
    paused_at, reason) and whether this call paused it (False: it was paused already, and
    keeps its first actor and reason; nothing is written).

    Raises ValueError (no scope, a bad kind name, a reason over 500 characters),
    UnknownTenantError or UnknownKindError (each with a "did you mean"), PauseScopeError.
    """
    params = await _scope_params(conn, tenant, kind, tenants)
    values = {**params, "actor": actor, "reason": check_reason(reason), "scope": _scope(tenants)}
    for _ in range(admin.STATE_RACE_TRIES):  # a resume may make the answer stale
        row = await PAUSE_SCOPE(conn, values)
        current = await GET_PAUSE(conn, params)
        if current is not None:
            return current, row is not None
        # it was paused by another session, which resumed it before the read above
    raise JobStateError(f"{scope_text(params['tenant_key'], kind)} was paused and resumed by "
                        f"others under each of {admin.STATE_RACE_TRIES} tries; try again")


async def resume(conn: AsyncConnection[Any], *, tenant: str | None, kind: str | None,
                 actor: str, tenants: admin.Tenants = None) -> Row:
    """Resume the paused scope of `tenant` and `kind` (as `pause` names it); audit
    `work_resumed` and wake the workers of its kinds. Returns the pause that ended (tenant,
    tenant_id, kind, paused_by, paused_at, reason).

    Only that scope is resumed: a pair stays held while another paused scope covers it.
    Raises NotPausedError (naming what is paused) for a scope that is not paused, and the
    errors of `pause`.
    """
    params = await _scope_params(conn, tenant, kind, tenants)
    for _ in range(admin.STATE_RACE_TRIES):
        row = await RESUME_SCOPE(conn, {**params, "actor": actor, "scope": _scope(tenants)})
        if row is not None:
            del row["woken_kinds"]
            return {**row, "tenant": params["tenant_key"]}
        if await GET_PAUSE(conn, params) is None:
            paused = await LIST_PAUSES(conn, {"tenants": _keys(tenants)})
            named = "; ".join(scope_text(p["tenant"], p["kind"]) for p in paused) or "nothing"
            raise NotPausedError(f"{scope_text(params['tenant_key'], kind)} is not paused "
                                 f"(paused: {named})")
        # paused by another session after the resume's statement read the pauses
    raise JobStateError(f"{scope_text(params['tenant_key'], kind)} was resumed and paused by "
                        f"others under each of {admin.STATE_RACE_TRIES} tries; try again")


async def list_pauses(conn: AsyncConnection[Any], *, tenants: admin.Tenants = None,
                      counts: list[Row] | None = None) -> list[Row]:
    """The paused scopes holding the tenants `tenants` (None: all), oldest first, each with
    the `pending` and `ready` jobs it holds (from `counts`, the overview's counts rows, when
    the caller has read them; else read here)."""
    keys = _keys(tenants)
    pauses = await LIST_PAUSES(conn, {"tenants": keys})
    if counts is None:
        counts = await OVERVIEW_COUNTS(conn, {"tenants": keys}) if pauses else []
    return with_held_jobs(pauses, counts)


async def _scope_params(conn: AsyncConnection[Any], tenant: str | None, kind: str | None,
                        tenants: admin.Tenants) -> Row:
    """The query parameters of a scope (tenant_id, kind) and its tenant's key, checked."""
    check_scope(tenant, kind)
    if tenant is None and tenants is not None:
        raise PauseScopeError(
            f"a token scoped to tenants {', '.join(tenants)} cannot pause or resume a kind "
            "for every tenant: name one of its tenants")
    if kind is not None:
        await admin.check_registered_kind(conn, kind)
    tenant_id = tenant_key = None
    if tenant is not None:
        found_tenant = await admin.resolve_tenant(conn, tenant, tenants=tenants)
        tenant_id, tenant_key = found_tenant["id"], found_tenant["key"]
    return {"tenant_id": tenant_id, "tenant_key": tenant_key, "kind": kind}


def _scope(tenants: admin.Tenants) -> Jsonb:
    return Jsonb("*" if tenants is None else sorted(tenants))


def _keys(tenants: admin.Tenants) -> list[str] | None:
    return None if tenants is None else list(tenants)
