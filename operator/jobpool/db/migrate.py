"""Forward-only migrations, applied in order under an advisory lock, then the built-in kinds.

A migration runs in one transaction with its row in `mdm.jobpool_migration`, unless its
first line is `-- jobpool: no-transaction` (`NO_TRANSACTION`): then its statements run one
by one outside a transaction (what `CREATE INDEX CONCURRENTLY` needs, so that a big queue
keeps working while an index is built) and the row is recorded after the last one. Such a
file must be safe to run again from the start after an interruption.

A statement that alters a table waits for every transaction open on it, and every writer that
comes after waits behind it: one report left open would stop enqueues and claims for as long.
So each statement waits at most `LOCK_TIMEOUT` for its locks; a migration that gave up is
rolled back (outside a transaction, the step that gave up alone is undone: the steps before
it stay done), the writers queued behind it go on, and it is tried again after a pause (that
step alone), logging the sessions that hold it up. `CONCURRENTLY` statements are the
exception: they wait for old transactions without blocking writers, as long as it takes,
naming them every `WAIT_REPORT_EVERY` seconds. A second `migrate` waits for the one holding
the advisory lock (which applies the same migrations), naming it. One run waits for locks
(for that lock, and in the tries that gave way and the pauses after them) for up to
`LOCK_WAIT` in all; then `MigrationLockError` names the sessions that held it up.

The built-in kinds are registered with the defaults their declarations carry (their
`jobpool.kinds` entry points), so a service can enqueue them before any worker has started.
Their modules need the worker extra; without it, `migrate` leaves them to the first worker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from jobpool.core.retry import retry_pause
from jobpool.db.queries import Exec, Many, One
from jobpool.db.store import kind_rows, register_kinds
from jobpool.errors import MigrationLockError, SchemaNotMigratedError
from jobpool.registry import builtin_kinds
from jobpool.sql import migrations

APPLIED_MIGRATIONS = Many("applied_migrations")
CREATE_MIGRATION_TABLE = Exec("create_migration_table")
LOCK_HOLDERS = Many("lock_holders")
MIGRATION_LOCK = One("migration_lock")
MIGRATION_TABLE_EXISTS = One("migration_table_exists")
MIGRATION_LOCK_HOLDER = Many("migration_lock_holder")
MIGRATION_UNLOCK = Exec("migration_unlock")
PRINTED_SCRIPT_CHECK = Exec("printed_script_check")
RECORD_MIGRATION = Exec("record_migration")
REGISTER_KINDS = Exec("register_kinds")
BACKEND_PID = One("backend_pid")
BLOCKING_SESSIONS = Many("blocking_sessions")
SESSION_SETTINGS = One("session_settings")
SET_LOCK_TIMEOUT = Exec("set_lock_timeout")
SET_SESSION_SETTINGS = Exec("set_session_settings")

log = logging.getLogger(__name__)

_LOCK_KEY = 0x6A6F62706F6F6C  # "jobpool"
_LOCK_POLL = 0.2
"""Seconds between two tries for the migration lock."""

NO_TRANSACTION = "-- jobpool: no-transaction"
"""First line of a migration whose statements run one by one outside a transaction."""

LOCK_TIMEOUT = 2.0
"""Seconds a migration's statement waits for a lock before it gives up and gives way to the
writers queued behind it (those wait at most this long)."""

MIN_LOCK_TIMEOUT = 0.001
MAX_LOCK_TIMEOUT = 2_147_483.647
"""The `lock_timeout` range `migrate` takes (seconds): the server's setting in whole
milliseconds, 0 meaning no limit."""

LOCK_WAIT = 300.0
"""Seconds one `migrate` run may wait for locks in all (another migrator's advisory lock, the
tries that gave way and the pauses after them) before it raises MigrationLockError: half the
deadline of the Helm chart's migration hook (600 s), so that the hook's log says why before
Kubernetes stops it."""

RETRY_PAUSE = (1.0, 15.0)
"""Seconds between two tries of such a migration: the first pause (drawn between half of it
and all of it), and the cap it doubles up to (`retry_pause`)."""

WAIT_REPORT_EVERY = 30.0
"""Seconds between two warnings naming the sessions a step that waits without a limit (a
`CONCURRENTLY` index build) waits for, or the session holding the migration lock another run
waits for."""

APPLICATION_NAME = "jobpool migrate"
"""The migration session's name in pg_stat_activity, unless its connection named it."""


def runs_outside_transaction(text: str) -> bool:
    """Whether a migration's text starts with the `NO_TRANSACTION` marker."""
    return text.lstrip().startswith(NO_TRANSACTION)


def statements(text: str) -> list[str]:
    """The statements of a migration, split at each `;` that ends a line (comments dropped).

    Only for `NO_TRANSACTION` files, which hold plain statements (no function bodies).
    """
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [part.strip() for part in re.split(r";[ \t]*$", code, flags=re.M) if part.strip()]


async def applied_versions(conn: AsyncConnection[Any]) -> set[int]:
    """Versions recorded in `mdm.jobpool_migration` (empty on a fresh database)."""
    present = await MIGRATION_TABLE_EXISTS(conn)
    if not (present and present["present"]):
        return set()
    return {int(row["version"]) for row in await APPLIED_MIGRATIONS(conn)}


async def migrate(conn: AsyncConnection[Any], *, lock_timeout: float = LOCK_TIMEOUT,
                  lock_wait: float = LOCK_WAIT) -> list[str]:
    """Apply the migrations `conn`'s database lacks, register the built-in kinds; return the
    names of the migrations applied.

    Safe when several processes run it at once: they queue on an advisory lock, and each
    migration commits with its row in `mdm.jobpool_migration`. The built-in kinds' rows of
    `mdm.aa_job_kind` are set to their declared defaults on every run (a new release may
    change them); rows that already hold them are left untouched.

    Each statement waits at most `lock_timeout` seconds (a whole millisecond at least, as the
    server counts it: 0 would mean no limit) for its locks; a step that gave up is tried
    again after a pause. The run waits for locks (the advisory lock, the tries that
    gave way, the pauses) for up to `lock_wait` seconds (>= 0) in all (the module's docstring
    says why); a `CONCURRENTLY` step waits as long as it takes, naming what it waits for
    every `WAIT_REPORT_EVERY` seconds. No statement timeout applies: an index build or a
    check's validation takes as long as its table needs. The session's lock and statement
    timeouts, its application_name and its autocommit mode are restored at the end, also
    when it fails or is cancelled. Raises MigrationLockError naming the sessions that held it
    up when that time is spent (the migrations applied before stay applied), ValueError for
    a `lock_timeout` or `lock_wait` out of range.
    """
    if not MIN_LOCK_TIMEOUT <= lock_timeout <= MAX_LOCK_TIMEOUT or not lock_wait >= 0:
        raise ValueError(f"migrate needs {MIN_LOCK_TIMEOUT:.3f} <= lock_timeout <= "
                         f"{MAX_LOCK_TIMEOUT:.3f} and lock_wait >= 0 seconds (got "
                         f"{lock_timeout!r} and {lock_wait!r})")
    applied: list[str] = []
    autocommit = conn.autocommit
    budget = WaitBudget(lock_wait)
    give_way = partial(_until_locks_given, conn, lock_timeout=lock_timeout, budget=budget)
    own: dict[str, Any] | None = None
    held_before = True  # until known: a lock of the caller's is never released here
    locked = False
    try:
        await conn.set_autocommit(True)
        own = await SESSION_SETTINGS(conn)
        assert own is not None
        await SET_SESSION_SETTINGS(conn, {
            "lock_timeout": _ms(lock_timeout), "statement_timeout": "0",
            "idle_session_timeout": "0",  # the pauses between tries are idle
            "application_name": own["application_name"] or APPLICATION_NAME})
        held_before = await _holds_migration_lock(conn)
        if not held_before:  # else the caller's own hold serves, its count unchanged
            await _lock(conn, budget)
            locked = True
        await give_way("the migrations table", partial(CREATE_MIGRATION_TABLE, conn))
        done = await applied_versions(conn)
        for version, name, text in migrations():
            if version in done:
                continue
            label = f"migration {version:04d}_{name}"
            if runs_outside_transaction(text):
                await _apply_step_by_step(conn, statements(text), label, give_way, lock_timeout)
                await give_way(label, partial(RECORD_MIGRATION, conn,
                                              {"version": version, "name": name}))
            else:
                await give_way(label, partial(_apply_in_transaction, conn, version, name, text))
            applied.append(label.removeprefix("migration "))
            log.info("applied %s", label)
        await give_way("the registration of the built-in kinds",
                       partial(register_kinds, conn, builtin_kinds()))
    finally:
        if not conn.closed:  # else the error that closed it is the one to see
            await _give_back(conn, own, autocommit,
                             unlock=locked or (not held_before
                                               and await _holds_migration_lock(conn)))
    return applied


@dataclass
class WaitBudget:
    """The seconds one `migrate` run may spend waiting for locks (`limit`: its `lock_wait`),
    and those it has spent (`spent`): waiting for another migrator's advisory lock, tries
    that gave way and the pauses after them. One budget for the whole run, so that a run that
    waited for another migrator, or for several steps, still gives up within the limit."""

    limit: float
    spent: float = 0.0


async def _holds_migration_lock(conn: AsyncConnection[Any]) -> bool:
    """Whether this session holds the migration lock (a lock query cancelled in flight
    leaves this the only way to tell)."""
    return any(row["mine"] for row in await MIGRATION_LOCK_HOLDER(conn, {"key": _LOCK_KEY}))


async def _give_back(conn: AsyncConnection[Any], own: dict[str, Any] | None,
                     autocommit: bool, *, unlock: bool) -> None:
    """Leave the session as `migrate` found it: the migration lock released if `unlock`,
    its settings `own` (None: never changed) and its autocommit mode."""
    if unlock:
        await MIGRATION_UNLOCK(conn, {"key": _LOCK_KEY})
    if own is not None:
        await SET_SESSION_SETTINGS(conn, own)
    if conn.autocommit != autocommit:
        await conn.set_autocommit(autocommit)


def waits_without_limit(statement: str) -> bool:
    """Whether `statement` of a migration outside a transaction waits for its locks as long
    as it takes: a `CONCURRENTLY` one waits for the transactions older than it without
    blocking writers, and one that gave up would leave an invalid index behind. Every other
    statement waits the lock timeout."""
    return re.search(r"\bCONCURRENTLY\b", statement, flags=re.I) is not None


def _ms(seconds: float) -> str:
    """`seconds` as a server setting in milliseconds, rounded up (a positive limit stays one)."""
    return str(math.ceil(round(seconds * 1000, 6)))


async def _apply_in_transaction(conn: AsyncConnection[Any], version: int, name: str,
                                text: str) -> None:
    """Run one migration in one transaction with its row (the session waits its lock timeout
    for each lock)."""
    async with conn.transaction():
        await conn.execute(text)
        await RECORD_MIGRATION(conn, {"version": version, "name": name})


async def _apply_step_by_step(
    conn: AsyncConnection[Any], steps: list[str], label: str,
    give_way: Callable[[str, Callable[[], Awaitable[object]]], Awaitable[None]],
    lock_timeout: float,
) -> None:
    """Run the statements of a migration outside a transaction one by one: each that waits
    `lock_timeout` tried again on its own when it gave way (the steps before it stay done),
    each that `waits_without_limit` as long as it takes."""
    for step in steps:
        if not waits_without_limit(step):
            await give_way(label, partial(conn.execute, step.encode()))
            continue
        await SET_LOCK_TIMEOUT(conn, {"ms": "0"})
        try:
            await _execute_reporting_waits(conn, step, label)
        finally:
            if not conn.closed:
                await SET_LOCK_TIMEOUT(conn, {"ms": _ms(lock_timeout)})


async def _execute_reporting_waits(conn: AsyncConnection[Any], statement: str,
                                   label: str) -> None:
    """Run `statement`, which waits for its locks without a limit, logging every
    `WAIT_REPORT_EVERY` seconds the sessions it waits for (`_report_waits`)."""
    row = await BACKEND_PID(conn)  # behind a session pooler libpq's is the pooler's
    assert row is not None
    reporter = asyncio.create_task(_report_waits(conn, row["pid"], label))
    try:
        await conn.execute(statement.encode())
    finally:
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)


async def _report_waits(conn: AsyncConnection[Any], pid: int, label: str) -> None:
    """Every `WAIT_REPORT_EVERY` seconds, log the sessions that server process `pid`
    (`conn`'s) waits for (`blocking_sessions`), asked on a connection of its own opened after
    the first period (most such statements are done by then); says so once if it cannot."""
    from jobpool.db.connect import open_side_connection  # connect imports this module

    await asyncio.sleep(WAIT_REPORT_EVERY)
    try:
        async with await open_side_connection(
                conn, application_name=f"{APPLICATION_NAME} (its waits)") as side:
            while True:
                rows = await BLOCKING_SESSIONS(side, {"pid": pid})
                if rows:
                    log.warning("%s: a CONCURRENTLY step waits, as long as it takes and "
                                "without holding up writers, for the transactions older than "
                                "it: %s", label, describe_sessions(rows))
                await asyncio.sleep(WAIT_REPORT_EVERY)
    except psycopg.Error as exc:
        log.warning("%s: a CONCURRENTLY step waits as long as it takes; what for cannot be "
                    "told (a second connection to ask on failed: %s); `SELECT * FROM "
                    "pg_stat_activity WHERE pid = ANY(pg_blocking_pids(%d))` shows it", label,
                    exc, pid)


async def _until_locks_given(
    conn: AsyncConnection[Any], label: str, apply: Callable[[], Awaitable[object]], *,
    lock_timeout: float, budget: WaitBudget, rng: random.Random | None = None,
) -> None:
    """Run `apply` (`label`: what it does) again after each try that gave up waiting for a
    lock, pausing `retry_pause` between tries, until it succeeds; the tries that gave way and
    the pauses are spent from `budget`, and MigrationLockError is raised when the next pause
    would pass its limit."""
    rng = rng or random.Random()
    failures = 0
    while True:
        began = time.monotonic()
        try:
            await apply()
            return
        except psycopg.errors.LockNotAvailable:
            failures += 1
        # the try's wait for the lock that gave way, not the work it did before it
        budget.spent += min(time.monotonic() - began, lock_timeout)
        rows = await LOCK_HOLDERS(conn, {"older_than": lock_timeout})
        holders = describe_lock_holders(rows)
        pause = retry_pause(failures, first=RETRY_PAUSE[0], cap=RETRY_PAUSE[1], rng=rng)
        if budget.spent + pause > budget.limit:
            then = ("End those transactions (`SELECT pg_terminate_backend(pid)` ends a "
                    "session's that is stuck), then run `jobpool migrate` again"
                    if any(row["pid"] is not None for row in rows)
                    else "End those transactions, then run `jobpool migrate` again" if rows
                    else "Run `jobpool migrate` again")
            raise MigrationLockError(
                f"{label} gave up after {failures} tries, each waiting {lock_timeout:g}s for "
                f"its locks, then giving way to the writers queued behind it; this run has "
                f"waited {budget.spent:.0f}s for locks in all (the next try would have passed "
                f"the limit of {budget.limit:g}s); {holders}. {then}")
        log.warning("%s waited %gs for a lock and gave way to the writers queued behind it "
                    "(try %d); it tries again in %.1fs; %s", label, lock_timeout, failures,
                    pause, holders)
        await asyncio.sleep(pause)
        budget.spent += pause


def describe_lock_holders(rows: list[dict[str, Any]]) -> str:
    """The transactions of `rows` (`lock_holders`) as one sentence for an operator to act on."""
    if not rows:
        return ("no other transaction of this database older than that holds a lock on schema "
                "mdm's tables or indexes now (those it waited for have ended, or held another "
                "object: `pg_locks` shows it)")
    return "transactions holding locks on schema mdm: " + describe_sessions(rows)


def describe_sessions(rows: list[dict[str, Any]]) -> str:
    """Sessions as `lock_holders` and `blocking_sessions` give them (pid, role,
    application_name, state, open_for in seconds, query, gid, tables; NULL where this role
    may not see them, pid NULL for a prepared transaction, named by its gid where known),
    "; "-separated."""
    sessions = []
    for row in rows:
        holding = f", holding {row['tables']}" if row["tables"] else ""
        if row["pid"] is None:
            sessions.append(_describe_prepared(row["gid"], row["role"], row["open_for"])
                            + holding)
            continue
        name = row["application_name"]
        application = f", application {name!r}" if name else ""
        state = row["state"] or "state not visible to this role"
        age = (f"transaction open {row['open_for']:.0f}s" if row["open_for"] is not None
               else "no transaction open" if row["state"] == "idle"
               else "transaction age not visible")
        query = f", last query {row['query']!r}" if row["query"] else ""
        sessions.append(f"pid {row['pid']} (role {row['role']}{application}, {state}, {age}"
                        f"{holding}{query})")
    return "; ".join(sessions)


def _describe_prepared(gid: str | None, owner: str | None, age: float | None) -> str:
    """A prepared transaction, with the statements that end it (its gid unknown: where to
    find it)."""
    if gid is None:
        return ("a prepared transaction (`pg_prepared_xacts`: COMMIT PREPARED or ROLLBACK "
                "PREPARED ends it)")
    literal = "'" + gid.replace("'", "''") + "'"
    prepared = "" if age is None else f", prepared {age:.0f}s ago"
    return (f"prepared transaction {literal} (owner {owner}{prepared}: `COMMIT PREPARED "
            f"{literal}` or `ROLLBACK PREPARED {literal}` ends it)")


async def _lock(conn: AsyncConnection[Any], budget: WaitBudget) -> None:
    """Take the migration lock, polling: a session waiting inside pg_advisory_lock would hold
    a snapshot, and another process's CREATE INDEX CONCURRENTLY would wait for it forever.

    Names the session holding it when the wait starts and every `WAIT_REPORT_EVERY` seconds
    after (warnings: the operator may have to act); the wait is spent from `budget`, and
    MigrationLockError names that session once the budget is spent (it applies the same
    migrations: nothing is lost by leaving them to it)."""
    started = time.monotonic()
    reported: float | None = None
    while True:
        row = await MIGRATION_LOCK(conn, {"key": _LOCK_KEY})
        if row is not None and row["locked"]:
            budget.spent += time.monotonic() - started
            return
        waited = time.monotonic() - started
        spent = budget.spent + waited
        if reported is None or waited - reported >= WAIT_REPORT_EVERY or spent >= budget.limit:
            holder = describe_sessions(await MIGRATION_LOCK_HOLDER(conn, {"key": _LOCK_KEY}))
            if holder and spent >= budget.limit:  # none: it has just ended, try again
                budget.spent = spent
                raise MigrationLockError(
                    f"another session has been migrating this database for longer than the "
                    f"{budget.limit:g}s `jobpool migrate` waits for it: {holder}. It applies "
                    "the same migrations; run `jobpool migrate` again once it has ended, to "
                    "check")
            if holder:
                log.warning("another session is migrating this database; waiting %.0fs so "
                            "far for it to end (at most %gs): %s", waited, budget.limit, holder)
                reported = waited
        await asyncio.sleep(_LOCK_POLL)


async def check_schema(conn: AsyncConnection[Any]) -> None:
    """Raise SchemaNotMigratedError unless every migration is applied."""
    missing = sorted({v for v, _, _ in migrations()} - await applied_versions(conn))
    if missing:
        raise SchemaNotMigratedError(
            f"the database lacks jobpool migrations {missing}: run `jobpool migrate`"
        )


def migration_script(*, since: int = 0) -> str:
    """The migrations after version `since` (0: all of them), then the registration of the
    built-in kinds, as one SQL script (what `migrate` does), for platforms that run their own
    migration tool: such a tool applies a script once, so the next release's script for it
    holds only what came after the last version the database has.

    Run it statement by statement (`psql -f`, or a tool that does the same): the migrations
    that build indexes CONCURRENTLY come without BEGIN/COMMIT and cannot run inside one
    multi-statement query, and stop at the first error (`psql -v ON_ERROR_STOP=1`). The
    script's first step stops it unless the database has exactly versions 1 to `since`.
    Raises ValueError for a `since` below 0 or past the latest migration (naming it).
    """
    known = migrations()
    latest = max(version for version, _, _ in known)
    if not 0 <= since <= latest:
        raise ValueError(f"--since must be a migration version from 0 to {latest} (the "
                         f"latest this release has), got {since}")
    expected = (f"a database that has versions 1 to {since} alone" if since
                else "a database with no jobpool migrations")
    parts = ["-- Run it with `psql -v ON_ERROR_STOP=1 -f`, or a tool that stops at the first "
             "error:\n-- its first step stops it unless the database is at the version it "
             "was printed for.",
             _inline(PRINTED_SCRIPT_CHECK.text, {"since": since, "expected": expected}),
             CREATE_MIGRATION_TABLE.text]
    for version, name, text in known:
        if version <= since:
            continue
        record = (f"INSERT INTO mdm.jobpool_migration (version, name) VALUES ({version}, "
                  f"'{name}') ON CONFLICT DO NOTHING;")
        if runs_outside_transaction(text):
            parts.append(f"-- {version:04d}_{name} (outside a transaction)\n"
                         + "".join(f"{statement};\n" for statement in statements(text))
                         + record)
        else:
            parts.append(f"-- {version:04d}_{name}\nBEGIN;\n{text.strip()}\n{record}\nCOMMIT;")
    parts.append("-- the built-in kinds and their declared defaults\n"
                 + _inline(REGISTER_KINDS.text, kind_rows(builtin_kinds())))
    return "\n\n".join(parts) + "\n"


def _inline(query: str, params: Mapping[str, Any]) -> str:
    """`query` with each `%(name)s` placeholder replaced by the SQL literal of params[name]."""
    pieces = re.split(r"%\((\w+)\)s", query)
    return sql.Composed([
        sql.SQL(piece) if index % 2 == 0 else sql.Literal(params[piece])
        for index, piece in enumerate(pieces)
    ]).as_string(None)

