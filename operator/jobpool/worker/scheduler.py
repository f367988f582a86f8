"""Schedules, carried out: every long-running worker declares its schedules and enqueues the
ticks that are due.

The decisions (ticks, the missed-tick policy, declarations) are `jobpool.core.schedules`; the
rows are `mdm.aa_schedule` (SQL in `sql/schedules.sql`). Exactly once across processes and
pods: a worker locks the due rows (`FOR UPDATE SKIP LOCKED`: a row another worker holds is
skipped, not waited for), enqueues each tick's job with the idempotency key
`schedule:<name>:<tick>` and moves the row's `next_run_at`, all in one transaction; the key
makes a second enqueue of a tick a no-op even if two processes disagree about a row.

Declarations: a worker declares the built-in `cleanup_jobs` schedule and the schedules in
`JOBPOOL_SCHEDULES` (JSON list as a pool file's `spec.schedules` writes it; the operator and
`jobpool run pool.yaml` set it) under its pool's owner (`core.schedules.schedule_owner`:
`<namespace>/<name>` from `JOBPOOL_POOL_NAMESPACE` and `JOBPOOL_POOL`), taking over those its
pool declared under an earlier version's owner (the name alone), and retires the schedules
its pool declared before and no longer does. The table is the truth from then on: the most
recently started worker of a pool wins; a name that another pool declared is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from jobpool.core.schedules import (
    BUILTIN_CLEANUP,
    BUILTIN_OWNER,
    MISSED_AFTER,
    Schedule,
    ScheduleError,
    check_owners,
    check_wait,
    former_owners,
    idempotency_key,
    parse_schedule,
    parse_schedules,
    plan_ticks,
    schedule_owner,
)
from jobpool.db.queries import Exec, Many, One, Row
from jobpool.db.store import QueueStore
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.errors import UnknownKindError, UnknownTenantError

log = logging.getLogger(__name__)

DECLARE_SCHEDULE = One("declare_schedule")
DECLARED_ELSEWHERE = Many("declared_elsewhere")
LOCK_DUE_SCHEDULES = Many("lock_due_schedules")
NEXT_SCHEDULE_DUE = One("next_schedule_due")
RECORD_SCHEDULE_RUN = Exec("record_schedule_run")
RETIRE_SCHEDULES = Many("retire_schedules")
SCHEDULE_CLOCK = One("schedule_clock")
TAKE_OVER_SCHEDULES = Many("take_over_schedules")

SCHEDULES_VARIABLE = "JOBPOOL_SCHEDULES"
BUILTIN_NAMES = frozenset({BUILTIN_CLEANUP})
LOCK_LIMIT = 100
"""Due schedules one transaction takes at most; the next check takes the rest."""
UNREADABLE_RETRY = MISSED_AFTER
"""Seconds before a declaration this worker could not read is looked at again."""


@dataclass(frozen=True)
class Declarations:
    """What a worker declares: `schedules` under `owner`, retiring the owner's others when
    `retire` (only a worker that was given the pool's list knows what the pool declares), and
    taking over those of them that the pool declared under a `former` owner name."""

    owner: str
    schedules: tuple[Schedule, ...]
    retire: bool
    former: tuple[str, ...] = ()


def declarations_for(pool: str | None, namespace: str | None, schedules: str | None,
                     builtin: Sequence[Schedule]) -> Declarations:
    """The built-in schedules plus `schedules` (the `JOBPOOL_SCHEDULES` JSON text, if set)
    under the owner of `pool` in `namespace` (`JOBPOOL_POOL`, `JOBPOOL_POOL_NAMESPACE`).

    Raises ScheduleError naming the variable and the bad field, e.g.
    `JOBPOOL_SCHEDULES[0].cron: ...`.
    """
    declared: tuple[Schedule, ...] = ()
    pool = pool.strip() if pool else None
    if schedules is not None and not pool:
        raise ScheduleError(f"{SCHEDULES_VARIABLE} needs JOBPOOL_POOL: a pool's schedules "
                            "belong to that pool (its name, which a pool file or the "
                            "operator sets), which alone changes and retires them")
    if schedules is not None:
        try:
            raw = json.loads(schedules)
        except ValueError as exc:
            raise ScheduleError(f"{SCHEDULES_VARIABLE}: not JSON ({exc})") from None
        declared = parse_schedules(raw, SCHEDULES_VARIABLE)
    return Declarations(schedule_owner(pool, namespace), (*builtin, *declared),
                        schedules is not None, former_owners(pool, namespace))


async def declare(conn: AsyncConnection[Any], declarations: Declarations) -> None:
    """Write the declarations in one transaction on `conn` (autocommit off is committed here).

    A new or changed schedule starts at its first tick after now; a built-in one (maintenance,
    which a new database needs at once) at its latest tick before now, and belongs to no pool.
    Schedules the pool declared under a former owner name are taken over first, keeping their
    place. Raises ScheduleError (`check_owners`), writing nothing, when another pool declared
    one of the names already.
    """
    owned = [s.name for s in declarations.schedules if s.name not in BUILTIN_NAMES]
    async with conn.transaction():
        clock = await SCHEDULE_CLOCK(conn)
        assert clock is not None
        if declarations.former and owned:
            for row in await TAKE_OVER_SCHEDULES(conn, {
                    "owner": declarations.owner, "former": list(declarations.former),
                    "names": owned}):
                log.info("schedule %s taken over by pool %r from its former owner name",
                         row["name"], declarations.owner)
        for schedule in declarations.schedules:
            builtin = schedule.name in BUILTIN_NAMES
            owner = BUILTIN_OWNER if builtin else declarations.owner
            await DECLARE_SCHEDULE(conn, {
                "name": schedule.name, "owner": owner, "kind": schedule.kind,
                "tenant": schedule.tenant, "expression": schedule.expression,
                "time_zone": schedule.zone if schedule.cron is not None else None,
                "missed": schedule.missed, "definition": Jsonb(schedule.to_json()),
                "next_run_at": (schedule.previous_tick(clock["now"]) if builtin
                                else schedule.next_tick(clock["now"]))})
        check_owners(declarations.owner, declarations.schedules, await DECLARED_ELSEWHERE(
            conn, {"names": owned, "owner": declarations.owner}))
        if declarations.retire:
            for row in await RETIRE_SCHEDULES(conn, {"owner": declarations.owner, "names": owned}):
                log.info("schedule %s retired: pool %r no longer declares it", row["name"],
                         declarations.owner)


@dataclass(frozen=True)
class TickRun:
    """What one check did for one schedule: the ticks taken (for an enqueueing schedule, their
    job ids and how many of those jobs this check created), the ticks dropped as missed, or
    the error that kept them out."""

    name: str
    ticks: tuple[datetime, ...]
    job_ids: tuple[int, ...]
    created: int
    missed: int
    error: str | None = None


async def enqueue_due_ticks(conn: AsyncConnection[Any], *, actor: str,
                            in_process: Collection[str] = ()) -> list[TickRun]:
    """Enqueue the due ticks of every due schedule no other worker holds, with their
    bookkeeping, in one transaction on `conn`; return what was done per schedule.

    A schedule whose job cannot be enqueued (unknown kind or tenant, a payload its kind's
    model refuses) records the error in `last_error`, and its ticks are dropped: they could
    never exist. Built-in schedules (`BUILTIN_NAMES`) enqueue nothing: those named in
    `in_process` have their due ticks recorded, and the caller runs their work itself after
    the commit (once, however many ticks were due); the others are left to a worker that can.
    `actor` is the audit principal of the enqueues.
    """
    runs: list[TickRun] = []
    unhandled = sorted(BUILTIN_NAMES - set(in_process))
    async with conn.transaction():
        for row in await LOCK_DUE_SCHEDULES(conn, {"limit": LOCK_LIMIT, "unhandled": unhandled}):
            runs.append(await _run_schedule(conn, row, actor, row["name"] in BUILTIN_NAMES))
    return runs


async def _run_schedule(conn: AsyncConnection[Any], row: Row, actor: str,
                        in_process: bool) -> TickRun:
    try:
        schedule = parse_schedule(row["definition"], f"schedule {row['name']}")
    except ScheduleError as exc:
        return await _unreadable(conn, row, exc)
    plan = plan_ticks(schedule, row["next_run_at"], row["now"])
    error: str | None = None
    job_ids: tuple[int, ...] = ()
    created = 0
    if plan.ticks and in_process:
        await RECORD_SCHEDULE_RUN(conn, {
            "name": schedule.name, "next_run_at": plan.next_run_at,
            "last_run_at": plan.ticks[-1], "last_job_id": None, "missed": plan.missed,
            "error": None})
        return TickRun(schedule.name, plan.ticks, (), 0, plan.missed)
    if plan.ticks:
        try:
            if row["tenant_id"] is None:
                raise UnknownTenantError(schedule.tenant)
            async with conn.transaction():
                enqueued = await enqueue_many(conn, [
                    NewJob(row["tenant_id"], schedule.kind, dict(schedule.payload),
                           idempotency_key=idempotency_key(schedule.name, tick))
                    for tick in plan.ticks], actor=actor)
            job_ids = tuple(job.id for job in enqueued)
            created = sum(job.created for job in enqueued)
        except (UnknownKindError, UnknownTenantError, ValueError, psycopg.DataError,
                psycopg.IntegrityError) as exc:  # the database's: a tenant deleted meanwhile
            error = f"{type(exc).__name__}: {exc}"[:4000]
            log.error("schedule %s: its ticks are not enqueued: %s", schedule.name, error)
    await RECORD_SCHEDULE_RUN(conn, {
        "name": schedule.name, "next_run_at": plan.next_run_at,
        "last_run_at": plan.ticks[-1] if job_ids else None,
        "last_job_id": job_ids[-1] if job_ids else None,
        "missed": plan.missed + (len(plan.ticks) if error else 0), "error": error})
    if plan.missed:
        log.warning("schedule %s: %d missed tick(s) dropped (missed: %s)", schedule.name,
                    plan.missed, schedule.missed)
    return TickRun(schedule.name, plan.ticks if job_ids else (), job_ids, created,
                   plan.missed, error)


async def _unreadable(conn: AsyncConnection[Any], row: Row, error: ScheduleError) -> TickRun:
    """A declaration this worker cannot read (a time zone its tz database lacks, a row of
    another version): record why and look again `UNREADABLE_RETRY` seconds later, so that
    it holds up neither the other schedules of this check nor the next checks."""
    text = f"{type(error).__name__}: {error}"[:4000]
    if row["last_error"] != text:
        log.error("schedule %s cannot be read here; tried again in %gs: %s", row["name"],
                  UNREADABLE_RETRY, text)
    await RECORD_SCHEDULE_RUN(conn, {
        "name": row["name"], "next_run_at": row["now"] + timedelta(seconds=UNREADABLE_RETRY),
        "last_run_at": None, "last_job_id": None, "missed": 0, "error": text})
    return TickRun(row["name"], (), (), 0, 0, text)


async def seconds_to_next_check(conn: AsyncConnection[Any]) -> float:
    """Seconds until the earliest schedule is due, by the database's clock (`check_wait`)."""
    row = await NEXT_SCHEDULE_DUE(conn)
    assert row is not None
    return check_wait(row["next_due"], row["now"])


async def keep_scheduled(
    store: QueueStore, declarations: Declarations, *, actor: str, online: asyncio.Event,
    healthy: Callable[[], None], database_error: Callable[[psycopg.Error], None],
    actions: Mapping[str, Callable[[], Awaitable[object]]] | None = None,
) -> None:
    """Declare `declarations`, then enqueue due ticks whenever one falls due, while `online` is
    set; never returns.

    `actions` maps schedule names to work this worker does itself when their tick comes (on
    the worker that took the tick, after its bookkeeping committed) instead of enqueueing a
    job: the built-in `cleanup_jobs` must not wait in the queue behind the work it maintains.

    Checks when the earliest schedule is due (at most `CHECK_MAX` seconds apart). Each check
    that got an answer calls `healthy()`; a failed connection goes to `database_error` (which
    pauses the worker until the database answers again), and the declarations are written
    again after it. The store's pool is read at each check, since the worker replaces it
    after an outage. Raises ScheduleError when another pool declared one of the names
    (`declare`): the worker's supervisor starts it again later, and its readiness names the
    clash meanwhile.
    """
    declared = False
    while True:
        await online.wait()
        wait = 1.0
        try:
            async with store.pool.connection() as conn:
                if not declared:
                    await declare(conn, declarations)
                    declared = True
                runs = await enqueue_due_ticks(conn, actor=actor, in_process=set(actions or ()))
                for run in runs:
                    if run.created:
                        log.info("schedule %s: %d job(s) enqueued", run.name, run.created)
                wait = await seconds_to_next_check(conn)
            for run in runs:
                if actions and run.name in actions and run.ticks:
                    await actions[run.name]()
            healthy()
        except psycopg.OperationalError as exc:
            declared = False
            database_error(exc)
        await asyncio.sleep(wait)
