"""Job kinds used by the tests; worker subprocesses load them with `--import kinds_for_tests`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import psycopg.errors
from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg.types.json import set_json_loads

import jobpool
from jobpool.job import Job

INSERT_RUN = "INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, %s)"
"""One run of a job recorded in test_runs (`TEST_RUNS_DDL`): its id, attempt and a number
(the worker's pid, or a row's mark)."""


@jobpool.kind("test_record", max_attempts=3, stale_ttl=30.0)
async def record(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record this run in `test_runs` inside the job's transaction."""
    await tx.execute(
        INSERT_RUN,
        (job.id, job.attempts, os.getpid()),
    )


@jobpool.kind("test_fails_at_commit", max_attempts=1)
async def fails_at_commit(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record this run, change the session, and write a temp table with a deferred unique
    constraint that only COMMIT checks: with `payload.twice` the same value twice, so that
    the job's transaction fails at its very end."""
    await tx.execute(
        INSERT_RUN,
        (job.id, job.attempts, os.getpid()),
    )
    await tx.execute("SET work_mem = '1MB'")
    await tx.execute("CREATE TEMP TABLE once (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
                     " ON COMMIT DROP")
    await tx.execute("INSERT INTO once VALUES (1), (%s)", (1 if job.payload.get("twice") else 2,))


@jobpool.kind("test_slow_reset", max_attempts=1)
async def slow_reset(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record this run, then leave a session whose reset outlasts its own statement timeout:
    `payload.tables` temp tables for DISCARD TEMP to drop, a `statement_timeout` of
    `payload.timeout_ms`."""
    await tx.execute(
        INSERT_RUN,
        (job.id, job.attempts, os.getpid()),
    )
    tables = int(job.payload["tables"])  # no parameters: psycopg sends the text as it is
    await tx.execute(f"DO $$ BEGIN FOR i IN 1..{tables} LOOP EXECUTE format("
                     "'CREATE TEMP TABLE slow_reset_%s (v int)', i); END LOOP; END $$")
    await tx.execute("SELECT set_config('statement_timeout', %s, false)",
                     (f"{int(job.payload['timeout_ms'])}ms",))


HELD_ROWS: list[asyncio.Task[None]] = []
"""The tasks of `test_done_waits` jobs that hold their job's row a while after they return."""


@jobpool.kind("test_done_waits", max_attempts=1)
async def done_waits(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record this run and leave `payload.setting` (`statement_timeout` or `lock_timeout`) at
    `payload.timeout_ms`, while another session holds the job's row (FOR UPDATE) until
    `payload.hold_ms` after the handler returns: the job's `done` waits for that lock longer
    than the handler's timeout. With
    `payload.apart`, also change `tx`'s row factory: the job then ends in statements of their
    own (and its connection is replaced)."""
    await tx.execute(INSERT_RUN, (job.id, job.attempts, os.getpid()))
    if job.payload.get("apart"):
        tx.row_factory = tuple_row
    holder = await psycopg.AsyncConnection.connect(tx.info.dsn)
    await holder.execute("SELECT 1 FROM mdm.aa_job WHERE id = %s FOR UPDATE", (job.id,))

    async def release() -> None:
        await asyncio.sleep(float(job.payload["hold_ms"]) / 1000)
        await holder.commit()
        await holder.close()

    HELD_ROWS.append(asyncio.create_task(release()))
    await tx.execute("SELECT set_config(%s, %s, false)",
                     (job.payload["setting"], f"{int(job.payload['timeout_ms'])}ms"))


@jobpool.kind("test_sleep", max_attempts=3, stale_ttl=3.0, backoff_base=1.0, backoff_max=1.0)
async def sleep(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Sleep `payload.seconds` (`payload.retry_seconds` after the first claim), then record."""
    first = job.attempts == 1 or "retry_seconds" not in job.payload
    await asyncio.sleep(float(job.payload["seconds" if first else "retry_seconds"]))
    await tx.execute(
        INSERT_RUN,
        (job.id, job.attempts, os.getpid()),
    )
    return {"slept": job.payload.get("seconds", 1)}


@jobpool.kind("test_block", max_attempts=3, stale_ttl=1.0)
async def block(job: Job, tx: AsyncConnection[Any]) -> None:
    """Block the event loop for `payload.seconds` (a handler calling blocking code), then
    record the run."""
    time.sleep(float(job.payload["seconds"]))
    await tx.execute(
        INSERT_RUN,
        (job.id, job.attempts, os.getpid()),
    )


@jobpool.kind("test_fail", max_attempts=2, backoff_base=2.0, backoff_max=2.0, backoff_jitter=0.0)
async def fail(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a row (which must roll back), then fail as `payload` says."""
    await tx.execute(INSERT_RUN,
                     (job.id, job.attempts, os.getpid()))
    if job.payload.get("permanent"):
        raise jobpool.PermanentError(job.payload.get("message", "permanent failure"))
    raise RuntimeError(job.payload.get("message", "transient failure"))


@jobpool.kind("test_noop", max_attempts=1)
async def noop(job: Job, tx: AsyncConnection[Any]) -> None:
    """Send no statement, return nothing (its `done` is batched)."""


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class ExitInStr(Exception):
    def __str__(self) -> str:
        raise SystemExit(4)


class InterruptInRepr(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt

    def __repr__(self) -> str:
        raise KeyboardInterrupt


class CancelInStr(Exception):
    def __str__(self) -> str:
        raise asyncio.CancelledError


class BaseExitInStr(BaseException):
    def __str__(self) -> str:
        raise SystemExit(5)


class ExitOnIter(Mapping[str, Any]):
    """A result whose keys cannot be walked: walking them raises SystemExit."""

    def __getitem__(self, key: str) -> Any:
        return 1

    def __iter__(self) -> Iterator[str]:
        raise SystemExit(6)

    def __len__(self) -> int:
        return 1


MISBEHAVIOURS: dict[str, Any] = {
    "nul_result": lambda: {"t": "a\x00b"},
    "surrogate_result": lambda: {"t": "x\ud800"},
    "nan_result": lambda: {"x": float("nan")},
    "object_result": lambda: {"x": object()},
    "deep_result": lambda: _nested(200),
    "list_result": lambda: [1, 2],
    "refused_result": lambda: {"refuse": True},  # storable; a test's CHECK constraint refuses it
    "exit_on_iter_result": ExitOnIter,
}
FAILURES: dict[str, Any] = {
    "nul_error": lambda: RuntimeError("a\x00b"),
    "surrogate_error": lambda: RuntimeError("x\ud800y"),
    "exit": lambda: SystemExit(3),
    "unprintable_error": Unprintable,
    "exit_in_str": ExitInStr,
    "interrupt_in_repr": InterruptInRepr,
    "cancel_in_str": CancelInStr,
    "base_exit_in_str": BaseExitInStr,
    "own_timeout": lambda: TimeoutError("smtp server did not answer in 30s"),
}


@jobpool.kind("test_misbehave", max_attempts=1)
async def misbehave(job: Job, tx: AsyncConnection[Any]) -> Any:
    """Return or raise what `payload.do` names (see MISBEHAVIOURS, FAILURES); with
    `payload.write`, first write a row in the job's transaction (which must roll back)."""
    if job.payload.get("write"):
        await tx.execute(INSERT_RUN,
                         (job.id, job.attempts, os.getpid()))
    do = job.payload["do"]
    if do in FAILURES:
        raise FAILURES[do]()
    return MISBEHAVIOURS[do]()


async def _commit_after(tx: AsyncConnection[Any], statement: str) -> None:
    """`statement`, committed by the handler itself (a COMMIT sent as SQL: `tx.commit()` is
    refused), so that what it changed in the session outlives the job's transaction (the job
    itself goes to the DLQ for that COMMIT)."""
    await tx.execute(statement)
    await tx.execute("COMMIT")


def _set_row_factory(tx: AsyncConnection[Any]) -> None:
    tx.row_factory = tuple_row


async def _set_attribute(tx: AsyncConnection[Any], name: str, value: Any) -> None:
    setattr(tx, name, value)


async def _call_with_statement(tx: AsyncConnection[Any], register: Any, callback: Any) -> None:
    """`register(callback)` (a notice or notification handler), then a statement: the job
    writes, so its connection ends with the commit path."""
    register(callback)
    await tx.execute("SELECT 1")


async def _cancel_itself() -> None:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(60)


async def _own_json_loader(tx: AsyncConnection[Any]) -> None:
    set_json_loads(json.loads, tx)  # as a handler that prefers orjson would


async def _prepare_psycopg_names(tx: AsyncConnection[Any]) -> None:
    for n in range(64):  # the names psycopg gives its own prepared statements
        await tx.execute(f"PREPARE _pg3_{n} AS SELECT {n}")


TX_ABUSES: dict[str, Any] = {
    "search_path": lambda tx: tx.execute("SET search_path = pg_catalog"),
    "statement_timeout": lambda tx: _commit_after(tx, "SET statement_timeout = '1ms'"),
    "idle_timeout": lambda tx: _commit_after(
        tx, "SET idle_in_transaction_session_timeout = '1ms'"),
    "read_only_session": lambda tx: _commit_after(
        tx, "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"),
    "role": lambda tx: _commit_after(tx, "SET ROLE pg_monitor"),
    "local_role": lambda tx: tx.execute("SET LOCAL ROLE pg_monitor"),
    "read_only_transaction": lambda tx: tx.execute("SET TRANSACTION READ ONLY"),
    "listen": lambda tx: tx.execute("LISTEN somewhere"),
    "held_cursor": lambda tx: _commit_after(tx, "DECLARE held CURSOR WITH HOLD FOR SELECT 1"),
    "autocommit": lambda tx: tx.set_autocommit(True),
    "read_only_attribute": lambda tx: tx.set_read_only(True),
    "json_loader": _own_json_loader,
    "prepare": _prepare_psycopg_names,
    "cursor_factory": lambda tx: _set_attribute(tx, "cursor_factory", psycopg.AsyncRawCursor),
    "server_cursor_factory": lambda tx: _set_attribute(
        tx, "server_cursor_factory", psycopg.AsyncRawServerCursor),
    "prepared_max": lambda tx: _set_attribute(tx, "prepared_max", 1),
    "notice_handler": lambda tx: _call_with_statement(tx, tx.add_notice_handler, print),
    "notify_handler": lambda tx: _call_with_statement(tx, tx.add_notify_handler, print),
    "deallocate_all": lambda tx: tx.execute(  # one by one: psycopg notices DEALLOCATE ALL
        "DO $$ DECLARE s record; BEGIN FOR s IN SELECT name FROM pg_prepared_statements LOOP "
        "EXECUTE format('DEALLOCATE %I', s.name); END LOOP; END $$"),
}
"""What a handler may do to its `tx` that would outlive its job on a pooled connection."""
RAISES: dict[str, Any] = {
    "keyboard_interrupt": KeyboardInterrupt,
    "cancelled": asyncio.CancelledError,
}


@jobpool.kind("test_ignores_cancel", max_attempts=3, timeout=3600.0, stale_ttl=3600.0)
async def ignores_cancel(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a test_runs row, then sleep `payload.seconds` catching every cancellation (a
    handler a worker cannot stop)."""
    await tx.execute(INSERT_RUN,
                     (job.id, job.attempts, os.getpid()))
    end = time.monotonic() + job.payload["seconds"]
    while time.monotonic() < end:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.1)


async def _commit_in_pipeline(tx: AsyncConnection[Any]) -> None:
    async with tx.pipeline():
        await tx.execute("COMMIT")


async def _rollback_then_write_in_pipeline(tx: AsyncConnection[Any], job: Job) -> None:
    async with tx.pipeline():
        await tx.execute("ROLLBACK")
        await tx.execute(run_row(job, 1))


async def _stream(tx: AsyncConnection[Any], statement: str) -> None:
    async for _ in tx.cursor().stream(statement):
        pass


async def _rollback_in_pipeline(tx: AsyncConnection[Any]) -> None:
    async with tx.pipeline():
        await tx.execute("ROLLBACK")


async def _commit_after_savepoint(tx: AsyncConnection[Any]) -> None:
    await tx.execute("SAVEPOINT s; ROLLBACK TO SAVEPOINT s")
    await psycopg.AsyncRawCursor(tx).execute("COMMIT")


async def _raise_after(ending: Any) -> None:
    await ending
    raise RuntimeError("the handler failed after it ended its transaction")


async def _write_in_own_transaction(tx: AsyncConnection[Any], job: Job) -> None:
    """After a rollback, a psycopg transaction of the handler's own, with a write."""
    await tx.rollback()
    conn = tx.cursor().connection
    async with psycopg.AsyncTransaction(conn):
        await conn.execute(run_row(job, 1))


async def _commit_through_own_cursor_then_write(tx: AsyncConnection[Any], job: Job) -> None:
    await psycopg.AsyncRawCursor(tx).execute("COMMIT")
    await tx.execute(run_row(job, 1))


async def _commit_through_cursor(tx: AsyncConnection[Any]) -> None:
    cur = await tx.execute("SELECT 1")
    await cur.connection.commit()


ENDINGS: dict[str, Any] = {
    "commit": lambda tx, job: tx.commit(),
    "autocommit": lambda tx, job: tx.set_autocommit(True),
    "close": lambda tx, job: tx.close(),
    "cursor_connection": lambda tx, job: _commit_through_cursor(tx),
    "sql_commit": lambda tx, job: tx.execute("COMMIT"),
    "sql_end": lambda tx, job: tx.execute("END"),
    "sql_in_text": lambda tx, job: tx.execute("SELECT 1; COMMIT"),
    "pipeline": lambda tx, job: _commit_in_pipeline(tx),
    "rollback_then_write_in_text": lambda tx, job: tx.execute(
        f"ROLLBACK; {run_row(job, 1)}"),
    "rollback_then_write_in_pipeline": lambda tx, job: _rollback_then_write_in_pipeline(tx, job),
    "own_cursor_commit": lambda tx, job: psycopg.AsyncRawCursor(tx).execute("COMMIT"),
    "stream_commit": lambda tx, job: _stream(tx, "COMMIT"),
    "own_cursor_commit_then_write": lambda tx, job: _commit_through_own_cursor_then_write(
        tx, job),
    "own_cursor_commit_after_savepoint": lambda tx, job: _commit_after_savepoint(tx),
    "own_cursor_commit_then_raise": lambda tx, job: _raise_after(
        psycopg.AsyncRawCursor(tx).execute("COMMIT")),
    "pipeline_then_raise": lambda tx, job: _raise_after(_commit_in_pipeline(tx)),
    "own_transaction": lambda tx, job: _write_in_own_transaction(tx, job),
    "two_phase": lambda tx, job: tx.tpc_begin("jobpool-test"),
}
"""Ways a handler could end its job's transaction with its writes kept, or write after it."""


def run_row(job: Job, mark: int) -> str:
    """`INSERT_RUN` of `job`'s attempt marked `mark`, its values as literals (a statement of a
    text of several, which takes no parameters)."""
    return (f"INSERT INTO test_runs (job_id, attempt, worker_pid) "
            f"VALUES ({int(job.id)}, {int(job.attempts)}, {int(mark)})")


@jobpool.kind("test_commits_itself", max_attempts=3)
async def commits_itself(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a test_runs row, then end the job's transaction as `payload.how` names (ENDINGS)."""
    await tx.execute(INSERT_RUN, (job.id, job.attempts, 0))
    await ENDINGS[job.payload["how"]](tx, job)


LEFT_RUNNING: dict[str, Any] = {}
"""What a `test_left_running` job with the role "leave" left running, for the one with the role
"meet" (an in-process worker): the task, the event that lets it write, how its write ended."""


@jobpool.kind("test_left_running", max_attempts=1)
async def left_running(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a test_runs row through a cursor of `tx`. Role "leave": start a task that, once
    let, writes another row with that cursor, and return. Role "meet" (the next job on the
    slot's connection): let that task write, record how its write ended."""
    cursor = tx.cursor()
    await cursor.execute(INSERT_RUN, (job.id, job.attempts, 0))
    if job.payload["role"] == "leave":
        go = asyncio.Event()

        async def write_later() -> None:
            await go.wait()
            await cursor.execute(INSERT_RUN, (job.id, job.attempts, 1))

        LEFT_RUNNING.update(go=go, task=asyncio.create_task(write_later()))
        return
    LEFT_RUNNING["go"].set()
    try:
        await LEFT_RUNNING["task"]
        LEFT_RUNNING["outcome"] = "wrote"
    except Exception as exc:
        LEFT_RUNNING["outcome"] = f"{type(exc).__name__}: {exc}"


GOING_ON: dict[str, Any] = {
    "rollback": lambda tx, job: tx.rollback(),
    "sql_rollback": lambda tx, job: tx.execute("ROLLBACK"),
    "rollback_then_begin_in_text": lambda tx, job: tx.execute("ROLLBACK; BEGIN"),
    "rollback_in_pipeline": lambda tx, job: _rollback_in_pipeline(tx),
    "rollback_and_chain": lambda tx, job: tx.execute("ROLLBACK AND CHAIN"),
    # a third row written and undone by a savepoint (ROLLBACK TO SAVEPOINT answers with the
    # same command tag as ROLLBACK); the first row stays
    "savepoint_in_text": lambda tx, job: tx.execute("; ".join(_savepoint_undo(job))),
    "savepoint_statements": lambda tx, job: _each(tx, _savepoint_undo(job)),
    "savepoint_in_pipeline": lambda tx, job: _each_in_pipeline(tx, _savepoint_undo(job)),
}
"""Ways a handler may undo what it wrote and go on: its next statement is in the job's
transaction, and commits with its done."""


def _savepoint_undo(job: Job) -> list[str]:
    return ["SAVEPOINT s", run_row(job, 2), "ROLLBACK TO SAVEPOINT s", "RELEASE SAVEPOINT s"]


async def _each(tx: AsyncConnection[Any], statements: list[str]) -> None:
    for statement in statements:
        await tx.execute(statement)


async def _each_in_pipeline(tx: AsyncConnection[Any], statements: list[str]) -> None:
    async with tx.pipeline():
        await _each(tx, statements)


@jobpool.kind("test_rolls_back", max_attempts=1)
async def rolls_back(job: Job, tx: AsyncConnection[Any]) -> None:
    """Write a test_runs row (marked 0), undo as `payload.how` names (GOING_ON), write a
    second one (marked 1)."""
    await tx.execute(INSERT_RUN, (job.id, job.attempts, 0))
    await GOING_ON[job.payload["how"]](tx, job)
    await tx.execute(run_row(job, 1))


@jobpool.kind("test_abuse_tx", max_attempts=1)
async def abuse_tx(job: Job, tx: AsyncConnection[Any]) -> None:
    """Do to `tx` what `payload.do` names (TX_ABUSES), or raise what RAISES names, or
    `payload.do == "row_factory"`, "cancel_itself", or "stop_loop" (the worker's event loop)."""
    do = job.payload["do"]
    if do in RAISES:
        raise RAISES[do]()
    if do == "row_factory":
        _set_row_factory(tx)
    elif do == "cancel_itself":
        await _cancel_itself()
    elif do == "stop_loop":
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.05)
    else:
        await TX_ABUSES[do](tx)


@jobpool.kind("test_session_probe", max_attempts=1)
async def session_probe(job: Job, tx: AsyncConnection[Any]) -> None:
    """Fail (PermanentError naming it) if `tx` carries anything an earlier job left behind."""
    if tx.autocommit or tx.read_only is not None:
        raise jobpool.PermanentError(f"inherited autocommit {tx.autocommit}, read_only "
                                     f"{tx.read_only}")
    # psycopg has no public getter for the handlers
    if tx.prepared_max != 100 or tx._notice_handlers or tx._notify_handlers:
        raise jobpool.PermanentError("inherited prepared_max or notice/notification handlers")
    cur = await tx.execute(
        # transaction_isolation is the job's own transaction's, set by the worker's BEGIN
        "SELECT array(SELECT name FROM pg_settings WHERE source = 'session'"
        " AND name <> 'transaction_isolation') AS settings,"
        " array(SELECT pg_listening_channels()) AS channels,"
        " array(SELECT name FROM pg_cursors WHERE name <> '') AS cursors")
    row = await cur.fetchone()
    if not isinstance(row, dict) or any(row.values()):
        raise jobpool.PermanentError(f"inherited session state: {row}")
    await tx.execute(INSERT_RUN,
                     (job.id, job.attempts, os.getpid()))


@jobpool.kind("test_retry_after", max_attempts=3)
async def retry_after(job: Job, tx: AsyncConnection[Any]) -> None:
    """Ask for a retry after `payload.delay` seconds (a float's text: "inf", "nan", "-5")."""
    raise jobpool.RetryAfter(float(job.payload["delay"]), "not yet")


POISONS: dict[str, Any] = {
    "end_own_session": lambda tx: tx.execute("SELECT pg_terminate_backend(pg_backend_pid())"),
    "other_database_down": lambda tx: _raise(psycopg.OperationalError(
        "connection to server at 10.0.0.9 failed: Connection refused")),
    "own_conflict": lambda tx: _raise(psycopg.errors.SerializationFailure(
        "could not serialize access (another database of the handler's)")),
}
"""Handler errors that look like the database's fault (a lost connection, a conflict) but
are the handler's own, every time the job runs."""


async def _raise(exc: Exception) -> None:
    raise exc


@jobpool.kind("test_poison", max_attempts=2, backoff_base=0.1, backoff_max=0.1)
async def poison(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record the run in test_runs (committed on its own), then do what `payload.do` names
    (POISONS)."""
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as own:
        await own.execute(INSERT_RUN, (job.id, job.attempts, os.getpid()))
    await POISONS[job.payload["do"]](tx)


@jobpool.kind("test_env")
async def env(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Return the values of the environment variables `payload.names` in the worker process."""
    return {name: os.environ.get(name) for name in job.payload["names"]}


TEST_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS test_runs (
    job_id bigint NOT NULL, attempt int NOT NULL, worker_pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


@jobpool.kind("test_wait_for_stop", max_attempts=1, stale_ttl=3600.0, timeout=3600.0)
async def wait_for_stop(job: Job, tx: AsyncConnection[Any]) -> None:
    """Record this run in the job's transaction (it must roll back), then wait until the
    worker cancels the handler (`jobpool jobs stop`)."""
    await tx.execute(
        INSERT_RUN,
        (job.id, job.attempts, os.getpid()),
    )
    await asyncio.Event().wait()
