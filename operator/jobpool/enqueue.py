"""Enqueue jobs on the caller's connection, inside the caller's transaction.

The job exists if and only if the caller's transaction commits; waiting workers are woken
by a NOTIFY that PostgreSQL delivers at that commit.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row

from jobpool.core.jsondata import MAX_DEPTH, text_problem, to_json_text
from jobpool.core.kinds import MAX_ATTEMPTS_RANGE, PRIORITY_RANGE, check_kind_name, check_whole
from jobpool.errors import UnknownKindError, UnknownTenantError
from jobpool.payloads import decode_payload, payload_json
from jobpool.registry import REGISTRY
from jobpool.sql import QUERIES

_ROUNDS = 5
"""Insert/look-up rounds for an idempotency key whose holder vanishes in between."""


@dataclass(frozen=True)
class NewJob:
    """One job to enqueue.

    tenant_id: the tenant's uuid. kind: a registered kind name. payload: a JSON object (dict;
    finite numbers, strings without NUL characters or lone surrogates, nested at most
    `jobpool.core.jsondata.MAX_DEPTH` levels), or an instance of the kind's payload model;
    where this process registered the kind with a model, the payload must match it
    (InvalidPayloadError otherwise). priority, max_attempts: None takes the kind's
    default. available_at: an aware datetime (a naive one is refused), None is now.
    idempotency_key: at most one job per (tenant, kind, key).
    """

    tenant_id: uuid.UUID | str
    kind: str
    payload: Any = field(default_factory=dict)
    priority: int | None = None
    available_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None


class Enqueued(NamedTuple):
    """The job's id, and whether this call created it (False: the idempotency key existed)."""

    id: int
    created: bool


def _tenant_id(job: NewJob) -> uuid.UUID:
    if isinstance(job.tenant_id, uuid.UUID):
        return job.tenant_id
    try:
        return uuid.UUID(job.tenant_id)
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"tenant_id must be a UUID, got {job.tenant_id!r}") from None


def _check_fields(job: NewJob) -> None:
    if not isinstance(job.kind, str):
        raise ValueError(f"kind must be a string, got {type(job.kind).__name__}")
    try:
        check_kind_name(job.kind)
    except ValueError:
        raise UnknownKindError(job.kind) from None
    if not isinstance(job.payload, dict):
        raise ValueError(
            f"payload of a job of kind {job.kind} must be a JSON object, "
            f"got {type(job.payload).__name__}")
    if job.idempotency_key is not None and not (
            isinstance(job.idempotency_key, str) and 1 <= len(job.idempotency_key) <= 512):
        raise ValueError("idempotency_key must be a string of 1 to 512 characters, got "
                         f"{job.idempotency_key!r:.80}")
    check_whole("max_attempts", job.max_attempts, *MAX_ATTEMPTS_RANGE)
    check_whole("priority", job.priority, *PRIORITY_RANGE)
    _check_aware("available_at", job.available_at)


def _check_aware(name: str, moment: datetime | None) -> None:
    """Refuse a naive datetime: PostgreSQL would read it in the session's time zone.

    The same wall-clock time is then a different instant on every connection whose TimeZone
    differs (hours early or late); an aware datetime (`datetime.now(UTC)`) means one instant.
    Raises ValueError naming `name`.
    """
    if moment is None:
        return
    if not isinstance(moment, datetime):
        raise ValueError(f"{name} must be a datetime, got {type(moment).__name__}")
    if moment.utcoffset() is None:
        raise ValueError(
            f"{name} is a naive datetime ({moment.isoformat()}): give it a time zone, e.g. "
            "datetime.now(UTC) + timedelta(...), so that it means the same instant on every "
            "connection")


def _check_data(job: NewJob, where: str) -> None:
    """Name the job's payload or idempotency key that PostgreSQL would refuse."""
    try:
        to_json_text(job.payload, name="payload")
    except ValueError as exc:
        raise ValueError(f"payload of a job of kind {job.kind}{where} is refused: {exc}") from None
    problem = None if job.idempotency_key is None else text_problem(job.idempotency_key)
    if problem is not None:
        raise ValueError(f"idempotency_key of a job of kind {job.kind}{where} {problem}")


def _typed(job: NewJob) -> NewJob:
    """`job` with its payload checked against its kind's model, where this process registered
    one, and a model instance turned into its JSON object; raises InvalidPayloadError."""
    spec = REGISTRY.find(job.kind) if isinstance(job.kind, str) else None
    if spec is not None and spec.payload is not None:
        decode_payload(job.kind, spec.payload, job.payload)
    payload = payload_json(job.payload)
    return job if payload is job.payload else replace(job, payload=payload)


def _params(jobs: Sequence[NewJob], actor: str | None, notify: bool) -> dict[str, Any]:
    """The parameters of `enqueue_jobs`: the jobs as one JSON array text, checked first.

    The array is serialised and checked once (each payload sits two levels deep in it);
    only when that fails are the jobs checked one by one, to name the one at fault.
    """
    rows = []
    jobs = [_typed(job) for job in jobs]
    for job in jobs:
        _check_fields(job)
        rows.append({
            "tenant_id": str(_tenant_id(job)), "job_kind": job.kind, "payload": job.payload,
            "priority": job.priority, "available_at": _json_time(job.available_at),
            "idempotency_key": job.idempotency_key, "max_attempts": job.max_attempts})
    try:
        text = to_json_text(rows, name="jobs", limit=MAX_DEPTH + 2)
    except ValueError as exc:
        for index, job in enumerate(jobs):
            _check_data(job, f" (number {index} of the batch)" if len(jobs) > 1 else "")
        raise ValueError(f"cannot enqueue: {exc}") from None
    return {"jobs": text, "actor": actor, "notify": notify}


def _json_time(moment: datetime | None) -> str | None:
    """Text PostgreSQL reads as timestamptz (`_check_fields` refused naive datetimes)."""
    return None if moment is None else moment.isoformat()


def _key(tenant: Any, kind: str, idem: str) -> tuple[str, str, str]:
    return (str(tenant), kind, idem)


def _assign(
    jobs: Sequence[NewJob], pending: list[int], inserted: list[dict[str, Any]],
    results: list[Enqueued | None],
) -> list[int]:
    """Give inserted ids to the jobs at `pending`; return the keyed ones still without an id."""
    by_key = {
        _key(row["tenant_id"], row["job_kind"], row["idempotency_key"]): row["id"]
        for row in inserted if row["idempotency_key"] is not None
    }
    unkeyed = iter(sorted(row["id"] for row in inserted if row["idempotency_key"] is None))
    unresolved: list[int] = []
    for index in pending:
        job = jobs[index]
        if job.idempotency_key is None:
            results[index] = Enqueued(next(unkeyed), True)
            continue
        key = _key(_tenant_id(job), job.kind, job.idempotency_key)
        if key in by_key:
            results[index] = Enqueued(by_key.pop(key), True)
        else:
            unresolved.append(index)
    return unresolved


def _assign_existing(
    jobs: Sequence[NewJob], pending: list[int], existing: list[dict[str, Any]],
    results: list[Enqueued | None],
) -> list[int]:
    found = {_key(r["tenant_id"], r["job_kind"], r["idempotency_key"]): r["id"] for r in existing}
    missing: list[int] = []
    for index in pending:
        job = jobs[index]
        assert job.idempotency_key is not None
        key = _key(_tenant_id(job), job.kind, job.idempotency_key)
        if key in found:
            results[index] = Enqueued(found[key], False)
        else:
            missing.append(index)
    return missing


def _lookup_params(jobs: Sequence[NewJob], indexes: list[int]) -> dict[str, Any]:
    return {
        "tenant_ids": [_tenant_id(jobs[i]) for i in indexes],
        "kinds": [jobs[i].kind for i in indexes],
        "idempotency_keys": [jobs[i].idempotency_key for i in indexes],
    }


_FK_DETAIL = re.compile(r"Key \((?P<column>\w+)\)=\((?P<value>.*)\) is not present")


def _translate(exc: psycopg.errors.ForeignKeyViolation) -> Exception:
    match = _FK_DETAIL.search(exc.diag.message_detail or "")
    value = match["value"] if match else "?"
    if match and match["column"] == "job_kind":
        return UnknownKindError(value)
    if match and match["column"] == "tenant_id":
        return UnknownTenantError(value)
    return exc


def _finish(results: list[Enqueued | None]) -> list[Enqueued]:
    if any(result is None for result in results):
        raise RuntimeError("an idempotency key kept vanishing while enqueueing; try again")
    return [result for result in results if result is not None]


async def enqueue_many(
    conn: AsyncConnection[Any], jobs: Sequence[NewJob], *, actor: str | None = None,
    notify: bool = True,
) -> list[Enqueued]:
    """Enqueue `jobs` in one round trip on `conn`, in the caller's transaction.

    Returns one Enqueued per job, in order. A job whose idempotency key exists for its
    (tenant, kind) gets the existing job's id with created=False, also when a concurrent
    inserter commits or rolls back first. `actor` is the audit principal (default: the
    database role). `notify` False sends no NOTIFY: PostgreSQL serialises the commits of
    transactions that notify, so many concurrent enqueuers may skip it and leave waiting
    workers to find the jobs by polling (`--poll-interval`). Raises ValueError naming the
    job and the problem for a bad payload or field (before anything is sent; the rules are in
    the README, "Enqueueing from a service"), UnknownKindError, UnknownTenantError (the
    caller's transaction is then aborted, as with any failed statement).
    """
    if not jobs:
        return []
    results: list[Enqueued | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    async with conn.cursor(row_factory=dict_row) as cur:
        for _ in range(_ROUNDS):
            try:
                await cur.execute(
                    QUERIES["enqueue_jobs"].text,
                    _params([jobs[i] for i in pending], actor, notify),
                )
            except psycopg.errors.ForeignKeyViolation as exc:
                raise _translate(exc) from exc
            keyed = _assign(jobs, pending, await cur.fetchall(), results)
            if not keyed:
                break
            await cur.execute(QUERIES["find_idempotent_jobs"].text, _lookup_params(jobs, keyed))
            pending = _assign_existing(jobs, keyed, await cur.fetchall(), results)
            if not pending:
                break
    return _finish(results)


async def enqueue(
    conn: AsyncConnection[Any],
    *,
    tenant_id: uuid.UUID | str,
    kind: str,
    payload: Any = None,
    priority: int | None = None,
    available_at: datetime | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    actor: str | None = None,
    notify: bool = True,
) -> Enqueued:
    """Enqueue one job on `conn` in the caller's transaction; see `enqueue_many`."""
    job = NewJob(tenant_id, kind, {} if payload is None else payload, priority, available_at,
                 idempotency_key, max_attempts)
    return (await enqueue_many(conn, [job], actor=actor, notify=notify))[0]


def enqueue_many_sync(
    conn: Connection[Any], jobs: Sequence[NewJob], *, actor: str | None = None,
    notify: bool = True,
) -> list[Enqueued]:
    """`enqueue_many` for a synchronous psycopg connection."""
    if not jobs:
        return []
    results: list[Enqueued | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    with conn.cursor(row_factory=dict_row) as cur:
        for _ in range(_ROUNDS):
            try:
                params = _params([jobs[i] for i in pending], actor, notify)
                cur.execute(QUERIES["enqueue_jobs"].text, params)
            except psycopg.errors.ForeignKeyViolation as exc:
                raise _translate(exc) from exc
            keyed = _assign(jobs, pending, cur.fetchall(), results)
            if not keyed:
                break
            cur.execute(QUERIES["find_idempotent_jobs"].text, _lookup_params(jobs, keyed))
            pending = _assign_existing(jobs, keyed, cur.fetchall(), results)
            if not pending:
                break
    return _finish(results)


def enqueue_sync(conn: Connection[Any], **job: Any) -> Enqueued:
    """`enqueue` for a synchronous psycopg connection (same keyword arguments)."""
    actor = job.pop("actor", None)
    notify = job.pop("notify", True)
    job["payload"] = {} if job.get("payload") is None else job["payload"]
    return enqueue_many_sync(conn, [NewJob(**job)], actor=actor, notify=notify)[0]
