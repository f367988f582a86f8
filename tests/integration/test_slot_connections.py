"""A job's `tx` is its slot's connection, taken on the handler's first use of it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.adapt import Dumper
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool
from recording_proxy import SYNC, recording_proxy

from jobpool.db.connect import HOLD, Hold, JobConnection, open_pool
from jobpool.errors import JobEndedError
from jobpool.worker.executor import JobTransaction
from jobpool.worker.slot_connections import NoSlotConnectionError, SlotConnections

NO_DONE = b"SELECT 1;"
"""A statement standing in for a job's `done` where no job's row is at stake."""


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[AsyncConnectionPool[JobConnection]]:
    pool = open_pool(dsn, size=4)
    await pool.open(wait=True)
    yield pool
    await pool.close()


async def test_a_handler_that_never_touches_tx_takes_no_connection(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(2)
    await slots.fill(pool, timeout=5.0)
    idle = list(slots.idle)
    tx = JobTransaction(slots, 1)
    assert tx.taken is None
    await tx.release()
    assert (slots.idle, slots.lent) == (idle, 0)
    await slots.close()


async def test_the_first_use_takes_the_connection_and_opens_the_job_transaction_lazily(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(2)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 2)
    pid = tx.info.backend_pid  # a plain attribute is a use too
    conn = tx.taken
    assert isinstance(conn, JobConnection) and conn.handler_holds
    assert (len(slots.idle), slots.lent) == (1, 1)
    assert conn.info.transaction_status == TransactionStatus.IDLE  # nothing sent yet
    await tx.execute("CREATE TEMP TABLE scratch (x int)")
    assert conn.info.transaction_status == TransactionStatus.INTRANS
    assert pid == conn.info.backend_pid
    await tx.release()
    assert (len(slots.idle), slots.lent) == (2, 0)
    assert conn in slots.idle and not conn.handler_holds
    assert conn.info.transaction_status == TransactionStatus.IDLE  # rolled back, reset
    again = JobTransaction(slots, 3)
    cur = await again.execute("SELECT count(*) AS n FROM pg_tables WHERE tablename = 'scratch'")
    assert (await cur.fetchone())["n"] == 0
    await again.release()
    await slots.close()


async def test_a_connection_the_handler_closed_is_replaced(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(2)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 4)
    closed = tx.connection()
    await tx.close()
    await tx.release()
    assert (len(slots.idle), slots.lent) == (2, 0)
    assert closed not in slots.idle and not any(conn.closed for conn in slots.idle)
    await slots.close()


async def test_with_no_connection_ready_the_job_gets_a_clear_error(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    first = JobTransaction(slots, 5)
    first.connection()
    with pytest.raises(NoSlotConnectionError, match="no database connection is ready"):
        JobTransaction(slots, 6).connection()
    await first.release()
    await slots.close()


async def test_an_abandoned_jobs_slot_gets_another_connection_and_its_own_goes_back_later(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A handler that ignored its stop runs on with its connection while its slot takes the
    next job: that job finds a connection, the pool grows by one meanwhile so the worker's
    own writes keep their spare, and both go back when the handler ends at last."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)  # the pool of 4 keeps 3 spares
    abandoned = JobTransaction(slots, 1)
    held = abandoned.connection()
    await slots.abandon(1)
    following = JobTransaction(slots, 2)
    assert following.connection() is not held
    assert (pool.min_size, pool.max_size) == (5, 5)
    spares = [await pool.getconn(timeout=2.0) for _ in range(3)]
    for conn in spares:
        await pool.putconn(conn)
    await abandoned.release()  # the handler ends at last
    slots.ended(1)
    await following.release()
    assert (len(slots.idle), slots.lent, slots.orphans, slots.abandoned) == (1, 0, {}, set())
    assert held not in slots.idle and (pool.min_size, pool.max_size) == (4, 4)
    await slots.close()


async def test_an_abandoned_handler_gets_no_connection_after_its_abandon(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """Abandoned before it used `tx`, the handler would take the connection its slot's next
    job needs; its changes could not commit anyway."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    abandoned = JobTransaction(slots, 1)
    await slots.abandon(1)
    with pytest.raises(NoSlotConnectionError, match="abandoned after its stop"):
        abandoned.connection()
    following = JobTransaction(slots, 2)
    following.connection()
    await abandoned.release()
    slots.ended(1)  # its task ended
    await following.release()
    assert (len(slots.idle), slots.lent, slots.abandoned) == (1, 0, set())
    again = JobTransaction(slots, 1)  # a later attempt of the same job takes one
    again.connection()
    await again.release()
    await slots.close()


def client_messages(trace: str) -> list[str]:
    """The names of the messages the client sent, from a libpq trace (`PGconn.trace`)."""
    return [line.split("\t")[3] for line in trace.splitlines() if "\tF\t" in line]


async def test_the_first_statement_with_parameters_goes_out_with_the_begin(
    pool: AsyncConnectionPool[JobConnection], tmp_path: Path,
) -> None:
    """One round trip opens the job's transaction and runs the handler's first statement
    (a BEGIN psycopg would send and wait for alone); the transaction is the worker's (READ
    COMMITTED), and later statements go out one by one as psycopg sends them."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 7)
    conn = tx.connection()
    path = tmp_path / "trace"
    with path.open("w") as out:
        conn.pgconn.trace(out.fileno())
        cur = await tx.execute("SELECT %s::int AS n, current_setting('transaction_isolation') "
                               "AS isolation", (7,))
        row = await cur.fetchone()
        await tx.execute("SELECT %s::int", (8,))
        conn.pgconn.untrace()
    assert row == {"n": 7, "isolation": "read committed"}
    sent = client_messages(path.read_text())
    assert sent.count("Sync") == 2 and "Query" not in sent, sent
    first = sent[:sent.index("Sync")]
    assert first.count("Execute") == 2, sent  # the BEGIN and the statement, then one Sync
    assert conn.info.transaction_status == TransactionStatus.INTRANS
    await tx.release()
    await slots.close()


async def test_the_begin_and_the_first_statement_reach_the_server_in_one_write(dsn: str) -> None:
    """The job's BEGIN, its first statement and the Sync go out in one write, which wakes the
    server's backend once (psycopg's own pipeline writes each of them apart, then a Flush)."""
    async with recording_proxy(dsn) as (proxied, chunks):
        pool = open_pool(proxied, size=1)
        await pool.open(wait=True)
        slots = SlotConnections(1)
        try:
            await slots.fill(pool, timeout=5.0)
            tx = JobTransaction(slots, 8)
            tx.connection()
            before = len(chunks)
            cur = await tx.execute("SELECT %s::int AS n", (7,))
            assert await cur.fetchone() == {"n": 7}
            sent = chunks[before:]
            assert len(sent) == 1, sent
            assert b"BEGIN" in sent[0] and b"SELECT $1::int" in sent[0], sent
            assert sent[0].endswith(SYNC), sent
            await tx.release()
        finally:
            await slots.close()
            await pool.close()


async def test_a_first_statement_larger_than_the_sockets_buffers_goes_out_whole(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A first statement of megabytes (libpq writes part of it while it is queued, the rest
    when the pipeline ends) arrives whole, in the job's transaction."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 9)
    big = "x" * (8 * 1024 * 1024)
    cur = await tx.execute("SELECT length(%s::text) AS n, md5(%s::text) = md5(repeat('x', %s))"
                           " AS same", (big, big, len(big)))
    assert await cur.fetchone() == {"n": len(big), "same": True}
    assert tx.connection().info.transaction_status == TransactionStatus.INTRANS
    await tx.release()
    await slots.close()


async def assert_next_job_runs_on(slots: SlotConnections, pid: int) -> None:
    """The next job's first statement runs, on the backend `pid` (the connection was kept)."""
    again = JobTransaction(slots, 10)
    cur = await again.execute("SELECT %s::int AS n, pg_backend_pid() AS pid", (1,))
    assert await cur.fetchone() == {"n": 1, "pid": pid}
    await again.release()


async def test_a_first_statement_cancelled_while_it_is_written_keeps_the_connection(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A handler cancelled (its timeout, a stop) while its first statement of megabytes is
    still being written: the statement is written out and cancelled on the server, and the
    connection, not left waiting for answers to what was never sent, serves the next job."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 11)
    conn = tx.connection()
    pid = conn.info.backend_pid
    writing = asyncio.ensure_future(tx.execute("SELECT length(%s::text)", ("x" * 16_000_000,)))
    await asyncio.sleep(0.01)
    writing.cancel()
    with contextlib.suppress(asyncio.CancelledError, psycopg.errors.QueryCanceled):
        await writing
    assert not conn.closed
    await tx.release()
    await assert_next_job_runs_on(slots, pid)
    await slots.close()


async def test_a_handlers_own_pipeline_opens_the_job_transaction_in_it(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A handler that sends its first statements in a pipeline of its own gets each result,
    in the job's transaction (READ COMMITTED)."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 12)
    async with tx.pipeline():
        first = await tx.execute("SELECT %s::int AS n", (1,))
        second = await tx.execute("SELECT %s::int AS n, current_setting('transaction_isolation')"
                                  " AS isolation", (2,))
    assert await first.fetchone() == {"n": 1}
    assert await second.fetchone() == {"n": 2, "isolation": "read committed"}
    assert tx.connection().info.transaction_status == TransactionStatus.INTRANS
    await tx.release()
    await slots.close()


async def test_a_first_statement_that_fails_fails_as_it_would_alone(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """Its error is raised by the handler's own call, the job's transaction is failed (the
    worker rolls it back), and the next job's first statement opens a fresh one."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 13)
    with pytest.raises(psycopg.errors.DivisionByZero):
        await tx.execute("SELECT 1 / %s::int", (0,))
    assert tx.connection().info.transaction_status == TransactionStatus.INERROR
    await tx.release()
    again = JobTransaction(slots, 14)
    cur = await again.execute("SELECT %s::int AS n", (1,))
    assert await cur.fetchone() == {"n": 1}
    await again.release()
    await slots.close()


async def test_a_first_statement_whose_parameter_cannot_be_sent_fails_alone(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A parameter psycopg cannot adapt fails the handler's call with psycopg's own error,
    before anything of the statement is sent; the connection leaves pipeline mode and serves
    the next job on the same backend."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 15)
    conn = tx.connection()
    pid = conn.info.backend_pid
    with pytest.raises(psycopg.ProgrammingError, match="cannot adapt type 'object'"):
        await tx.execute("SELECT %s AS n", (object(),))
    assert conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    await tx.release()
    await assert_next_job_runs_on(slots, pid)
    await slots.close()


class Interrupting(Dumper):
    """Dumps nothing: raises what is not an Exception, as a dumper of a handler's may."""

    oid = 25

    def dump(self, obj: Any) -> bytes:
        raise KeyboardInterrupt("from a dumper")


class Opaque:
    """A value only `Interrupting` dumps."""


async def test_a_first_statement_interrupted_while_queued_leaves_pipeline_mode(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """Whatever a parameter's dumper raises, the pipeline of the job's first statement ends:
    the connection is in the job's transaction, out of pipeline mode, and takes the next
    statement."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 16)
    conn = tx.connection()
    cur = tx.cursor()
    cur.adapters.register_dumper(Opaque, Interrupting)
    with pytest.raises(KeyboardInterrupt):
        await cur.execute("SELECT %s", (Opaque(),))
    assert conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    assert not conn.begin_with_statement
    after = await tx.execute("SELECT 1 AS n")
    assert await after.fetchone() == {"n": 1}
    await tx.release()
    assert not conn.closed
    await slots.close()


async def test_two_tasks_sharing_a_tx_get_their_own_results_in_one_transaction(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A handler that sends two statements at once from two tasks on its `tx` (gather): one
    of them opens the job's transaction, the other runs in it, and each gets its own row."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 17)
    first, second = await asyncio.gather(
        tx.execute("SELECT %s::int AS n, txid_current() AS xid", (1,)),
        tx.execute("SELECT %s::int AS n, txid_current() AS xid", (2,)))
    one, two = await first.fetchone(), await second.fetchone()
    assert (one["n"], two["n"], one["xid"] == two["xid"]) == (1, 2, True)
    assert tx.connection().info.transaction_status == TransactionStatus.INTRANS
    await tx.release()
    await slots.close()


async def test_a_statement_without_parameters_may_hold_several(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """psycopg sends a text without parameters as it is: its statements all run, in the
    job's transaction."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 18)
    await tx.execute("CREATE TEMP TABLE two (v int); INSERT INTO two VALUES (1), (2)")
    cur = await tx.execute("SELECT count(*) AS n FROM two")
    assert await cur.fetchone() == {"n": 2}
    await tx.release()
    await slots.close()


async def test_a_writing_jobs_session_is_gone_before_the_next_job_whatever_that_job_does(
    pool: AsyncConnectionPool[JobConnection], dsn: str,
) -> None:
    """The reset runs where the writing job's session ends, not in the next job's transaction:
    a next job that only takes `tx` (to open a side connection, say) holds none of the last
    job's session advisory locks, and one that rolls back its own transaction does not get
    the last job's settings, read-only default or temp tables back."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute("CREATE TABLE written (v int PRIMARY KEY)")
        await admin.execute("INSERT INTO written VALUES (1)")
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 19)
    for statement in ("SET work_mem = '1MB'", "SET default_transaction_read_only = on",
                      "CREATE TEMP TABLE scratch (v int)", "SELECT pg_advisory_lock(4245)"):
        await tx.execute(statement)
    await tx.execute("INSERT INTO written (v) VALUES (%s)", (2,))
    await tx.end(NO_DONE)

    nothing_sent = JobTransaction(slots, 20)
    taken = nothing_sent.connection()  # taken, as a handler opening a side connection does
    assert taken.info.transaction_status == TransactionStatus.IDLE  # nothing sent on it
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as reader:
        cur = await reader.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                   "AND objid = 4245 AND granted")
        assert await cur.fetchone() == (0,)
    await nothing_sent.release()

    rolled_back = JobTransaction(slots, 21)
    with pytest.raises(psycopg.errors.UniqueViolation):
        await rolled_back.execute("INSERT INTO written (v) VALUES (%s)", (1,))
    await rolled_back.rollback()
    cur = await rolled_back.execute(
        "SELECT current_setting('work_mem') AS work_mem, current_setting('transaction_read_only')"
        " AS read_only, to_regclass('pg_temp.scratch') IS NULL AS no_scratch, %s::int AS n", (1,))
    assert await cur.fetchone() == {"work_mem": "4MB", "read_only": "off", "no_scratch": True,
                                    "n": 1}
    await rolled_back.execute("INSERT INTO written (v) VALUES (%s)", (3,))
    await rolled_back.end(NO_DONE)
    await slots.close()


async def test_a_session_changed_through_a_cursor_the_handler_built_is_reset(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A handler that sends its statements through a cursor of its own (not `tx.cursor()`) and
    commits them itself, leaving nothing for the job's end: its settings are still undone
    before the next job."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 22)
    own = psycopg.AsyncClientCursor(tx.connection())
    await own.execute("SET work_mem = '1MB'")
    await own.execute("COMMIT")  # through its own cursor: past the job cursor's check
    await tx.release()
    following = JobTransaction(slots, 23)
    cur = await following.execute("SELECT current_setting('work_mem') AS work_mem, %s::int AS n",
                                  (1,))
    assert await cur.fetchone() == {"work_mem": "4MB", "n": 1}
    await following.release()
    await slots.close()


async def test_tx_used_after_its_job_ended_is_refused_and_takes_no_connection(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    """A task the handler left running used `tx` after the job: it took an idle slot
    connection that nobody gave back, and left a transaction open on it."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots, 31)
    await tx.execute("SELECT 1")
    await tx.release()
    with pytest.raises(JobEndedError, match="tx of job 31 used after the job ended"):
        await tx.execute("SELECT 1")
    assert len(slots.idle) == 1  # the connection stays the slot's
    await slots.close()


@contextlib.contextmanager
def holding(hold: Hold) -> Iterator[None]:
    """Run the block in the context of `hold`'s handler, as the executor runs a handler."""
    token = HOLD.set(hold)
    try:
        yield
    finally:
        HOLD.reset(token)


@pytest.fixture
async def left_rows(dsn: str) -> AsyncIterator[Callable[[], Awaitable[list[int]]]]:
    """Table `left_rows (v int PRIMARY KEY)`, empty; yields a reader of its committed values
    in order."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute("DROP TABLE IF EXISTS left_rows")
        await admin.execute("CREATE TABLE left_rows (v int PRIMARY KEY)")

        async def committed() -> list[int]:
            cur = await admin.execute("SELECT v FROM left_rows ORDER BY v")
            return [v for (v,) in await cur.fetchall()]

        yield committed
        await admin.execute("DROP TABLE left_rows")


INSERT_LEFT = "INSERT INTO left_rows (v) VALUES (%s)"


async def test_a_savepoint_a_task_left_open_is_not_released_in_the_next_job(
    pool: AsyncConnectionPool[JobConnection],
    left_rows: Callable[[], Awaitable[list[int]]],
) -> None:
    """A task the handler left running inside `async with tx.transaction()` left the block
    after the job ended: its RELEASE SAVEPOINT went into the next job's transaction on the
    same connection, which failed. psycopg's commands (`_exec_command`) are checked as
    statements are: the task gets JobEndedError, and the next job commits."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    first = JobTransaction(slots, 43)
    with holding(first.hold):
        block = first.transaction()
        await block.__aenter__()  # the task's `async with tx.transaction():`, entered in the job
        await first.execute(INSERT_LEFT, (1,))
    await first.end(NO_DONE)
    following = JobTransaction(slots, 44)
    with holding(following.hold):
        await following.execute(INSERT_LEFT, (2,))
    with holding(first.hold), pytest.raises(JobEndedError, match="tx of job 43"):
        await block.__aexit__(None, None, None)  # the task leaves the block
    await following.end(NO_DONE)
    assert await left_rows() == [1, 2]
    await slots.close()


async def test_a_cursor_a_task_kept_after_its_job_is_refused_in_the_next_job(
    pool: AsyncConnectionPool[JobConnection],
    left_rows: Callable[[], Awaitable[list[int]]],
) -> None:
    """A task the handler left running, with a cursor of `tx` (or its connection), wrote
    into the next job's transaction on the same slot connection, or rolled it back. Its
    statements now fail in that task (through the next job's `tx` too), and the next job
    commits only its own writes."""
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    first = JobTransaction(slots, 41)
    with holding(first.hold):  # the first job's handler, and the task it starts
        kept = first.cursor()
        await kept.execute(INSERT_LEFT, (1,))
    await first.end(NO_DONE)
    following = JobTransaction(slots, 42)
    with holding(following.hold):
        await following.execute(INSERT_LEFT, (2,))
    with holding(first.hold):  # the task left running, in the first handler's context
        with pytest.raises(JobEndedError, match="tx of job 41 used after the job ended"):
            await kept.execute(INSERT_LEFT, (3,))
        with pytest.raises(JobEndedError, match="tx of job 41"):
            await kept.connection.rollback()
        with pytest.raises(JobEndedError, match="tx of job 41"):
            await kept.connection.cancel_safe()  # it would cancel the next job's statement
        with pytest.raises(JobEndedError, match="tx of job 41"):
            kept.connection.cancel()
        # the task belongs to the first job: the next job's own tx, handed to it, is refused
        with pytest.raises(JobEndedError, match="tx of job 41"):
            await following.execute(INSERT_LEFT, (4,))
    await following.end(NO_DONE)
    assert await left_rows() == [1, 2]
    await slots.close()
