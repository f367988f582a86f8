"""What the operations console's overview shows: live counts, lanes with their live workers,
running jobs and what holds their backlog (`core.lane_activity`), rate-limited pairs, paused
scopes, schedules with their last and next run.

`gather_overview` reads the database; the functions below it are pure and take the rows
(and the configured lanes) as arguments, so that the tenant scope is applied in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection

from jobpool.admin import preview_params
from jobpool.core.actors import actor_kind, actor_name
from jobpool.core.lane_activity import lane_activity
from jobpool.core.pause_scopes import with_held_jobs
from jobpool.core.ratelimit import WILDCARD_KIND, parse_tenant_limits_json
from jobpool.db.live_workers import live_workers, running_jobs
from jobpool.db.queries import Many, One, Row

AUDIT_ENTRY = One("audit_entry")
DATABASE_NOW = One("database_now")
JOB_HISTORY = Many("job_history")
LIST_PAUSES = Many("list_pauses")
LIST_SCHEDULES = Many("list_schedules")
OVERVIEW_COUNTS = Many("overview_counts")
SCOPED_RATE_LIMITS = Many("scoped_rate_limits")
WAITING_JOBS = Many("waiting_jobs")

MAX_HISTORY = 500
"""Audit rows of one job that its history lists (a job replayed this often is a bug)."""


async def gather_overview(conn: AsyncConnection[Any], *, tenants: Sequence[str] | None,
                          lanes: Sequence[Mapping[str, Any]]) -> Row:
    """The overview document of /v1/overview for a token scoped to `tenants` (None: all).

    Reads live jobs only (`pending`, `running`, `dlq`, each through its partial index), never
    the `done` or stopped ones, so its cost follows the live queue, not the retained history;
    live workers come from their registry (`jobpool.db.live_workers`).
    """
    keys = None if tenants is None else list(tenants)
    now = (await DATABASE_NOW(conn) or {})["now"]
    counts = [{**row, "jobs": int(row["jobs"]), "ready": int(row["ready"])}
              for row in await OVERVIEW_COUNTS(conn, {"tenants": keys})]
    limits = await SCOPED_RATE_LIMITS(conn, {"tenants": keys})
    waiting = await WAITING_JOBS(conn, {"tenants": keys})
    workers = scoped_workers(await live_workers(conn), tenants)
    running = await running_jobs(conn, tenants=keys)
    shown_lanes = scoped_lanes(lanes, tenants)
    paused = with_held_jobs(await LIST_PAUSES(conn, {"tenants": keys}), counts)
    return {
        "now": now,
        "counts": counts,
        "lanes": shown_lanes,
        "activity": [lane.as_dict()
                     for lane in lane_activity(shown_lanes, workers, running, counts)],
        "workers": workers,
        "running": running,
        "rate_limits": rate_limited_pairs(limits, waiting),
        "schedules": scoped_schedules(await LIST_SCHEDULES(conn), tenants),
        "paused": paused,
    }


async def job_history(conn: AsyncConnection[Any], job_id: int, *,
                      tenants: Sequence[str] | None) -> list[Row]:
    """The audit rows of job `job_id` (oldest first, at most MAX_HISTORY) that `tenants` may
    see, each with its actor's kind (`actor_kind`: person, token or service account) and name
    (`actor_name`, the actor without the kind's prefix); empty for a job of another tenant or
    one that never existed.

    Each row carries a preview of its payload (`payload_preview`, `payload_size`,
    `payload_truncated`, as `admin.list_dlq`): a discard's payload holds the whole job.
    """
    rows = await JOB_HISTORY(conn, {
        "id": job_id, "tenants": None if tenants is None else list(tenants),
        "limit": MAX_HISTORY, **preview_params()})
    return [with_actor(row) for row in rows]


def with_actor(row: Row) -> Row:
    """An audit row with its actor's kind and name beside the stored actor."""
    return {**row, "actor_kind": actor_kind(row["actor"]), "actor_name": actor_name(row["actor"])}


async def audit_entry(conn: AsyncConnection[Any], entry_id: int, *,
                      tenants: Sequence[str] | None) -> Row | None:
    """Audit row `entry_id` with its whole payload and its actor's kind and name, if `tenants`
    may see it (else None)."""
    row = await AUDIT_ENTRY(conn, {
        "id": entry_id, "tenants": None if tenants is None else list(tenants)})
    return None if row is None else with_actor(row)


def rate_limited_pairs(limits: Sequence[Mapping[str, Any]],
                       waiting: Sequence[Mapping[str, Any]]) -> list[Row]:
    """One entry per (tenant, kind) with a rate limit: its `rps` and `burst`, the jobs that
    wait for a later time (`waiting`) and when the first of them is due (`next_due_at`).

    limits: rows with `key` and `rate_limit` (the tenant's metadata.rate_limit as JSON text);
    waiting: rows with `tenant`, `kind`, `waiting`, `next_due_at`. A tenant's `*` limit is
    listed as kind `*`, with the waiting jobs of the kinds it covers. Entries the workers
    would drop as invalid are left out here too.
    """
    waits: dict[tuple[str, str], Mapping[str, Any]] = {
        (str(w["tenant"]), str(w["kind"])): w for w in waiting}
    pairs: list[Row] = []
    for row in limits:
        tenant = str(row["key"])
        parsed, _ = parse_tenant_limits_json(row["rate_limit"], tenant)
        for kind, limit in sorted(parsed.kinds.items()):
            covered = [w for (t, k), w in waits.items() if t == tenant and (
                k == kind or (kind == WILDCARD_KIND and k not in parsed.kinds))]
            dues = [w["next_due_at"] for w in covered]
            pairs.append({"tenant": tenant, "kind": kind, "rps": limit.rps,
                          "burst": limit.burst,
                          "waiting": sum(int(w["waiting"]) for w in covered),
                          "next_due_at": min(dues) if dues else None})
    return pairs


def scoped_schedules(rows: Sequence[Mapping[str, Any]],
                     tenants: Sequence[str] | None) -> list[Row]:
    """The schedules (`list_schedules` rows: name, kind, tenant, expression, next and last
    run, ...) a token scoped to `tenants` (None: all) may see: those of its tenants; the
    built-in ones (tenant `system`) only unscoped."""
    if tenants is None:
        return [dict(row) for row in rows]
    scope = set(tenants)
    return [dict(row) for row in rows if row["tenant"] in scope]


def scoped_lanes(lanes: Sequence[Mapping[str, Any]],
                 tenants: Sequence[str] | None) -> list[Row]:
    """The lanes a token scoped to `tenants` (None: all) may see, each with only those of
    its `tenants` in scope; a lane for every tenant (`tenants` empty) is always shown."""
    if tenants is None:
        return [dict(lane) for lane in lanes]
    scope = set(tenants)
    shown: list[Row] = []
    for lane in lanes:
        served = list(lane["tenants"])
        if not served:
            shown.append(dict(lane))
        elif scope.intersection(served):
            shown.append({**lane, "tenants": [t for t in served if t in scope]})
    return shown


def scoped_workers(workers: Sequence[Mapping[str, Any]],
                   tenants: Sequence[str] | None) -> list[Row]:
    """The live workers a token scoped to `tenants` (None: all) may see, each with only those
    of its `tenants` in scope; a worker for every tenant (`tenants` empty) is always shown.
    A worker configured with tenant ids is shown to unscoped tokens only."""
    rows = [{**w, "kinds": list(w["kinds"]), "tenants": list(w["tenants"])} for w in workers]
    if tenants is None:
        return rows
    scope = set(tenants)
    shown: list[Row] = []
    for worker in rows:
        served = worker["tenants"]
        if not served:
            shown.append(worker)
        elif scope.intersection(served):
            shown.append({**worker, "tenants": [t for t in served if t in scope]})
    return shown
