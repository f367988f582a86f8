"""Admin actions on jobs: DLQ list, replay, discard, stop, show, status.

Lists carry bounded previews of payloads and errors; one job's own read carries them whole.

Each takes a connection with dict rows and runs in the caller's transaction; each change
writes its audit row with `actor` as `actor_principal_id`.

`tenants` restricts a call to the jobs of those tenant keys (an admin token scoped to some
tenants); None means every tenant (the CLI, a platform-wide token). A job of another tenant
is reported as not found, so that ids of other tenants' jobs do not leak. Audit rows record
the scope as `tenant_scope` in their payload: `"*"` or the list of keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from jobpool.core.kinds import check_kind_name
from jobpool.db.queries import Many, One, Row
from jobpool.db.tenant_lookup import resolve_tenant as resolve_tenant  # its home for the worker too
from jobpool.errors import JobNotFoundError, JobStateError, UnknownKindError

DISCARD_JOB = One("discard_job")
GET_JOB = One("get_job")
JOB_COUNTS = Many("job_counts")
KIND_EXISTS = One("kind_exists")
LIST_KINDS = Many("list_kinds")
LIST_DLQ = Many("list_dlq")
REPLAY_JOB = One("replay_job")
STOP_JOB = One("stop_job")

STATUSES = ("pending", "running", "done", "dlq", "failed")
"""The values of `mdm.job_status` (`failed` is the manual stop flag)."""


MAX_JOB_ID = 9_223_372_036_854_775_807
"""Job ids are bigint."""
MAX_PAGE = 1000
"""Most DLQ rows one call lists (CLI and API)."""
DEFAULT_PAGE = 100
"""DLQ rows listed when no limit is given."""

PREVIEW_CHARS = 500
"""Characters of a payload's JSON text that a list shows (DLQ, job history); the whole
payload is the job's own (`get_job`). With MAX_PAGE, this bounds a page whatever the
payloads hold."""
ERROR_PREVIEW_CHARS = 500
"""Characters of a last error that a list shows."""
PREVIEW_READ_LIMIT = 32 * 1024
"""Stored bytes (compressed, as jsonb keeps it) up to which a payload is read to cut its
preview; a bigger one gets none (its size and `payload_truncated` only): cutting a preview
means reading the whole value, 0.1 s and more for each of tens of megabytes."""


def preview_params() -> dict[str, int]:
    """The preview bounds, as the list queries' parameters."""
    return {"preview_chars": PREVIEW_CHARS, "error_chars": ERROR_PREVIEW_CHARS,
            "preview_read_limit": PREVIEW_READ_LIMIT}


Tenants = Sequence[str] | None
"""Tenant keys a call may touch; None: every tenant."""


def _scope(tenants: Tenants) -> Jsonb:
    return Jsonb("*" if tenants is None else sorted(tenants))


def _keys(tenants: Tenants) -> list[str] | None:
    return None if tenants is None else list(tenants)


async def get_job(conn: AsyncConnection[Any], job_id: int, *, tenants: Tenants = None) -> Row:
    """Every column of job `job_id` plus `tenant_key`; raises JobNotFoundError (also for a
    job of a tenant outside `tenants`)."""
    row = await GET_JOB(conn, {"id": job_id, "tenants": _keys(tenants)})
    if row is None:
        raise JobNotFoundError(job_id)
    return row


DISCARD_HINTS: Mapping[str, str] = {
    "pending": "stop it first", "running": "stop it first",
    "done": "done jobs are deleted by the queue's retention (cleanup_jobs), not by hand",
}
"""What to do instead of discarding a job of each status (a done job cannot be stopped)."""


STATE_RACE_TRIES = 5
"""Times an admin change is sent again when its statement matched nothing while a read right
after says it applies: the statement read the row (a job, a pause) before another session's
change committed (a worker moving the job to the DLQ, a resume of the scope), and the read
after sees it. Each try needs another change in between; five are never all lost to that in
practice."""


async def _act(conn: AsyncConnection[Any], query: One, params: Mapping[str, Any], *,
               action: str, statuses: frozenset[str], allowed: str, tenants: Tenants,
               hints: Mapping[str, str] | None = None) -> None:
    """Run the one-row `query` of `action` on job `params["id"]`, which applies to jobs of
    `statuses` only. Raises JobNotFoundError, or JobStateError naming the job's status,
    `allowed` (what the action applies to) and its hint from `hints`, changing nothing."""
    job_id = params["id"]
    for _ in range(STATE_RACE_TRIES):
        if await query(conn, params) is not None:
            return
        status = (await get_job(conn, job_id, tenants=tenants))["status"]
        if status not in statuses:
            hint = f"; {hints[status]}" if hints and status in hints else ""
            raise JobStateError(f"cannot {action} job {job_id}: it is {status}, {allowed}{hint}")
    raise JobStateError(f"cannot {action} job {job_id}: its status changed under each of "
                        f"{STATE_RACE_TRIES} tries; try again")


async def replay(conn: AsyncConnection[Any], job_id: int, *, actor: str,
                 tenants: Tenants = None) -> None:
    """DLQ → pending with attempts 0 and the claim cleared; audit `job_replay`.

    Raises JobNotFoundError, or JobStateError (changing nothing) unless the job is in the DLQ.
    """
    params = {"id": job_id, "actor": actor, "tenants": _keys(tenants), "scope": _scope(tenants)}
    await _act(conn, REPLAY_JOB, params, action="replay", statuses=frozenset({"dlq"}),
               allowed="only dlq jobs can be replayed", tenants=tenants)


async def discard(conn: AsyncConnection[Any], job_id: int, *, actor: str,
                  tenants: Tenants = None) -> None:
    """Delete a DLQ or stopped (`failed`) job; audit `job_discard` with a snapshot of the row.

    Raises JobNotFoundError, or JobStateError (changing nothing) for any other status, saying
    what to do instead: stop a pending or running job first; retention deletes done jobs.
    """
    params = {"id": job_id, "actor": actor, "tenants": _keys(tenants), "scope": _scope(tenants)}
    await _act(conn, DISCARD_JOB, params, action="discard", statuses=frozenset({"dlq", "failed"}),
               allowed="only dlq or stopped (failed) jobs can be discarded", tenants=tenants,
               hints=DISCARD_HINTS)


async def stop(conn: AsyncConnection[Any], job_id: int, *, actor: str,
               tenants: Tenants = None) -> None:
    """Set the manual stop flag `failed` (pending, running or dlq jobs); audit `job_stop`.

    A running job's worker is notified at commit and cancels its handler, whose
    transaction rolls back (worker/stops.py); its claim is gone, so nothing it wrote commits.
    Raises JobNotFoundError, or JobStateError for a done or already stopped job.
    """
    params = {"id": job_id, "actor": actor, "tenants": _keys(tenants), "scope": _scope(tenants)}
    await _act(conn, STOP_JOB, params, action="stop",
               statuses=frozenset({"pending", "running", "dlq"}),
               allowed="only pending, running or dlq jobs can be stopped", tenants=tenants)


async def check_registered_kind(conn: AsyncConnection[Any], kind: str) -> None:
    """Raise UnknownKindError, with the registered kinds that look like it, for a `kind` that
    is not registered (ValueError for a name no kind can have): a filter or a scope by a
    misspelt kind would otherwise find nothing, and say nothing."""
    check_kind_name(kind)
    found = await KIND_EXISTS(conn, {"kind": kind})
    if not (found and found["registered"]):
        raise UnknownKindError(kind, [k["name"] for k in await LIST_KINDS(conn)])


async def list_dlq(
    conn: AsyncConnection[Any], *, tenant_id: uuid.UUID | None = None, kind: str | None = None,
    after: int = 0, limit: int = DEFAULT_PAGE, tenants: Tenants = None,
) -> list[Row]:
    """DLQ jobs with id > `after` (keyset pagination), oldest first, at most `limit`.

    Each row carries previews, not the big values: `payload_preview` (the first
    PREVIEW_CHARS characters of the payload's JSON text; None for a payload stored in more
    than PREVIEW_READ_LIMIT bytes), `payload_size` (bytes stored), `payload_truncated`,
    `last_error_preview` (ERROR_PREVIEW_CHARS characters), `last_error_length` (characters),
    `last_error_truncated`. The whole job is `get_job`'s. Raises UnknownKindError for a
    `kind` that is not registered (`check_registered_kind`).
    """
    if kind is not None:
        await check_registered_kind(conn, kind)
    return await LIST_DLQ(conn, {
        "tenant_id": tenant_id, "kind": kind, "after": after, "limit": limit,
        "tenants": _keys(tenants), **preview_params(),
    })


async def job_counts(conn: AsyncConnection[Any], *, tenants: Tenants = None) -> list[Row]:
    """Counts per (tenant_key, tenant_id, job_kind, status)."""
    return await JOB_COUNTS(conn, {"tenants": _keys(tenants)})
