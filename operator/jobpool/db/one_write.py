"""Statements queued in a pipeline and written to the server in one write, with one wait for
all their results: a job's BEGIN with its first statement (`jobpool.db.connect.JobCursor`),
and the claim transaction (`one_write_transaction`).

psycopg's own pipeline writes each command as it is queued and waits for the answer to a
BEGIN before the statements after it; under asyncio every wait lets the event loop run other
tasks first. A worker's claim transaction sent that way stays open on the server while the
worker's loop runs jobs between its round trips. Here nothing is written until the pipeline
ends, and the event loop is left once, for the answers.

This drives private parts of psycopg's pipeline and cursor (`_enter_gen`, `_exit_gen`,
`_communicate_gen`, `_exit`, `_execute_gen`, `_exec_command`);
tests/integration/test_slot_connections.py and test_one_write.py hold what they must do
against the psycopg installed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor, AsyncPipeline
from psycopg.abc import Params, PQGen, Query
from psycopg.waiting import Ready, Wait

log = logging.getLogger(__name__)


class OneWritePipeline(AsyncPipeline):
    """A pipeline that sends everything queued in it in one write, when it ends.

    psycopg's pipeline writes each command as it is queued (a BEGIN, the statement, the Sync,
    then a Flush request: four writes), and every write wakes the server's backend to read
    it. Queued in libpq's buffer until the Sync instead, the BEGIN and the statement reach
    the server as one write, which it answers at once (a Sync makes the server send every
    result, so no Flush request follows). For statements whose results nobody reads before
    the pipeline ends, driven by `one_write`.

    It overrides two private generators of psycopg's pipeline (`_communicate_gen`,
    `_exit_gen`); tests/integration/test_slot_connections.py and test_one_write.py hold what
    it must do (one write, a cancelled write, a statement of megabytes, an error while
    queueing) against the psycopg installed.
    """

    def _communicate_gen(self) -> PQGen[None]:
        self._queue_in_libpq()
        return
        yield  # a generator that writes nothing

    def _exit_gen(self) -> PQGen[None]:
        written = False
        try:
            self._enqueue_sync()
            self._queue_in_libpq()
            yield from self._write_out()
            written = True
        finally:
            # cut short (the connection lost), the rest is still in libpq's buffer: a Flush
            # request writes it, or the results of a statement never sent would be awaited
            yield from self._fetch_gen(flush=not written)

    def _write_out(self) -> PQGen[None]:
        """Write libpq's buffer out, reading what the server sends meanwhile. A wait resumed
        with nothing ready (as psycopg resumes it after sending a cancellation) writes on, so
        the statement arrives whole and the server's answer to it (its cancellation) can be
        read: stopping half way would leave the server waiting for the rest."""
        while self.pgconn.flush():
            ready = yield Wait.RW
            if ready and ready & Ready.R:
                self.pgconn.consume_input()

    def _queue_in_libpq(self) -> None:
        """Hand the queued commands to libpq, which buffers them (pipeline mode writes only
        past its buffer's threshold; `_write_out` writes the rest)."""
        while self.command_queue:
            self.command_queue.popleft()()


async def one_write(conn: AsyncConnection[Any], queue: PQGen[None]) -> None:
    """Run `queue` (a generator that queues statements in `conn`'s pipeline; a statement's
    own BEGIN must not be among them: psycopg waits for its answer) in a `OneWritePipeline`
    on `conn`, which writes them with a Sync when it ends and reads every answer; `conn`'s
    lock is held throughout, so no other task sends on it meanwhile. Raises the psycopg.Error
    of the first statement that failed, or what queueing raised (a parameter that cannot be
    adapted; a dumper may raise anything), after the pipeline ended all the same."""
    try:
        async with conn.lock:
            conn._check_connection_ok()
            pipeline = conn._pipeline = OneWritePipeline(conn, _no_lock=True)
            try:
                await conn.wait(_ended_gen(pipeline, queue))
            finally:
                conn._pipeline = None
    except psycopg.errors._NO_TRACEBACK as exc:  # as psycopg's own execute raises them
        raise exc.with_traceback(None) from None


def _ended_gen(pipeline: OneWritePipeline, queue: PQGen[None]) -> PQGen[None]:
    """Enter `pipeline`, run `queue`, and end the pipeline even when queueing failed, whose
    error is then the one raised."""
    yield from pipeline._enter_gen()
    failure: BaseException | None = None
    try:
        yield from queue
    except BaseException as exc:
        failure = exc
    try:
        yield from pipeline._exit_gen()
    except Exception as ending:
        if failure is None:
            raise
        log.warning("error ignored ending a pipeline whose queueing failed: %s", ending)
    finally:
        pipeline._exit(failure)
    if failure is not None:
        raise failure


async def one_write_transaction(
    conn: AsyncConnection[Any], statements: Sequence[tuple[Query, Params | None]],
) -> list[AsyncCursor[Any]]:
    """Run `statements` (each one statement and its parameters, or None) in one transaction
    on `conn`, an autocommit connection: BEGIN (at `conn`'s isolation level), the statements,
    COMMIT and a Sync go out in one write (`one_write`), and every answer is read before this
    returns. The event loop runs other tasks only while the server answers, never while the
    transaction is open on the server waiting for the rest of it.

    Returns one cursor per statement, its rows ready to fetch. Raises the psycopg.Error of
    the first statement that failed (the server skips the ones after it, COMMIT included:
    nothing committed), and leaves `conn` in that aborted transaction: the caller rolls back
    or closes it. A statement that cannot be queued (a parameter that cannot be adapted)
    raises its error after a ROLLBACK in place of the COMMIT: nothing committed, `conn` idle.
    ProgrammingError for a connection not in autocommit, whose own BEGIN would wait for its
    answer before the statements.
    """
    if not conn.autocommit:
        raise psycopg.ProgrammingError("one_write_transaction needs an autocommit connection")
    cursors = [conn.cursor() for _ in statements]

    def queue() -> PQGen[None]:
        yield from conn._exec_command(conn._get_tx_start_command())
        try:
            for cursor, (query, params) in zip(cursors, statements, strict=True):
                yield from cursor._execute_gen(query, params)
        except BaseException:
            # the BEGIN and the statements queued before this one are written all the same
            yield from conn._exec_command(b"ROLLBACK")
            raise
        yield from conn._exec_command(b"COMMIT")

    await one_write(conn, queue())
    return cursors
