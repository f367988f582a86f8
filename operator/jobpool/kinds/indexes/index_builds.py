"""Carry out an index plan on a side connection: drift check, online build or drop, EXPLAIN.

Used by `index_sync` and `gin_backfill`. Everything here runs on an autocommit connection;
the job's own transaction (`tx`) must not have run a statement yet (see `check_own_transaction`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from jobpool.db.failures import primary_message, refuses_value
from jobpool.db.queries import Exec, NamedQuery, One
from jobpool.errors import JobpoolError, PermanentError
from jobpool.kinds.indexes.index_plans import (
    BuildTimeouts,
    ExistingIndex,
    IndexPlan,
    plan_index,
    plan_outline,
    plan_uses_index,
)

ANALYZE_ENTITIES = Exec("analyze_entities")
INSPECT_INDEX = One("inspect_index")
PLANNER_PREFERS_INDEXES = Exec("planner_prefers_indexes")
SET_BUILD_TIMEOUTS = Exec("set_build_timeouts")
TRANSACTION_FOOTPRINT = One("transaction_footprint")
TRY_LOCK_ENTITY_INDEX_BUILDS = One("try_lock_entity_index_builds")
UNLOCK_ENTITY_INDEX_BUILDS = Exec("unlock_entity_index_builds")
COMMENT_INDEX = Exec("comment_index")
DROP_INDEX_CONCURRENTLY = Exec("drop_index_concurrently")

log = logging.getLogger(__name__)

Conn = AsyncConnection[dict[str, Any]]


LOCK_POLL = 1.0
"""Seconds between tries for the index DDL lock."""

CANCELLED_CLEANUP_TIMEOUT = 5.0
"""Seconds a cancelled build (a stopped job, a shutdown) may take to drop the INVALID index it
left; past that the next attempt drops it first."""


class BuildBlockedError(JobpoolError):
    """A build or drop gave up waiting (lock_timeout/statement_timeout); retried with backoff."""


def template(query: NamedQuery, **parts: sql.Composable) -> sql.Composed:
    """A named query of indexes.sql with its {placeholders} filled (identifiers, literals)."""
    return sql.SQL(query.text).format(**parts)


def mdm_index(name: str) -> sql.Identifier:
    """The schema-qualified identifier of index `name` in schema mdm."""
    return sql.Identifier("mdm", name)


@dataclass(frozen=True)
class IndexWork:
    """One index name and what is wanted of it.

    signature None: no index wanted (drop). create: the CREATE INDEX CONCURRENTLY statement.
    explains: label -> EXPLAIN (FORMAT JSON) of a canonical query the index must serve.
    CREATE INDEX takes the bare name (the index goes into mdm.ddm_entity's schema).
    """

    name: str
    signature: str | None
    create: sql.Composed | None = None
    explains: Mapping[str, sql.Composed] = field(default_factory=dict)


@dataclass(frozen=True)
class IndexOutcome:
    """What was done, how long the DDL took (seconds), whether ANALYZE ran, EXPLAIN verdicts."""

    plan: IndexPlan
    seconds: float
    explain: dict[str, dict[str, Any]]
    analyzed: bool = False

    @property
    def present(self) -> bool:
        return self.plan.action in ("keep", "build", "rebuild")

    def as_result(self, name: str) -> dict[str, Any]:
        """The job result's part about the index."""
        return {"index": name, "action": self.plan.action, "reason": self.plan.reason,
                "ddl_seconds": round(self.seconds, 3), "analyzed": self.analyzed,
                "explain": self.explain,
                "serves_canonical_queries": all(e["uses_index"] for e in self.explain.values())}


async def check_own_transaction(side: Conn, tx_pid: int) -> None:
    """Refuse to build while the job's own transaction holds a snapshot or a lock on the table.

    CREATE INDEX CONCURRENTLY waits for every such transaction, the worker's own included: it
    would wait for itself until lock_timeout. Raises RuntimeError (a programming error).
    """
    row = await TRANSACTION_FOOTPRINT(side, {"pid": tx_pid})
    if row and (row["has_snapshot"] or row["locks_table"]):
        raise RuntimeError(
            "the job's transaction already ran a statement (it holds a snapshot or a lock on "
            "mdm.ddm_entity); an online index build would wait for it")


async def inspect_index(side: Conn, name: str) -> ExistingIndex | None:
    """The index called `name` in schema mdm, or None."""
    row = await INSPECT_INDEX(side, {"name": name})
    if row is None:
        return None
    return ExistingIndex(row["table_name"], row["valid"], row["ready"], row["comment"])


async def set_timeouts(side: Conn, timeouts: BuildTimeouts) -> None:
    """Apply lock_timeout and statement_timeout to the side connection's session."""
    await SET_BUILD_TIMEOUTS(side, timeouts.as_settings())


async def drop_index(side: Conn, name: str) -> None:
    """DROP INDEX CONCURRENTLY IF EXISTS mdm.<name>."""
    await side.execute(template(DROP_INDEX_CONCURRENTLY, index=mdm_index(name)))


async def _cleanup_invalid(side: Conn, name: str) -> str:
    """Drop what a failed build left under `name`; return a note for the error message."""
    try:
        existing = await inspect_index(side, name)
        if existing is None:
            return "no index was left behind"
        if existing.valid:
            return "a valid index of that name exists"
        await drop_index(side, name)
        return "the INVALID index it left was dropped"
    except psycopg.Error as exc:
        log.warning("could not drop the invalid index %s: %s", name, exc)
        return f"an INVALID index remains (drop failed: {exc}); the next attempt drops it first"


async def _build(side: Conn, work: IndexWork, timeouts: BuildTimeouts) -> None:
    assert work.create is not None and work.signature is not None
    try:
        await side.execute(work.create)
    except asyncio.CancelledError:
        # stopped (or handed back at shutdown): psycopg cancelled the build on its backend;
        # drop the INVALID index it left while the side connection is still ours
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCELLED_CLEANUP_TIMEOUT):
                await _cleanup_invalid(side, work.name)
        raise
    except psycopg.errors.UniqueViolation as exc:
        note = await _cleanup_invalid(side, work.name)
        detail = exc.diag.message_detail or str(exc)
        raise PermanentError(
            f"unique index {work.name} cannot be built, the data has duplicates: {detail} "
            f"({note}); fix the data, then toggle the attribute again or replay the job"
        ) from exc
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
        note = await _cleanup_invalid(side, work.name)
        raise BuildBlockedError(
            f"building index {work.name} gave up: {primary_message(exc)} "
            f"(lock_timeout {timeouts.lock_timeout:g}s, statement_timeout "
            f"{timeouts.statement_timeout:g}s; a long transaction may hold a lock on "
            f"mdm.ddm_entity or an old snapshot); {note}"
        ) from exc
    except psycopg.errors.DataError as exc:
        note = await _cleanup_invalid(side, work.name)
        raise PermanentError(
            f"index {work.name} cannot be built, a stored value does not convert: "
            f"{primary_message(exc)} ({note})") from exc
    except psycopg.Error as exc:
        note = await _cleanup_invalid(side, work.name)
        if refuses_value(exc):  # left for these: a value past a server limit (an index row)
            raise PermanentError(
                f"index {work.name} cannot be built, a stored value is past a server limit: "
                f"{primary_message(exc)} ({note}); shorten the values, then toggle the "
                "attribute again or replay the job") from exc
        raise
    await side.execute(template(COMMENT_INDEX, index=mdm_index(work.name),
                                signature=sql.Literal(work.signature)))


async def _drop(side: Conn, name: str, timeouts: BuildTimeouts) -> None:
    try:
        await drop_index(side, name)
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
        raise BuildBlockedError(
            f"dropping index {name} gave up: {primary_message(exc)} "
            f"(lock_timeout {timeouts.lock_timeout:g}s)") from exc


async def analyze_entities(side: Conn) -> bool:
    """ANALYZE mdm.ddm_entity after a build; False (logged) when it could not run."""
    try:
        await ANALYZE_ENTITIES(side)
    except psycopg.Error as exc:
        log.warning("could not ANALYZE mdm.ddm_entity after a build: %s", exc)
        return False
    return True


async def explain_index(side: Conn, name: str,
                        explains: Mapping[str, sql.Composed]) -> dict[str, dict[str, Any]]:
    """Run each EXPLAIN with sequential scans disabled: can the index serve the query?"""
    verdicts: dict[str, dict[str, Any]] = {}
    await PLANNER_PREFERS_INDEXES(side, {"off": "off"})
    try:
        for label, statement in explains.items():
            cur = await side.execute(statement)
            row = await cur.fetchone()
            plan = row["QUERY PLAN"] if row else []
            verdicts[label] = {"uses_index": plan_uses_index(plan, name),
                               "plan": plan_outline(plan)}
    finally:
        await PLANNER_PREFERS_INDEXES(side, {"off": "on"})
    return verdicts


async def lock_entity_index_builds(side: Conn, poll: float = LOCK_POLL) -> None:
    """Take the advisory lock serialising index DDL on mdm.ddm_entity, polling for it.

    Polling, not a blocking pg_advisory_lock: a statement that waits holds a snapshot, and
    the holder's CREATE INDEX CONCURRENTLY waits for every snapshot: a deadlock.
    """
    waited = False
    while True:
        row = await TRY_LOCK_ENTITY_INDEX_BUILDS(side)
        if row and row["locked"]:
            return
        if not waited:
            log.info("waiting for another index build on mdm.ddm_entity to finish")
            waited = True
        await asyncio.sleep(poll)


async def sync_index(
    side: Conn, work: IndexWork, *, timeouts: BuildTimeouts, tx_pid: int
) -> IndexOutcome:
    """Make the index `work.name` match `work`: keep, build, rebuild (drop + build) or drop.

    Index DDL on mdm.ddm_entity is serialised by a session advisory lock, taken before the
    timeouts apply: builds conflict with each other on the table's lock, and a queue behind
    the advisory lock beats failing on lock_timeout. After a build the table is ANALYZEd so
    that the EXPLAIN shows what the planner does with real statistics. Raises PermanentError
    (duplicate key on a unique build; a value that does not convert), BuildBlockedError (gave up
    waiting; no INVALID index is left where it could be dropped), RuntimeError (the job's
    own transaction holds a snapshot), or psycopg errors (transient).
    """
    await lock_entity_index_builds(side)
    try:
        await set_timeouts(side, timeouts)
        await check_own_transaction(side, tx_pid)
        plan = plan_index(work.signature, await inspect_index(side, work.name))
        log.info("index %s: %s (%s)", work.name, plan.action, plan.reason)
        started = time.monotonic()
        if plan.action in ("drop", "rebuild"):
            await _drop(side, work.name, timeouts)
        if plan.action in ("build", "rebuild"):
            await _build(side, work, timeouts)
        seconds = time.monotonic() - started
        analyzed = plan.action in ("build", "rebuild") and await analyze_entities(side)
        explain = (await explain_index(side, work.name, work.explains)
                   if plan.action in ("keep", "build", "rebuild") else {})
        return IndexOutcome(plan, seconds, explain, analyzed)
    finally:
        with contextlib.suppress(psycopg.Error):  # closing the connection releases it anyway
            await UNLOCK_ENTITY_INDEX_BUILDS(side)


def is_last_attempt(attempts: int, max_attempts: int, exc: BaseException) -> bool:
    """Whether this failure ends the job (DLQ): permanent, or out of attempts."""
    return isinstance(exc, PermanentError) or attempts >= max_attempts


async def record_failure(side: Conn, query: Exec, params: Mapping[str, Any]) -> None:
    """Run a status query on the side connection; a broken connection only logs a warning."""
    try:
        await query(side, params)
    except psycopg.Error as exc:
        log.warning("could not record the failed index status (%s): %s", query.name, exc)
