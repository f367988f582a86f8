"""Admin actions on jobs: DLQ list, replay, discard, stop, show, status.

Each takes a connection with dict rows and runs in the caller's transaction; each change
writes its audit row with `actor` as `actor_principal_id`.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection

from jobpool.core.tenants import tenant_id_of, tenant_ref
from jobpool.db.store import fetch_all, fetch_one
from jobpool.errors import JobNotFoundError, JobStateError, UnknownTenantError

STATUSES = ("pending", "running", "done", "dlq", "failed")
"""The values of `mdm.job_status` (`failed` is the manual stop flag)."""

Row = dict[str, Any]

MAX_JOB_ID = 9_223_372_036_854_775_807
"""Job ids are bigint."""
MAX_PAGE = 1000
"""Most DLQ rows one call lists (CLI and API)."""
DEFAULT_PAGE = 100
"""DLQ rows listed when no limit is given."""


async def get_job(conn: AsyncConnection[Any], job_id: int) -> Row:
    """Every column of job `job_id` plus `tenant_key`; raises JobNotFoundError."""
    row = await fetch_one(conn, "get_job", {"id": job_id})
    if row is None:
        raise JobNotFoundError(job_id)
    return row


async def _refuse(conn: AsyncConnection[Any], job_id: int, action: str, allowed: str) -> None:
    status = (await get_job(conn, job_id))["status"]
    raise JobStateError(f"cannot {action} job {job_id}: it is {status}, {allowed}")


async def replay(conn: AsyncConnection[Any], job_id: int, *, actor: str) -> None:
    """DLQ → pending with attempts 0 and the claim cleared; audit `job_replay`.

    Raises JobNotFoundError, or JobStateError (changing nothing) unless the job is in the DLQ.
    """
    if await fetch_one(conn, "replay_job", {"id": job_id, "actor": actor}) is None:
        await _refuse(conn, job_id, "replay", "only dlq jobs can be replayed")


async def discard(conn: AsyncConnection[Any], job_id: int, *, actor: str) -> None:
    """Delete a DLQ or stopped (`failed`) job; audit `job_discard` with a snapshot of the row.

    Raises JobNotFoundError, or JobStateError (changing nothing) for any other status: stop a
    pending or running job first.
    """
    if await fetch_one(conn, "discard_job", {"id": job_id, "actor": actor}) is None:
        await _refuse(conn, job_id, "discard",
                      "only dlq or stopped (failed) jobs can be discarded; stop it first")


async def stop(conn: AsyncConnection[Any], job_id: int, *, actor: str) -> None:
    """Set the manual stop flag `failed` (pending, running or dlq jobs); audit `job_stop`.

    A worker still running the job then loses its claim and changes nothing.
    Raises JobNotFoundError, or JobStateError for a done or already stopped job.
    """
    if await fetch_one(conn, "stop_job", {"id": job_id, "actor": actor}) is None:
        await _refuse(conn, job_id, "stop", "only pending, running or dlq jobs can be stopped")


async def list_dlq(
    conn: AsyncConnection[Any], *, tenant_id: uuid.UUID | None = None, kind: str | None = None,
    after: int = 0, limit: int = DEFAULT_PAGE,
) -> list[Row]:
    """DLQ jobs with id > `after` (keyset pagination), oldest first, at most `limit`."""
    return await fetch_all(conn, "list_dlq", {
        "tenant_id": tenant_id, "kind": kind, "after": after, "limit": limit,
    })


async def job_counts(conn: AsyncConnection[Any]) -> list[Row]:
    """Counts per (tenant_key, tenant_id, job_kind, status)."""
    return await fetch_all(conn, "job_counts")


async def resolve_tenant(conn: AsyncConnection[Any], ref: str) -> Row:
    """`{"id", "key"}` of the tenant whose key or id (a uuid, in any case) is `ref`.

    Raises ValueError for a `ref` that is neither a key nor a uuid, UnknownTenantError for
    one that names no tenant.
    """
    canonical = tenant_ref(ref)
    tenant_id = tenant_id_of(canonical)
    row = await fetch_one(conn, "resolve_tenant", {
        "key": canonical if tenant_id is None else None, "id": tenant_id})
    if row is None:
        raise UnknownTenantError(ref)
    return row
