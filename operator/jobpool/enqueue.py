"""Enqueue jobs on the caller's connection, inside the caller's transaction.

The job exists if and only if the caller's transaction commits; waiting workers are woken
by a NOTIFY that PostgreSQL delivers at that commit.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, LiteralString, NamedTuple

import msgspec
import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.rows import tuple_row

from jobpool.core.jsondata import MAX_DEPTH, json_type, text_problem, to_json_text
from jobpool.core.kinds import MAX_ATTEMPTS_RANGE, PRIORITY_RANGE, check_kind_name, check_whole
from jobpool.core.tenants import tenant_uuid
from jobpool.db.queries import Many, One
from jobpool.errors import InvalidPayloadError, UnknownKindError, UnknownTenantError
from jobpool.payloads import decode_payload, payload_json
from jobpool.registry import REGISTRY
from jobpool.trace_context import current_trace_context

ENQUEUE_JOBS = Many("enqueue_jobs")
ENQUEUE_UNKEYED_JOBS = One("enqueue_unkeyed_jobs")
FIND_IDEMPOTENT_JOBS = Many("find_idempotent_jobs")

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


def _tenant_text(job: NewJob) -> str:
    """The job's tenant id as PostgreSQL writes a uuid; raises ValueError for a non-UUID."""
    return str(tenant_uuid(job.tenant_id))


def _kind_model(kind: Any) -> type[msgspec.Struct] | None:
    """The payload model this process registered for `kind` (None: none, or not registered
    here). Raises ValueError for a kind that is not a string, UnknownKindError for a name no
    kind can have."""
    if not isinstance(kind, str):
        raise ValueError(f"kind must be a string, got {type(kind).__name__}")
    try:
        check_kind_name(kind)
    except ValueError:
        raise UnknownKindError(kind) from None
    spec = REGISTRY.find(kind)
    return None if spec is None else spec.payload


EARLIEST_TIME = datetime(1, 1, 2, tzinfo=UTC)
LATEST_TIME = datetime(9999, 12, 31, tzinfo=UTC)
"""The job times the schema takes (the checks `aa_job_<column>_in_range`, from EARLIEST_TIME up
to, not including, LATEST_TIME): every Python datetime of them reads back in any time zone."""


def _check_aware(name: str, moment: datetime | None) -> None:
    """Refuse a naive datetime: PostgreSQL would read it in the session's time zone.

    The same wall-clock time is then a different instant on every connection whose TimeZone
    differs (hours early or late); an aware datetime (`datetime.now(UTC)`) means one instant.
    Also refuse an instant outside the schema's range (`EARLIEST_TIME`, `LATEST_TIME`), which
    the database would refuse with a bare check violation. Raises ValueError naming `name`.
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
    if not EARLIEST_TIME <= moment < LATEST_TIME:
        raise ValueError(f"{name} {moment.isoformat()} is outside the times a job can hold "
                         f"(from {EARLIEST_TIME.isoformat()} up to, not including, "
                         f"{LATEST_TIME.isoformat()})")


def _place(index: int, count: int) -> str:
    """Where job `index` (from 0) is in a batch of `count`, as errors begin with it (nothing
    for a batch of one)."""
    return f"job {index + 1} of {count} in the batch: " if count > 1 else ""


def _checked_fields(job: NewJob, payload: Any) -> str | None:
    """Check the fields of `job` other than its kind and tenant, with its `payload` as JSON
    data; return its idempotency key. Raises ValueError naming the field."""
    kind = job.kind
    if not isinstance(payload, dict):
        raise ValueError(f"payload of a job of kind {kind} must be a JSON object, "
                         f"got {json_type(payload)}")
    key = job.idempotency_key
    if key is not None:
        if not (isinstance(key, str) and 1 <= len(key) <= 512):
            raise ValueError("idempotency_key must be a string of 1 to 512 characters, "
                             f"got {key!r:.80}")
        problem = text_problem(key)
        if problem is not None:
            raise ValueError(f"idempotency_key of a job of kind {kind} {problem}")
    check_whole("max_attempts", job.max_attempts, *MAX_ATTEMPTS_RANGE)
    check_whole("priority", job.priority, *PRIORITY_RANGE)
    _check_aware("available_at", job.available_at)
    return key


class _Batch:
    """The jobs of one call, checked, as the columns the enqueue statements take.

    Each job is checked in order (the first one at fault raises): its kind, its payload
    against the kind's model where this process registered one (InvalidPayloadError), its
    fields (ValueError naming the field), its idempotency key's text, its tenant id. A
    kind's checks and a tenant id's parsing run once per distinct value, not once per job.
    The payloads are serialised and checked as one JSON array; only when that fails are they
    checked one by one, to name the job at fault. Raises before anything is sent.
    """

    def __init__(self, jobs: Sequence[NewJob]) -> None:
        self.trace_context = current_trace_context()
        models: dict[Any, type[msgspec.Struct] | None] = {}
        tenants: dict[Any, str] = {}
        self.tenant_ids: list[str] = []
        self.kinds: list[str] = []
        payloads: list[Any] = []
        priorities: list[int | None] = []
        times: list[datetime | None] = []
        attempts: list[int | None] = []
        keys: list[str | None] = []
        count = len(jobs)
        for index, job in enumerate(jobs):
            kind = job.kind
            try:
                try:
                    model = models[kind]
                except (KeyError, TypeError):
                    model = models[kind] = _kind_model(kind)
                payload = job.payload
                if model is not None:
                    decode_payload(kind, model, payload)
                payload = payload_json(payload)
                key = _checked_fields(job, payload)
                try:
                    tenant = tenants[job.tenant_id]
                except KeyError:
                    tenant = tenants[job.tenant_id] = _tenant_text(job)
                except TypeError:  # unhashable: not a UUID either
                    tenant = _tenant_text(job)
            except UnknownKindError as exc:  # a name no kind can have
                if count == 1:
                    raise
                raise UnknownKindError(exc.kind, place=_place(index, count)) from None
            except ValueError as exc:  # InvalidPayloadError too: the same class, placed
                if count == 1:
                    raise
                placed = InvalidPayloadError if isinstance(exc, InvalidPayloadError) else ValueError
                raise placed(f"{_place(index, count)}{exc}") from None
            self.tenant_ids.append(tenant)
            self.kinds.append(kind)
            payloads.append(payload)
            priorities.append(job.priority)
            times.append(job.available_at)
            attempts.append(job.max_attempts)
            keys.append(key)
        try:
            self.payloads = to_json_text(payloads, name="payloads", limit=MAX_DEPTH + 1)
        except ValueError as exc:
            for index, (job, payload) in enumerate(zip(jobs, payloads, strict=True)):
                try:
                    to_json_text(payload, name="payload")
                except ValueError as problem:
                    raise ValueError(f"{_place(index, count)}payload of a job of kind "
                                     f"{job.kind} is refused: {problem}") from None
            # each payload passes alone: together they are past what one jsonb value holds
            raise ValueError(f"cannot enqueue the {count} jobs in one batch: their payloads "
                             f"together are more JSON than one jsonb value holds ({exc}); "
                             "enqueue them in smaller batches") from None
        self.priorities = _numbers(priorities)
        self.times = None if times.count(None) == count else times
        self.attempts = _numbers(attempts)
        self.keys = keys
        self.keyed = keys.count(None) != count
        self.identities: list[tuple[str, str, str] | None] = []
        self._payload_values = payloads
        if self.keyed:  # how the rows that come back name a keyed job
            self.identities = [None if key is None else (tenant, kind, key)
                               for tenant, kind, key in zip(self.tenant_ids, self.kinds, keys,
                                                            strict=True)]

    def statement(self, pending: list[int], actor: str | None,
                  notify: bool) -> tuple[LiteralString, dict[str, Any]]:
        """The statement and parameters that enqueue the jobs at `pending` (indexes, in
        order): `enqueue_unkeyed_jobs` when none of them has an idempotency key."""
        everything = len(pending) == len(self.kinds)
        payloads = self.payloads
        if not everything:  # a later round: the keyed jobs whose key's holder vanished
            payloads = to_json_text([self._payload_values[i] for i in pending],
                                    name="payloads", limit=MAX_DEPTH + 1)

        def column(values: list[Any] | None) -> list[Any] | None:
            if values is None or everything:
                return values
            return [values[i] for i in pending]

        params = {"payloads": payloads, "tenant_ids": ",".join(column(self.tenant_ids) or ()),
                  "kinds": ",".join(column(self.kinds) or ()),
                  "priorities": column(self.priorities),
                  "available_at": column(self.times), "max_attempts": column(self.attempts),
                  "actor": actor, "notify": notify, "trace_context": self.trace_context}
        if not self.keyed:
            return ENQUEUE_UNKEYED_JOBS.text, params
        params["idempotency_keys"] = column(self.keys)
        return ENQUEUE_JOBS.text, params

    def take_ids(self, ids: list[int], results: list[Enqueued | None]) -> None:
        """Give the ids `enqueue_unkeyed_jobs` returned to the jobs, in batch order."""
        if len(ids) != len(results):
            raise RuntimeError(f"{len(ids)} jobs inserted for {len(results)} sent")
        for index, job_id in enumerate(sorted(ids)):
            results[index] = Enqueued(job_id, True)

    def take_inserted(self, pending: list[int], inserted: list[tuple[Any, ...]],
                      results: list[Enqueued | None]) -> list[int]:
        """Give the rows `enqueue_jobs` inserted to the jobs at `pending`; return the keyed
        ones still without an id (their key's holder existed)."""
        by_key = {(row[1], row[2], row[3]): row[0] for row in inserted if row[3] is not None}
        unkeyed = iter(sorted(row[0] for row in inserted if row[3] is None))
        unresolved: list[int] = []
        for index in pending:
            identity = self.identities[index]
            if identity is None:
                results[index] = Enqueued(next(unkeyed), True)
            elif identity in by_key:
                results[index] = Enqueued(by_key.pop(identity), True)
            else:
                unresolved.append(index)
        return unresolved

    def lookup(self, indexes: list[int]) -> dict[str, Any]:
        """The parameters of `find_idempotent_jobs` for the keyed jobs at `indexes`."""
        return {"tenant_ids": [self.tenant_ids[i] for i in indexes],
                "kinds": [self.kinds[i] for i in indexes],
                "idempotency_keys": [self.keys[i] for i in indexes]}

    def take_existing(self, pending: list[int], existing: list[tuple[Any, ...]],
                      results: list[Enqueued | None]) -> list[int]:
        """Give the existing jobs' ids to the keyed jobs at `pending` (created=False); return
        the ones whose key's holder vanished in between."""
        found = {(row[1], row[2], row[3]): row[0] for row in existing}
        missing: list[int] = []
        for index in pending:
            identity = self.identities[index]
            if identity in found:
                results[index] = Enqueued(found[identity], False)
            else:
                missing.append(index)
        return missing


def _numbers(values: list[int | None]) -> list[int | None] | None:
    """A column of whole numbers (None: all of them None), int subclasses as plain ints (an
    IntEnum would be sent as its name)."""
    if values.count(None) == len(values):
        return None
    return [None if value is None else int(value) for value in values]


_FK_DETAIL = re.compile(r"Key \((?P<column>\w+)\)=\((?P<value>.*)\) is not present")


def _translate(exc: psycopg.errors.ForeignKeyViolation, batch: _Batch) -> Exception:
    """The error of a job the database refused for want of its kind or tenant, beginning
    with the place of the first job of `batch` that has it."""
    match = _FK_DETAIL.search(exc.diag.message_detail or "")
    value = match["value"] if match else "?"
    if match and match["column"] == "job_kind":
        return UnknownKindError(value, REGISTRY.names(), _place_of(value, batch.kinds))
    if match and match["column"] == "tenant_id":
        return UnknownTenantError(value, place=_place_of(value, batch.tenant_ids))
    return exc


def _place_of(value: str, column: Sequence[str]) -> str:
    """`_place` of the first job whose `column` value is `value` ("" if none is)."""
    return next((_place(index, len(column)) for index, held in enumerate(column)
                 if held == value), "")


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
    docs/enqueueing.md), UnknownKindError, UnknownTenantError (the
    caller's transaction is then aborted, as with any failed statement).

    Where the `otel` extra is installed and a span is current, the jobs keep its trace
    context, so that their attempts' spans join the caller's trace (docs/tracing.md).
    """
    if not jobs:
        return []
    batch = _Batch(jobs)
    results: list[Enqueued | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    async with conn.cursor(row_factory=tuple_row, binary=True) as cur:
        for _ in range(_ROUNDS):
            query, params = batch.statement(pending, actor, notify)
            try:
                await cur.execute(query, params)
            except psycopg.errors.ForeignKeyViolation as exc:
                raise _translate(exc, batch) from exc
            if not batch.keyed:
                row = await cur.fetchone()
                batch.take_ids((row[0] if row else None) or [], results)
                break
            keyed = batch.take_inserted(pending, await cur.fetchall(), results)
            if not keyed:
                break
            await cur.execute(FIND_IDEMPOTENT_JOBS.text, batch.lookup(keyed))
            pending = batch.take_existing(keyed, await cur.fetchall(), results)
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
    batch = _Batch(jobs)
    results: list[Enqueued | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    with conn.cursor(row_factory=tuple_row, binary=True) as cur:
        for _ in range(_ROUNDS):
            query, params = batch.statement(pending, actor, notify)
            try:
                cur.execute(query, params)
            except psycopg.errors.ForeignKeyViolation as exc:
                raise _translate(exc, batch) from exc
            if not batch.keyed:
                row = cur.fetchone()
                batch.take_ids((row[0] if row else None) or [], results)
                break
            keyed = batch.take_inserted(pending, cur.fetchall(), results)
            if not keyed:
                break
            cur.execute(FIND_IDEMPOTENT_JOBS.text, batch.lookup(keyed))
            pending = batch.take_existing(keyed, cur.fetchall(), results)
            if not pending:
                break
    return _finish(results)


def enqueue_sync(conn: Connection[Any], **job: Any) -> Enqueued:
    """`enqueue` for a synchronous psycopg connection (same keyword arguments)."""
    actor = job.pop("actor", None)
    notify = job.pop("notify", True)
    job["payload"] = {} if job.get("payload") is None else job["payload"]
    return enqueue_many_sync(conn, [NewJob(**job)], actor=actor, notify=notify)[0]
