"""Test your own kinds against the real schema: run a job inline, drain a queue, list jobs.

Every function works on a migrated PostgreSQL database (`jobpool.db.migrate.migrate`), never
a fake: a handler's SQL, the job's transaction, the kind's retry policy and the DLQ are the
ones production runs. Jobs run through a real `Worker` (claim, the handler in the job's
transaction, done / retry / DLQ, rate limits); nothing waits for a backoff or a delayed job.
docs/writing-kinds.md, "Testing your kinds", has a complete pytest example.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from jobpool.admin import STATUSES, get_job, resolve_tenant
from jobpool.core.pause_scopes import covers, scope_text
from jobpool.db.connect import connect
from jobpool.db.queries import Exec, Many, One, Row
from jobpool.db.store import RELEASE_JOB, UNCAPPED, Completion, QueueStore, Written
from jobpool.db.store import register_kinds as register_specs
from jobpool.enqueue import enqueue
from jobpool.errors import JobStateError
from jobpool.registry import Registry, load_kind_modules
from jobpool.settings import Settings
from jobpool.settings import current as current_settings
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

FIND_JOBS = Many("find_jobs")
HOLD_KIND = Exec("hold_kind")
HOLD_PAIR_BUT = Exec("hold_pair_but")
LIST_PAUSES = Many("list_pauses")
MAKE_JOB_DUE = One("make_job_due")
RESTORE_DUE_TIME = Exec("restore_due_time")

ACTOR = "jobpool.testing"
"""The audit principal of the jobs these functions enqueue and run, and of what their
handlers write (`job.context.actor`)."""


class JobPausedError(JobStateError):
    """`run_pending` of a job that a pause holds (its tenant, its kind, or the pair): no
    worker claims it until that scope is resumed (docs/pause-and-stop.md)."""


@dataclass(frozen=True)
class JobRecord:
    """One row of `mdm.aa_job` as a test sees it.

    status: one of STATUSES. attempts: claims so far. available_at: when a pending job is
    due (after a retry: now + the backoff). last_error: `Type: message` of the last failure.
    result: what the handler returned (None when it returned nothing or has not finished).
    """

    id: int
    tenant_id: uuid.UUID
    kind: str
    payload: Any
    status: str
    priority: int
    attempts: int
    max_attempts: int
    available_at: datetime
    last_error: str | None
    result: Any
    idempotency_key: str | None

    @classmethod
    def from_row(cls, row: Row) -> JobRecord:
        """Build from an `mdm.aa_job` row (dict) whose `status` is text."""
        return cls(
            id=row["id"], tenant_id=row["tenant_id"], kind=row["job_kind"],
            payload=row["payload"], status=row["status"], priority=row["priority"],
            attempts=row["attempts"], max_attempts=row["max_attempts"],
            available_at=row["available_at"], last_error=row["last_error"],
            result=row["result"], idempotency_key=row["idempotency_key"],
        )


async def register_kinds(conn: AsyncConnection[Any], *, registry: Registry | None = None) -> None:
    """Register every loaded kind and its defaults, as a worker does when it starts.

    Loaded: the kinds of `registry`, by default the `jobpool.kinds` entry points and every
    `@jobpool.kind` imported so far.
    Runs in `conn`'s transaction. Needed before anything enqueues a kind (a service's code,
    a handler's follow-up), because `mdm.aa_job_kind` is what makes an unknown kind an
    error at enqueue time.
    """
    await register_specs(conn, (load_kind_modules() if registry is None else registry).specs())


async def run_job(
    dsn: str, kind: str, payload: dict[str, Any] | None = None, *,
    tenant: str | uuid.UUID, max_attempts: int | None = None, registry: Registry | None = None,
    settings: Settings | None = None,
) -> JobRecord:
    """Enqueue one `kind` job for `tenant` (a key or an id), run it once; return its row.

    Registers the kind first (its defaults apply). The outcome is the row's: `done` with
    `result`; `pending` with `last_error` and the next `available_at` after a failure that
    is retried (call `run_pending` to run the next attempt without waiting); `dlq` after a
    PermanentError or the last attempt. Jobs the handler enqueues are not run (`drain`).
    The handler runs as `ACTOR`, with `settings` (None: the process's) and the kinds of
    `registry` (None: those loaded, `jobpool.registry.REGISTRY`) as its `job.context`.

    Raises UnknownKindError (not loaded), UnknownTenantError, ValueError for a bad payload
    or tenant reference (see `jobpool.enqueue`), and whatever the worker raises for a
    database that is unreachable or not migrated.
    """
    spec = (load_kind_modules() if registry is None else registry).get(kind)
    async with await connect(dsn, autocommit=True) as conn, conn.transaction():
        await register_specs(conn, [spec])
        tenant_id = (await resolve_tenant(conn, str(tenant)))["id"]
        job_id, _ = await enqueue(conn, tenant_id=tenant_id, kind=kind, payload=payload,
                                  max_attempts=max_attempts, actor=ACTOR)
    return await run_pending(dsn, job_id, registry=registry, settings=settings)


async def run_pending(
    dsn: str, job_id: int, *, registry: Registry | None = None, settings: Settings | None = None,
) -> JobRecord:
    """Run pending job `job_id` once, now, even when it is not due yet; return its row.

    For the next attempt of a job `run_job` left pending, or a job your own code enqueued
    (and committed). Only that job runs: other jobs, also those the handler enqueues, stay.
    The job goes through the worker's own claim, so what keeps a worker from claiming it
    keeps this call from running it: a pause of its tenant, its kind or the pair raises
    JobPausedError (naming the pause) and leaves the job as it was, due when it was due.
    Raises JobNotFoundError, JobStateError when the job is not pending (the message names
    its status), UnknownKindError when its kind is not loaded. `registry` and `settings` as
    for `run_job`.
    """
    registry = load_kind_modules() if registry is None else registry
    async with await connect(dsn, autocommit=True) as conn:
        row = await get_job(conn, job_id)
        registry.get(row["job_kind"])
        _require_pending(row)
        moved = await MAKE_JOB_DUE(conn, {"id": job_id})
    stores: list[_OneJobStore] = []

    def one_job_store(pool: AsyncConnectionPool[Any], **kwargs: Any) -> QueueStore:
        stores.append(_OneJobStore(pool, job_id=job_id, **kwargs))
        return stores[-1]

    worker = Worker(dsn, registry, WorkerConfig(kinds=(row["job_kind"],),
                                                tenants=(str(row["tenant_id"]),), slots=1,
                                                until_empty=True, **_reach(settings)),
                    actor=ACTOR,
                    make_store=one_job_store, settings=settings)
    await worker.run()
    async with await connect(dsn, autocommit=True) as conn:
        if any(store.claimed for store in stores):
            return JobRecord.from_row(await get_job(conn, job_id))
        if moved is not None:
            await RESTORE_DUE_TIME(conn, {"id": job_id, **moved})
        row = await get_job(conn, job_id)
        _require_pending(row)  # another process took or finished it
        await _require_not_paused(conn, row)
    return JobRecord.from_row(row)


async def drain(
    dsn: str, *, kinds: Iterable[str] | None = None,
    tenants: Iterable[str | uuid.UUID] | None = None, registry: Registry | None = None,
    settings: Settings | None = None,
) -> Counter[str]:
    """Run every runnable job of `kinds` and `tenants` (None: all) until none is left.

    A real `Worker` in `until_empty` mode (4 slots), so jobs the handlers enqueue run too;
    jobs not due yet (delayed, or retried with a backoff) are left for later, never waited
    for. Returns the attempts by outcome: `done`, `retry` (pending again with a backoff),
    `dlq`, `rate_limited` (pending again until the tenant's next token); an empty Counter
    when nothing was runnable. Raises UnknownKindError or UnknownTenantError naming the
    kind or tenant, ValueError for an empty `kinds` or `tenants` (None means all).
    `registry` and `settings` as for `run_job`.
    """
    registry = load_kind_modules() if registry is None else registry
    chosen = None if kinds is None else _nonempty("kinds", [registry.get(k).name for k in kinds])
    refs = () if tenants is None else _nonempty("tenants", [str(t) for t in tenants])
    if refs:
        async with await connect(dsn, autocommit=True) as conn:
            for ref in refs:
                await resolve_tenant(conn, ref)  # a misspelt tenant would drain nothing
    outcomes: Counter[str] = Counter()
    worker = Worker(dsn, registry, WorkerConfig(kinds=chosen, tenants=refs, until_empty=True,
                                                **_reach(settings)),
                    actor=ACTOR, on_outcome=lambda _, outcome: outcomes.update((outcome,)),
                    settings=settings)
    await worker.run()
    return outcomes


async def enqueued(
    conn: AsyncConnection[Any], *, kind: str | None = None,
    tenant: str | uuid.UUID | None = None, status: str | None = None,
) -> list[JobRecord]:
    """The jobs of `kind`, `tenant` (a key or an id) and `status` (each None: any), oldest
    first, as `conn` sees them (inside its transaction, jobs it has not committed too).

    Raises ValueError for a status that is not one of STATUSES, UnknownTenantError.
    """
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    tenant_id = None if tenant is None else (await resolve_tenant(conn, str(tenant)))["id"]
    rows = await FIND_JOBS(conn, {"kind": kind, "tenant_id": tenant_id, "status": status})
    return [JobRecord.from_row(row) for row in rows]


def _require_pending(row: Row) -> None:
    if row["status"] != "pending":
        raise JobStateError(f"cannot run job {row['id']}: it is {row['status']}; only a "
                            "pending job can run")


async def _require_not_paused(conn: AsyncConnection[Any], row: Row) -> None:
    tenant = await resolve_tenant(conn, str(row["tenant_id"]))
    holding = [p for p in await LIST_PAUSES(conn, {"tenants": [tenant["key"]]})
               if covers(p, row["tenant_id"], row["job_kind"])]
    if holding:
        raise JobPausedError(
            f"cannot run job {row['id']}: it is paused ("
            + "; ".join(scope_text(p["tenant"], p["kind"]) for p in holding)
            + "); resume that to run it")


def _nonempty(name: str, values: list[str]) -> tuple[str, ...]:
    if not values:
        raise ValueError(f"{name} is empty, so nothing would run: pass None for all {name}")
    return tuple(values)


class _OneJobStore(QueueStore):
    """A worker's store whose first claim can take job `job_id` alone, and later ones none.

    That claim is the worker's own (`claim_jobs`: pauses, rate-limited pairs, tenant turns,
    the lease), made while a transaction beside it holds the job's kind row (an enqueue of
    the kind waits until the claim is over) and the other pending jobs of the job's (tenant,
    kind) pair (the claim skips them). A job of the pair that turned pending in between (a
    hand-back, a recovery, a replay) and was claimed instead is handed back in that
    transaction (pending again at its place when it ends, the attempt not counted) and the
    claim made again: only job `job_id` ever runs.
    """

    def __init__(self, pool: AsyncConnectionPool[Any], *, job_id: int, **kwargs: Any) -> None:
        super().__init__(pool, **kwargs)
        self.job_id = job_id
        self.tried = False
        self.claimed = False

    async def complete_and_claim(
        self, completions: Sequence[Completion], *, kinds: Sequence[str],
        tenants: Sequence[uuid.UUID] | None, limit: int, caps: Mapping[str, int] = UNCAPPED,
    ) -> Written:
        """Write the batched `done`s; claim the job if no claim was tried before."""
        if limit <= 0 or self.tried:
            if not completions:
                return Written(set(), [], set())
            return await super().complete_and_claim(
                completions, kinds=kinds, tenants=tenants, limit=0)
        self.tried = True
        held: set[int] = set()
        busy: set[int] = set()
        async with self.pool.connection() as conn, conn.transaction():
            await HOLD_KIND(conn, {"id": self.job_id})
            while True:
                await HOLD_PAIR_BUT(conn, {"id": self.job_id})
                written, rows, locked = await super().complete_and_claim(
                    completions, kinds=kinds, tenants=tenants, limit=1, caps=caps)
                held, busy, completions = held | written, busy | locked, ()
                others = [row for row in rows if row["id"] != self.job_id]
                if not others:
                    break
                for row in others:  # pending again when the hold ends, running until then
                    await RELEASE_JOB(conn, {"id": row["id"], "attempts": row["attempts"],
                                             "worker_id": self.worker_id, "delay": 0.0})
        self.claimed = bool(rows)
        return Written(held, rows, busy)


def _reach(settings: Settings | None) -> dict[str, Any]:
    """How the worker reaches its database, from `settings` (None: the process's): its
    `pooler` and `listen_dsn`, so that a test behind a transaction pooler runs as its
    workers do."""
    own = current_settings() if settings is None else settings
    return {"pooler": own.pooler, "listen_dsn": own.listen_dsn}
