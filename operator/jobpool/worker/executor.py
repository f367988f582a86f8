"""Running one attempt of one job: `JobExecutor.execute` is the one place an attempt runs.

It checks the payload, takes a rate-limit token, runs the handler in the job's transaction
and writes the outcome (done, retry, DLQ, handed back), returning it as a `JobOutcome`.

The job's transaction: the handler's `tx` is a `JobTransaction`, which takes the slot's
connection (`SlotConnections`) on the handler's first use of it and puts that connection in
job scope (`JobConnection.handler_holds`): the transaction starts with the handler's first
statement, so a handler that sends none leaves the connection idle, and its `done` goes to
the completer's batch; a handler that wrote gets its `done`, the session reset and the COMMIT
in one query (`JobTransaction.end`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, Protocol, TypeVar, cast

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from jobpool.core.jsondata import UndecodableJson, json_type, to_json_text
from jobpool.core.ratelimit import Denied
from jobpool.core.retry import (
    DeadLetter,
    Retry,
    decide_retry,
    error_text,
    safe_str,
    truncate_error,
)
from jobpool.core.shutdown import SHUTDOWN_WRITE_TIMEOUT
from jobpool.db.connect import (
    HOLD,
    Hold,
    JobConnection,
    NotCommittedError,
    check_transaction_kept,
    end_job,
    handler_end,
    reset_session,
)
from jobpool.db.failures import interrupted_by_connection, refuses_value, transaction_conflict
from jobpool.db.store import CLAIM_NOT_HELD, Completion
from jobpool.errors import (
    JobpoolError,
    PermanentError,
    RetryAfter,
    TransactionEndedError,
)
from jobpool.job import Job
from jobpool.metrics import JobOutcome, WorkerMetrics
from jobpool.registry import KindSpec
from jobpool.worker import tracing
from jobpool.worker.completer import ResultRefused
from jobpool.worker.deadlines import Deadlines
from jobpool.worker.slot_connections import NoSlotConnectionError, SlotConnections
from jobpool.worker.token_store import WAKE_SLACK, TokenStore, describe, requeue_delay

log = logging.getLogger("jobpool.worker")

T = TypeVar("T")

CONFLICT_PAUSE = (0.05, 1.0)
"""Seconds (drawn at random between the two) before a job whose transaction the server
rolled back for a conflict runs again: long enough for the other transaction to end, and
spread so that the two do not meet again."""

MAX_UNCOUNTED_HAND_BACKS = 3
"""Times this worker hands one attempt of a job back uncounted (a lost connection, a
conflict) before the next such error counts as the attempt's failure. What looks like the
database's fault may be the handler's own (a `tx` it closed, an OperationalError or a
serialization failure from another database it uses): uncounted, such a job would run
again and again without end, never reaching the DLQ."""

MAX_UNCOUNTED_CONFLICTS = 25
"""Times this worker hands one attempt back uncounted when the server rolled back the job's
own transaction for a conflict with another (its statement or its COMMIT failed with
SQLSTATE class 40). Higher than `MAX_UNCOUNTED_HAND_BACKS`: every such conflict means
another transaction got through, and under contention one job may meet many in a row; the
bound still ends a handler whose own SQL raises such an error every time."""

UNCOUNTED_MEMORY = 10_000
"""Attempts whose uncounted hand-backs a worker remembers at most (forgotten all at once past
it: a long outage hands back many jobs once each, which then finish elsewhere)."""


class OwnConflictError(JobpoolError):
    """The server rolled back the job's own transaction for a conflict with another: the
    handler's statement or the job's COMMIT failed with SQLSTATE class 40; `error` is what
    was raised (the handler's own exception, when it wrapped the server's)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def handler_decided(exc: BaseException) -> bool:
    """Whether the handler said what becomes of the job itself (PermanentError, RetryAfter),
    also when it raised that while handling a conflict or a lost connection: its word wins
    over an uncounted hand-back."""
    return isinstance(exc, PermanentError | RetryAfter)


def own_conflict(conn: AsyncConnection[Any], exc: BaseException) -> bool:
    """Whether `exc` is a conflict the server found in the transaction on `conn`: a class 40
    error (or one wrapping it) while that transaction is aborted. A handler that raises such
    an error of another database it uses leaves its own transaction open (or unused)."""
    return (isinstance(exc, Exception) and transaction_conflict(exc) and not conn.closed
            and conn.info.transaction_status == TransactionStatus.INERROR)


class ClaimLostError(JobpoolError):
    """The job's row is no longer running under this worker's claim.

    Raised by the worker's own `done` write, after the handler returned, and caught in
    `JobExecutor.execute`: it never passes through a handler, so no handler's `except` can
    swallow it.
    """


class HandlerExit(JobpoolError):
    """The handler raised SystemExit or another BaseException that would stop the worker."""


LOGGED_RESULT_LIMIT = 500
"""Characters of a job's result its `done` log line shows: the result is stored whole, and a
large one (a report, a list of ids) would make one log line of megabytes."""


def logged_result(result: Any) -> str:
    """A handler's result as the `done` log line shows it: at most LOGGED_RESULT_LIMIT
    characters, the cut marked, control characters escaped."""
    text = safe_str(result, what="its result")
    # cut before escaping: a result of megabytes is not walked whole for its log line
    return truncate_error(text[:LOGGED_RESULT_LIMIT + 1], LOGGED_RESULT_LIMIT)


def payload_problem(payload: Any) -> str | None:
    """Why a claimed payload cannot go to a handler (written by SQL past enqueue's checks)."""
    if isinstance(payload, UndecodableJson):
        return f"payload cannot be decoded: {payload.reason}"
    if not isinstance(payload, dict):
        return f"payload must be a JSON object, got {json_type(payload)}"
    return None


def stored_result(result: Mapping[str, Any] | None) -> str | None:
    """The handler's result as JSON text a jsonb column takes; PermanentError naming the
    problem when it is not storable (retrying would return the same), also when walking it
    raises SystemExit or another BaseException."""
    if result is None:
        return None
    try:
        return to_json_text(dict(result), name="result")
    except BaseException as exc:  # also a SystemExit from the result's __iter__
        reason = safe_str(exc, what="the reason") if isinstance(exc, Exception) else error_text(exc)
        raise PermanentError(f"handler returned a result that cannot be stored: {reason}") from None


class OutcomeStore(Protocol):
    """What the executor needs of the queue store (`jobpool.db.store.QueueStore`): each
    write is a compare-and-set on the job's claim (False: this worker lost it)."""

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The worker's pool (rate-limit tokens are taken on it)."""
        ...

    def done_statement(self, job_id: int, attempts: int, result: str | None) -> bytes: ...

    async def committed_done(self, job_id: int, attempts: int) -> bool: ...

    async def retry(self, job_id: int, attempts: int, *, delay: float, error: str) -> bool: ...

    async def dead_letter(self, job_id: int, attempts: int, *, error: str) -> bool: ...

    async def release(self, job_id: int, attempts: int, *, delay: float = 0.0) -> bool: ...


class OutcomeWriter(Protocol):
    """How outcome writes get through an outage (`DatabaseLink.write`)."""

    async def write(self, write: Callable[[], Awaitable[T]]) -> T: ...


class BatchedDone(Protocol):
    """Where a `done` with nothing to commit with it goes (`Completer.complete`)."""

    async def complete(self, completion: Completion) -> bool: ...


class Finishing(Protocol):
    """The lease keeper's side the executor needs (`LeaseKeeper.finishing`)."""

    def finishing(self, job_id: int) -> None: ...


class JobExecutor:
    """Runs the attempts of one worker's jobs (`execute`).

    `specs`: the worker's kinds by name; `wake`: set when something this executor scheduled
    falls due (a retry, a hand-back, a rate-limit token); `releasing`: set by the worker
    when the grace period is over, so that a cancelled job is handed back, not failed.
    """

    def __init__(
        self, store: OutcomeStore, *, writer: OutcomeWriter, completer: BatchedDone,
        slot_connections: SlotConnections, leases: Finishing, limiter: TokenStore,
        specs: Mapping[str, KindSpec], wake: asyncio.Event,
        metrics: WorkerMetrics, rng: random.Random,
        stopped: Callable[[int], bool] = lambda job_id: False,
    ) -> None:
        self.store = store
        self.writer = writer
        self.completer = completer
        self.slot_connections = slot_connections
        self.leases = leases
        self.limiter = limiter
        self.specs = specs
        self.wake = wake
        self.metrics = metrics
        self.rng = rng
        self.releasing = False
        self.stopped = stopped
        """Whether a job's cancellation is its stop (worker/stops.py): nothing to hand back."""
        self.deadlines = Deadlines()
        """The running handlers' timeouts (worker/deadlines.py)."""
        self.uncounted: dict[tuple[int, int, str], int] = {}
        """Uncounted hand-backs by (job id, attempt, cause): `MAX_UNCOUNTED_HAND_BACKS`,
        `MAX_UNCOUNTED_CONFLICTS`."""

    async def execute(self, job: Job) -> JobOutcome:
        """Run one attempt of `job` and write its outcome; return that outcome. Raises
        CancelledError (after handing the job back) when the worker cancels it."""
        spec = self.specs[job.job_kind]
        started = time.monotonic()
        problem = payload_problem(job.payload)
        if problem is not None:
            return await self._fail(job, spec, PermanentError(problem))
        denied = await self.limiter.acquire(self.store.pool, job.tenant_id, job.job_kind)
        if denied is not None:
            return await self._requeue_rate_limited(job, denied)
        try:
            result = await self._run_in_transaction(job, spec)
        except ClaimLostError:
            log.warning("job %d (%s): claim lost, its changes were rolled back",
                        job.id, job.job_kind)
            return "lost_claim"
        except asyncio.CancelledError:
            if not self.stopped(job.id):  # a stopped job's claim is gone: nothing to hand back
                await self._hand_back(job)
            raise
        except OwnConflictError as conflict:
            if (not handler_decided(conflict.error)
                    and self._may_hand_back_uncounted(job, "conflicts", MAX_UNCOUNTED_CONFLICTS)):
                return await self._hand_back_interrupted(job, conflict.error)
            return await self._fail(job, spec, conflict.error)
        except Exception as exc:
            if (not handler_decided(exc)
                    and (transaction_conflict(exc) or interrupted_by_connection(exc)
                         or isinstance(exc, NoSlotConnectionError))
                    and self._may_hand_back_uncounted(job, "interruptions",
                                                      MAX_UNCOUNTED_HAND_BACKS)):
                return await self._hand_back_interrupted(job, exc)
            return await self._fail(job, spec, exc)
        if log.isEnabledFor(logging.INFO):
            log.info("job %d (%s) done in %.3fs%s", job.id, job.job_kind,
                     time.monotonic() - started,
                     "" if result is None else f": {logged_result(result)}")
        return "done"

    async def _run_in_transaction(self, job: Job, spec: KindSpec) -> Mapping[str, Any] | None:
        """Run the handler and mark the job done in its transaction.

        The handler's `tx` is taken from the slot connections on its first use. A handler
        that never used it, or sent no statement, has nothing to commit with its `done`: that
        job is completed later in a batch with others (`complete_jobs`). Raises ClaimLostError when
        this worker no longer holds the claim.
        """
        tx = JobTransaction(self.slot_connections, job.id)
        try:
            result = await self._call_handler(job, spec, cast(AsyncConnection[Any], tx),
                                              tx.hold)
            stored = stored_result(result)
            used = tx.taken
            if used is not None:
                check_transaction_kept(used)
            if used is not None and used.info.transaction_status != TransactionStatus.IDLE:
                await self._end(tx, job, stored)
                return result
        except BaseException as exc:
            used = tx.taken
            conflict = used is not None and own_conflict(used, exc)
            ended = ended_apart(used, exc)
            if used is not None and not used.closed:
                await used.rollback()
            if ended is not None:
                raise ended from exc
            if conflict:
                raise OwnConflictError(cast(Exception, exc)) from exc
            raise
        finally:
            await tx.release()
        self.leases.finishing(job.id)
        if not await self.completer.complete(Completion(job.id, job.attempts, stored)):
            raise ClaimLostError
        return result

    async def _end(self, tx: JobTransaction, job: Job, stored: str | None) -> None:
        """Mark the job done, reset its session and COMMIT its transaction, in one round trip
        (`JobTransaction.end`). When the COMMIT's answer is lost (the connection with it), the
        job's row says whether the COMMIT went through, and only a COMMIT that failed fails
        the job. Raises OwnConflictError, what `refused_done` makes of a `done` the server
        refused, or the server's error of what else failed before the COMMIT (the handler's
        deferred constraints, its session reset) or of the COMMIT."""
        self.leases.finishing(job.id)
        try:
            await tx.end(self.store.done_statement(job.id, job.attempts, stored))
        except NotCommittedError as failed:
            if transaction_conflict(failed.error):
                raise OwnConflictError(failed.error) from failed.error
            if failed.by_done:
                raise_refused_done(failed.error)
            raise failed.error from None  # the handler's deferred constraints, or its reset
        except psycopg.Error as exc:
            if (exc.sqlstate or "").startswith("40"):
                raise OwnConflictError(exc) from exc  # the COMMIT's own: nothing ran
            try:
                committed = await self.store.committed_done(job.id, job.attempts)
            except psycopg.Error:
                raise exc from None  # unknown: the failure path's writes are compare-and-set
            if not committed:
                raise
            log.warning("job %d (%s): committed, but the answer to its COMMIT was lost (%s)",
                        job.id, job.job_kind, error_text(exc))

    async def _call_handler(
        self, job: Job, spec: KindSpec, conn: AsyncConnection[Any], hold: Hold
    ) -> Mapping[str, Any] | None:
        deadline = self.deadlines.arm(spec.defaults.timeout)
        held = HOLD.set(hold)  # the handler's context, inherited by the tasks it starts
        try:
            result = await spec.handler(job, conn)
        except asyncio.CancelledError as exc:
            if self.deadlines.finish(deadline):
                raise TimeoutError(
                    f"handler exceeded its timeout of {spec.defaults.timeout:g}s") from None
            if self.releasing or self.stopped(job.id):
                raise
            task = asyncio.current_task()
            while task is not None and task.cancelling():
                task.uncancel()  # the handler cancelled itself: not the worker's hand-back
            raise HandlerExit(f"handler raised {error_text(exc)}; a handler must not cancel "
                              "the worker's task") from exc
        except Exception:
            raise
        except BaseException as exc:
            raise HandlerExit(f"handler raised {error_text(exc)}; a handler must not stop the "
                              "worker") from exc
        finally:
            HOLD.reset(held)
            self.deadlines.finish(deadline)
        if result is not None and not isinstance(result, Mapping):
            raise PermanentError(
                f"handler returned {type(result).__name__}, expected a mapping or None")
        return result

    async def _fail(self, job: Job, spec: KindSpec, exc: Exception) -> JobOutcome:
        """Carry out `decide_retry` for the failed attempt: write it, log it, wake for it."""
        tracing.attempt_failed(exc)
        self.leases.finishing(job.id)
        decision = decide_retry(attempts=job.attempts, max_attempts=job.max_attempts, exc=exc,
                                policy=spec.defaults.backoff, rng=self.rng)
        outcome: JobOutcome
        store = self.store
        try:
            match decision:
                case Retry(delay=wait, error=error):
                    held = await self.writer.write(
                        lambda: store.retry(job.id, job.attempts, delay=wait, error=error))
                    outcome = "retry"
                    self._wake_in(wait)
                    log.info("job %d (%s) attempt %d failed, retry in %.1fs: %s",
                             job.id, job.job_kind, job.attempts, wait, error)
                case DeadLetter(error=error):
                    held = await self.writer.write(
                        lambda: store.dead_letter(job.id, job.attempts, error=error))
                    outcome = "dlq"
                    log.warning("job %d (%s) moved to the DLQ after %d attempt(s): %s",
                                job.id, job.job_kind, job.attempts, error)
        except psycopg.Error as db_exc:
            log.error("job %d: could not record its failure (%s); handed back at exit, else "
                      "by stale-claim recovery", job.id, db_exc)
            return "error"
        if not held:
            log.warning("job %d (%s): claim lost, failure not recorded", job.id, job.job_kind)
            return "lost_claim"
        return outcome

    def _may_hand_back_uncounted(self, job: Job, cause: str, most: int) -> bool:
        """Whether this interruption of `job` may be handed back without counting its attempt:
        not once this worker has done so `most` times for this attempt and `cause` (each
        cause its own count: a restart after some conflicts is still a restart); then it
        fails as an error of the handler's would, with backoff, and reaches the DLQ after its
        last attempt."""
        key = (job.id, job.attempts, cause)
        times = self.uncounted.pop(key, 0)
        if times >= most:
            log.warning("job %d (%s): interrupted %d times in attempt %d; this time the attempt "
                        "counts", job.id, job.job_kind, times + 1, job.attempts)
            return False
        if len(self.uncounted) >= UNCOUNTED_MEMORY:
            self.uncounted.clear()
        self.uncounted[key] = times + 1
        return True

    async def _hand_back_interrupted(self, job: Job, exc: Exception) -> JobOutcome:
        """Hand back a job that the database, not its handler, stopped: its connection failed
        (a restart, a switchover, a pooler), or the server rolled its transaction back for a
        conflict with another, or no slot connection was ready after an outage. The attempt
        is not used: the job runs again as soon as the database answers (the others after
        `CONFLICT_PAUSE`)."""
        store = self.store
        conflict = transaction_conflict(exc)
        # a dead connection is replaced by the time the database answers; a conflict or a
        # missing slot connection may not have cleared yet
        delay = 0.0 if interrupted_by_connection(exc) else self.rng.uniform(*CONFLICT_PAUSE)
        try:
            held = await self.writer.write(
                lambda: store.release(job.id, job.attempts, delay=delay))
        except psycopg.Error as db_exc:
            log.error("job %d: could not hand back (%s); handed back at exit or by recovery",
                      job.id, db_exc)
            return "error"
        if not held:
            return "lost_claim"
        self._wake_in(delay)
        log.info("job %d (%s) attempt %d handed back, not counted (%s): %s", job.id,
                 job.job_kind, job.attempts,
                 "a transaction conflict" if conflict else "the database connection failed",
                 error_text(exc))
        return "released"

    async def _hand_back(self, job: Job) -> None:
        """Hand back a job the worker cancelled at the end of the grace period."""
        store = self.store
        self.leases.finishing(job.id)
        try:
            async with asyncio.timeout(SHUTDOWN_WRITE_TIMEOUT):
                held = await self.writer.write(lambda: store.release(job.id, job.attempts))
        except (TimeoutError, psycopg.Error) as exc:
            log.error("job %d: could not hand back (%s); its lease will expire",
                      job.id, str(exc) or "the database did not answer")
            return
        if held:
            log.warning("job %d (%s) did not finish within the grace period; handed back",
                        job.id, job.job_kind)

    async def _requeue_rate_limited(self, job: Job, denied: Denied) -> JobOutcome:
        """No token: back to pending until the next one is due; the attempt is not used up."""
        store = self.store
        self.leases.finishing(job.id)
        self.metrics.rate_limited(self.limiter.tenant_label(job.tenant_id), job.job_kind,
                                  denied.scope)
        self._wake_in(denied.retry_after)
        try:
            await self.writer.write(
                lambda: store.release(job.id, job.attempts, delay=requeue_delay(denied)))
        except psycopg.Error as exc:
            log.error("job %d: could not requeue (%s); its lease will expire", job.id, exc)
            return "error"
        log.debug("job %d (%s) requeued: %s", job.id, job.job_kind, describe(denied))
        return "rate_limited"

    def _wake_in(self, delay: float) -> None:
        """Wake the fetch loop when something this worker scheduled `delay` s ahead falls due."""
        asyncio.get_running_loop().call_later(delay + WAKE_SLACK, self.wake.set)


def raise_refused_done(exc: psycopg.Error) -> NoReturn:
    """Raise what `refused_done` makes of `exc` (`exc` itself, or its meaning from it)."""
    meaning = refused_done(exc)
    if meaning is exc:
        raise exc
    raise meaning from exc


def refused_done(exc: psycopg.Error) -> Exception:
    """What the server's refusal of a job's `done`, written in the job's transaction, means
    for the job: ClaimLostError (this worker no longer holds the claim), ResultRefused (the
    result does not fit the column or a server limit: `refuses_value`), PermanentError (the
    handler left its transaction under another role or read-only, as every attempt would),
    else `exc` itself (a conflict, a lost connection, a transaction the handler left
    aborted)."""
    if exc.sqlstate == CLAIM_NOT_HELD:
        return ClaimLostError(str(exc))
    if refuses_value(exc):
        return ResultRefused(exc)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        if "permission denied for function" in str(exc):
            return exc  # the worker's role lost EXECUTE on the done (a GRANT away): retried
        return PermanentError(
            "the job's done, written in its transaction, was refused under the role the "
            "handler left that transaction in (SET ROLE, SET SESSION AUTHORIZATION): a "
            f"handler resets it before it returns ({error_text(exc)})")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return PermanentError(
            "the job's done, written in its transaction, was refused: the handler made "
            "that transaction read-only (SET TRANSACTION READ ONLY); a handler that only "
            f"reads needs no such setting ({error_text(exc)})")
    return exc


def enter_job_scope(conn: AsyncConnection[Any], hold: Hold) -> None:
    """The job's transaction starts with the handler's first statement on `conn`; nothing
    was sent on it yet; the handler holds it (`JobConnection.handler_holds`, `hold`)."""
    if isinstance(conn, JobConnection):
        conn.handler_holds, conn.sent_statements, conn.began = True, False, False
        conn.handler_ended, conn.rolled_back = None, False
        conn.hold, hold.conn = hold, conn


def leave_job_scope(conn: AsyncConnection[Any]) -> None:
    """`conn`'s transactions are plain ones again (the worker's own), and no handler holds
    it."""
    if isinstance(conn, JobConnection):
        conn.handler_holds, conn.hold = False, None


def ended_apart(conn: AsyncConnection[Any] | None,
                exc: BaseException) -> TransactionEndedError | None:
    """The TransactionEndedError to fail the attempt with, instead of the handler's own
    failure `exc`, when the handler that held `conn` ended its job's transaction itself
    before it failed (`handler_end`): what it committed apart stays, and a retry would
    commit it again, so the job goes to the DLQ. None for a cancellation (the worker's own),
    or when `exc` already says so."""
    if not isinstance(exc, Exception) or isinstance(exc, TransactionEndedError):
        return None
    why = handler_end(conn)
    return None if why is None else TransactionEndedError(why)


class JobTransaction:
    """A job's `tx`: the slot's connection, taken on the handler's first use of any of its
    attributes and put in job scope (`enter_job_scope`); until then nothing is borrowed.
    Everything else is the connection's own."""

    __slots__ = ("_conn", "_ended", "_hold", "_pool", "_slots")
    _conn: AsyncConnection[Any] | None
    _ended: bool
    _hold: Hold
    _pool: AsyncConnectionPool[Any] | None
    _slots: SlotConnections

    def __init__(self, slots: SlotConnections, job_id: int) -> None:
        init = object.__setattr__  # past this class's own __setattr__: one per job
        init(self, "_slots", slots)
        init(self, "_hold", Hold(job_id))
        init(self, "_conn", None)
        init(self, "_pool", None)
        init(self, "_ended", False)

    @property
    def taken(self) -> AsyncConnection[Any] | None:
        """The connection, if the handler used `tx`."""
        return self._conn

    @property
    def hold(self) -> Hold:
        """The handler's hold on the connection (`Hold`), kept after the job ended."""
        return self._hold

    def connection(self) -> AsyncConnection[Any]:
        """The connection, taken now if it was not yet. Raises NoSlotConnectionError, and
        JobEndedError once the job ended: a task the handler left running would otherwise
        take a slot's connection that no one gives back, and leave a transaction open on it."""
        if self._ended:
            raise self._hold.ended()
        conn = self._conn
        if conn is None:
            conn, self._pool = self._slots.take(self._hold.job_id)
            enter_job_scope(conn, self._hold)
            self._conn = conn
        return conn

    async def release(self) -> None:
        """Undo what the handler did to the connection's session (`reset_session`) and give
        it back to the slots, if it was taken."""
        await self._give_back(reset_session)

    async def end(self, done: bytes) -> None:
        """Send the job's `done` statement, the session reset and COMMIT in one round trip
        (`end_job`), and give the connection back to the slots. Raises NotCommittedError, or
        the psycopg.Error of the COMMIT (the connection reset and given back all the same)."""
        await self._give_back(lambda conn: end_job(conn, done))

    async def _give_back(self, finish: Callable[[AsyncConnection[Any]], Awaitable[None]]) -> None:
        object.__setattr__(self, "_ended", True)
        if self._conn is not None and self._pool is not None:
            conn, pool, self._conn, self._pool = self._conn, self._pool, None, None
            leave_job_scope(conn)
            try:
                await finish(conn)
            finally:
                await self._slots.give_back(conn, pool, self._hold.job_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in JobTransaction.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self.connection(), name, value)

