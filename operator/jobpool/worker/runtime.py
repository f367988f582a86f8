"""One worker process: claim into free slots, run each job in its transaction, renew leases.

Outages: whoever sees the connection fail calls `_database_error`; claiming pauses, and a
background task probes with a fresh connection until the database answers (every 0.1 s
growing to 1 s), renews the pool, settles this worker's leftovers (renews its leases, hands
back claims it never ran) and resumes. Outcomes that could not be written are written again
then, on a fresh connection. A job whose connection failed under its handler, or whose
transaction the server rolled back for a conflict (serialization failure, deadlock), is
handed back without using an attempt. Before each new pool the worker fits its slots to the
connections the database allows (`core.connection_budget`). At a clean exit every job still
claimed under its id is handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolClosed

from jobpool.core.connection_budget import Need, plan_slots
from jobpool.core.jsondata import UndecodableJson, to_json_text
from jobpool.core.ratelimit import Denied
from jobpool.core.retry import (
    DeadLetter,
    Retry,
    decide_retry,
    error_text,
    retry_pause,
    safe_str,
)
from jobpool.db.connect import (
    JobConnection,
    connection_allowance,
    interrupted_by_connection,
    lost_connection,
    open_live_pool,
    probe,
    transaction_conflict,
    with_tcp_liveness,
)
from jobpool.db.queries import Exec, One
from jobpool.db.store import Completion, QueueStore
from jobpool.errors import (
    ConnectionBudgetError,
    JobpoolError,
    PermanentError,
    SchemaNotMigratedError,
    UnknownTenantError,
)
from jobpool.job import Job
from jobpool.metrics import JobOutcome, WorkerMetrics
from jobpool.registry import KindSpec, Registry
from jobpool.settings import current as current_settings
from jobpool.worker.background import BackgroundTasks
from jobpool.worker.config import (
    POLL_ONLY_INTERVAL,
    WorkerConfig,
    make_worker_id,
    resolve_kinds,
)
from jobpool.worker.heartbeat import Heartbeat
from jobpool.worker.leases import LeaseKeeper
from jobpool.worker.maintenance import keep_maintained
from jobpool.worker.slot_connections import LazyConnection, NoSlotConnection, SlotConnections
from jobpool.worker.token_store import WAKE_SLACK, TokenStore, describe, requeue_delay

LISTEN_FOR_JOBS = Exec("listen_for_jobs")
PING = One("ping")

log = logging.getLogger("jobpool.worker")

T = TypeVar("T")

RECONNECT_FIRST = 0.1
"""Seconds between the first probes of a database that stopped answering."""

RECONNECT_MAX = 1.0
"""Cap on the pause between probes, seconds: claiming resumes within about this long after
the database answers again."""

PROBE_TIMEOUT = 10.0
"""Seconds a probe (or opening a fresh pool) may take before it counts as failed."""

STILL_DOWN_LOG_EVERY = 30.0
"""Seconds between log lines while the database stays unreachable."""

BEAT_EVERY = 5.0
"""Seconds between fetch-loop beats (/healthz) while claiming waits for the database."""

TENANT_CHECK_EVERY = 5.0
"""Seconds between checks for a lane's tenants that do not exist yet."""

CLAIM_RETRY_MAX = 30.0
"""Cap on the pause, seconds, before claiming again after claims failed on a live connection."""

SHUTDOWN_WRITE_TIMEOUT = 5.0
"""Seconds a job cancelled at the end of the grace period may take to be handed back."""

SHUTDOWN_SETTLE_TIMEOUT = 10.0
"""Seconds a stopping worker keeps trying to hand back the jobs still claimed under its id
(outcomes it could not write), waiting for the database meanwhile."""

CONFLICT_PAUSE = (0.05, 1.0)
"""Seconds (drawn at random between the two) before a job whose transaction the server
rolled back for a conflict runs again: long enough for the other transaction to end, and
spread so that the two do not meet again."""

BUDGET_RETRY = 5.0
"""Seconds between checks of the connection budget while it leaves no slot (after the start:
at the start the worker refuses instead)."""


def pool_size(slots: int) -> int:
    """Pooled connections of a worker with `slots` slots: one per slot (a handler's `tx`) and
    one for outcomes written alone and token requests; claims have a connection of their own
    (`QueueStore.complete_and_claim`), LISTEN another, lease renewals a third (`LeaseKeeper`)."""
    return slots + 1


class ClaimLost(JobpoolError):
    """The job's row is no longer running under this worker's claim.

    Raised by the worker's own `done` write, after the handler returned, and caught in
    `_execute`: it never passes through a handler, so no handler's `except` can swallow it.
    """


class ResultRefused(PermanentError):
    """The database refused to record the job done with its result."""

    def __init__(self, exc: psycopg.Error) -> None:
        super().__init__(f"the database refused to record the job done with its result "
                         f"({type(exc).__name__}: {exc})")


class HandlerExit(JobpoolError):
    """The handler raised SystemExit or another BaseException that would stop the worker."""


def payload_problem(payload: Any) -> str | None:
    """Why a claimed payload cannot go to a handler (written by SQL past enqueue's checks)."""
    if isinstance(payload, UndecodableJson):
        return f"payload cannot be decoded: {payload.reason}"
    if not isinstance(payload, dict):
        return f"payload must be a JSON object, got {type(payload).__name__}"
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


class Worker:
    """Runs jobs of `config`'s kinds and tenants with `config.slots` at once.

    `run()` returns after `stop()` (or SIGTERM/SIGINT) once running jobs finished or were
    handed back, or, with `until_empty`, once nothing runnable is left.
    """

    def __init__(
        self, dsn: str, registry: Registry, config: WorkerConfig, *, actor: str,
        rng: random.Random | None = None, limiter: TokenStore | None = None,
    ) -> None:
        self.dsn = dsn
        self.registry = registry
        self.config = config
        self.actor = actor
        self.worker_id = make_worker_id()
        self.kinds = resolve_kinds(registry.names(), config.kinds, config.exclude_kinds)
        self.specs: dict[str, KindSpec] = {k: registry.get(k) for k in self.kinds}
        self.rng = rng or random.Random()
        self.tenant_ids: list[uuid.UUID] | None = None
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.completions: list[tuple[Completion, asyncio.Future[bool]]] = []
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        """Set by a second `stop()`: the grace period ends at once."""
        self.online = asyncio.Event()
        self.claiming = asyncio.Lock()
        self.database_problem: str | None = "waiting for the database"
        self.releasing = False
        """Set when the grace period is over: a cancelled job is handed back, not failed."""
        self.listening = False
        self.loop_beat = time.monotonic()
        self.store: QueueStore | None = None
        self.started = False
        self.claim_failures = 0
        """Claims in a row that failed on a live connection (`_claim_failed`)."""
        self.refusal: ConnectionBudgetError | None = None
        """Why the worker refused to start (its connection budget leaves no slot)."""
        self.limiter = limiter or TokenStore.from_settings(current_settings())
        self.token_wake: asyncio.TimerHandle | None = None
        self.metrics = WorkerMetrics()
        self.slots = config.slots
        """Slots the worker runs with: `config.slots`, or fewer for the connection budget."""
        self.budget_note: str | None = None
        self.transaction_pooler = config.pooler == "transaction"
        self.listen_dsn = config.listen_dsn or (None if self.transaction_pooler else dsn)
        """Where LISTEN goes; None: poll-only (a transaction pooler without a direct DSN)."""
        self.poll_interval = (config.poll_interval if self.listen_dsn is not None
                              else min(config.poll_interval, POLL_ONLY_INTERVAL))
        self.slot_connections = SlotConnections(config.slots)
        self.background = BackgroundTasks(self.rng)
        self.lease = min([config.lease_ttl, *(s.defaults.stale_ttl for s in self.specs.values())])
        """Seconds each claim is leased for: the worker's lease, capped by its kinds' stale TTLs."""
        self.leases = LeaseKeeper(dsn, worker_id=self.worker_id, actor=actor, lease=self.lease,
                                  recover=not config.until_empty)
        where = current_settings()
        self.heartbeat = Heartbeat(self.worker_id, pool=where.pool, lane=where.lane,
                                   kinds=self.kinds, tenants=config.tenants, slots=config.slots,
                                   busy=lambda: len(self.in_flight))
        self.metrics.configured_slots.set(config.slots)
        self.metrics.slots.set(config.slots)
        self.metrics.poll_only.set(int(self.listen_dsn is None))

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get `config.grace` seconds to finish. Called again
        (a second SIGTERM or Ctrl-C): hand the running jobs back now."""
        if self.stopping.is_set():
            if not self.hurry.is_set():
                log.warning("worker %s: stopped again; handing back %d running job(s) now",
                            self.worker_id, len(self.in_flight))
            self.hurry.set()
        else:
            log.info("worker %s stopping", self.worker_id)
        self.stopping.set()
        self.wake.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def run(self) -> None:
        """Wait until the database answers (serving the probes meanwhile), then work.

        With `until_empty` (a one-off drain, which nobody restarts) a database that is
        unreachable or not migrated at the start raises psycopg.OperationalError or
        SchemaNotMigratedError instead.
        """
        if not self.kinds:
            raise ValueError("this worker serves no job kinds")
        if self.config.until_empty:
            await probe(self.dsn, timeout=PROBE_TIMEOUT)
        self.background.start("reconnect", self._reconnect)
        try:
            if not await self._wait_online():
                if self.refusal is not None:
                    raise self.refusal
                return
            if self.listen_dsn is not None:
                self.background.start("listen", self._listen)
            self.leases.start()
            self.background.start("loop-watch", self.leases.watch_loop)
            self.background.start("heartbeat", self._beat)
            self.background.start("rate-limits", self._refresh_limits)
            if not self.config.until_empty:
                self.background.start("maintenance", self._maintain)
            await self._fetch_loop()
            await self._drain()
            await self._hand_back_leftovers()
        finally:
            await self.background.stop()
            await asyncio.to_thread(self.leases.stop)
            await self.slot_connections.close()
            if self.store is not None:
                await self.heartbeat.forget(self.store.pool)
                await self.store.close()
                await self.store.pool.close()

    def not_ready(self) -> list[str]:
        """What keeps this worker from being ready (/readyz); [] when ready."""
        problems = [self.database_problem] if self.database_problem else []
        if not self.listening and self.listen_dsn is not None:
            problems.append("LISTEN connection down")
        if self.leases.problem:
            problems.append(self.leases.problem)
        return problems + self.background.problems()

    def readiness_notes(self) -> list[str]:
        """What a ready worker runs with short of its configuration (/readyz's notes)."""
        notes = [self.budget_note] if self.budget_note else []
        if self.listen_dsn is None:
            notes.append(f"poll-only: no LISTEN connection behind the transaction pooler "
                         f"(set JOBPOOL_LISTEN_DSN); claiming every {self.poll_interval:g}s")
        return notes

    async def _start_up(self) -> None:
        """Register the kinds and this worker (before its first claim, so that its jobs
        never show a holder that is not live), find the lane's tenants, load the rate limits."""
        assert self.store is not None
        await self.store.register_kinds(self.specs.values())
        await self.heartbeat.beat(self.store.pool)
        if self.config.tenants:
            found, missing = await self._find_tenants(self.config.tenants)
            self.tenant_ids = list(found.values())
            if missing:
                self._wait_for_tenants(missing)
        try:
            await self.limiter.refresh(self.store.pool)
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            self.background.failed("rate-limits", exc)  # its task keeps trying meanwhile
        where = current_settings()
        log.info(
            "worker %s%s: %d slot(s), kinds %s, tenants %s", self.worker_id,
            f" (pool {where.pool}, lane {where.lane})" if where.pool and where.lane else "",
            self.slots, ",".join(self.kinds), ",".join(self.config.tenants) or "all",
        )
        self.started = True

    async def _find_tenants(
        self, refs: tuple[str, ...]
    ) -> tuple[dict[str, uuid.UUID], tuple[str, ...]]:
        """The tenants of `refs` (keys or ids) that exist, by ref, and the refs that do not."""
        from jobpool.admin import resolve_tenant

        assert self.store is not None
        found: dict[str, uuid.UUID] = {}
        async with self.store.pool.connection() as conn:
            for ref in refs:
                with contextlib.suppress(UnknownTenantError):
                    found[ref] = (await resolve_tenant(conn, ref))["id"]
        return found, tuple(ref for ref in refs if ref not in found)

    def _wait_for_tenants(self, missing: tuple[str, ...]) -> None:
        """Serve tenants created after the start once they exist; with `until_empty` they
        have no jobs to run (a job needs its tenant), so nothing is awaited."""
        if self.config.until_empty:
            log.warning("tenant(s) %s do not exist: nothing to run for them", ", ".join(missing))
            return
        log.warning("tenant(s) %s do not exist yet: serving them once created (checking "
                    "every %gs)", ", ".join(missing), TENANT_CHECK_EVERY)
        self.background.start("tenants", lambda: self._watch_tenants(missing))

    # -- claiming ------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        assert self.store is not None
        while not self.stopping.is_set():
            self.loop_beat = time.monotonic()
            if not self.online.is_set():
                await self._wait_online()
                continue
            self.wake.clear()
            await self._gather_completions()
            batch, self.completions = self.completions, []
            free = self.slots - len(self.in_flight) + len(batch)
            async with self.claiming:  # settling after an outage sees every claimed job started
                claimed = await self._complete_and_claim(batch, free)
                self.heartbeat.claimed(claimed)
                for row in claimed:
                    self._start(row)
            if not self.online.is_set():
                continue  # the claim failed: claim again once the database answers
            # a job that finished during the claim may have enqueued more: claim again first
            if (self.config.until_empty and not claimed and not self.in_flight
                    and not self.wake.is_set()):
                log.info("worker %s: nothing runnable left", self.worker_id)
                return
            if free > 0 and len(claimed) == free:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_interval)

    async def _complete_and_claim(
        self, batch: list[tuple[Completion, asyncio.Future[bool]]], limit: int
    ) -> list[dict[str, Any]]:
        """Write the batched `done`s and claim up to `limit` jobs, in one transaction."""
        assert self.store is not None
        if not batch and limit <= 0:
            return []
        try:
            held, claimed = await self.store.complete_and_claim(
                [completion for completion, _ in batch], kinds=self.kinds,
                tenants=self.tenant_ids, limit=max(limit, 0),
                throttled=self.throttled() if limit > 0 else [],
            )
        except Exception as exc:
            if not isinstance(exc, psycopg.Error) or not (lost_connection(exc) or batch):
                self._claim_failed(exc, batch)
                return []
            if lost_connection(exc):
                # written with the next claim, on a fresh connection
                self.completions[:0] = [(c._replace(resent=True), done) for c, done in batch]
                self._database_error(exc)
                return []
            log.warning("the batched done of %d job(s) was refused (%s); recording each on "
                        "its own", len(batch), exc)
            await self._complete_one_by_one(batch)
            return []
        self.claim_failures = 0
        for completion, done in batch:
            done.set_result(completion.job_id in held)
        return claimed

    def _claim_failed(
        self, exc: Exception, batch: list[tuple[Completion, asyncio.Future[bool]]]
    ) -> None:
        """The claim failed on a live connection: a statement refused (a handler left a
        prepared statement of the name psycopg uses next), or its rows could not be read.

        The worker goes on: claiming pauses (growing from RECONNECT_FIRST to CLAIM_RETRY_MAX
        seconds while it keeps failing), the pool's connections are replaced, claims that
        committed unread are handed back, and the batched `done`s are written again.
        """
        self.completions[:0] = [(c._replace(resent=True), done) for c, done in batch]
        self.claim_failures += 1
        pause = retry_pause(self.claim_failures, first=RECONNECT_FIRST, cap=CLAIM_RETRY_MAX,
                            rng=self.rng)
        self.database_problem = f"claim failed: {error_text(exc)}"
        log.warning("%s; replacing the pooled connections and claiming again in %.1fs",
                    self.database_problem, pause, exc_info=exc)
        self.online.clear()
        self.background.start("reconnect", lambda: self._reconnect(replace=True, pause=pause))

    async def _complete_one_by_one(
        self, batch: list[tuple[Completion, asyncio.Future[bool]]]
    ) -> None:
        """Record each `done` of a refused batch in its own transaction, so that only the job
        whose `done` the database refuses fails: refuses its value (a DataError or an
        IntegrityError: ResultRefused, to the DLQ). Any other refusal (a lost connection, a
        conflict, what a pooler or a session refuses) says nothing about the job: the rest
        of the batch goes with a later claim, as after a failed claim."""
        assert self.store is not None
        for index, (completion, done) in enumerate(batch):
            try:
                done.set_result(await self.store.complete_alone(completion))
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.errors.DataError | psycopg.errors.IntegrityError):
                    done.set_exception(ResultRefused(exc))
                    continue
                rest = batch[index:]
                if lost_connection(exc):  # the rest go with the next claim, on a fresh connection
                    self.completions[:0] = [(c._replace(resent=True), d) for c, d in rest]
                    self._database_error(exc)
                else:
                    self._claim_failed(exc, rest)
                return

    async def _gather_completions(self) -> None:
        """Let jobs that are finishing right now queue their `done` too, so that one
        transaction takes them all (a few event-loop turns, no waiting)."""
        seen = -1
        while seen != len(self.completions) and 0 < len(self.completions) < len(self.in_flight):
            seen = len(self.completions)
            for _ in range(4):
                await asyncio.sleep(0)

    def _completion_queued(self) -> None:
        """Wake the fetch loop for the queued `done`s once half the slots wait on one or every
        running job does, else at most `config.completion_delay` seconds later."""
        waiting = len(self.completions)
        if waiting >= len(self.in_flight) or waiting * 2 >= self.slots:
            self.wake.set()
        elif waiting == 1:
            asyncio.get_running_loop().call_later(self.config.completion_delay, self.wake.set)

    async def _flush_completions(self) -> None:
        """Keep writing batched `done`s while running jobs finish (after claiming stopped)."""
        while True:
            self.wake.clear()
            batch, self.completions = self.completions, []
            await self._complete_and_claim(batch, 0)
            await self.wake.wait()

    def throttled(self) -> list[str]:
        """`tenant/kind` pairs to leave out of the next claim: their next token is not due.

        Wakes the fetch loop when the first of those tokens is due: a lease's later tokens
        fall due with no denial to schedule that (unused, they would expire)."""
        wait = self.limiter.next_token_in()
        if wait is not None:
            if self.token_wake is not None:
                self.token_wake.cancel()
            self.token_wake = asyncio.get_running_loop().call_later(wait + WAKE_SLACK,
                                                                    self.wake.set)
        return self.limiter.throttled()

    def _start(self, row: dict[str, Any]) -> None:
        job = Job.from_row(row)
        self.leases.hold(job.id, job.job_kind, self.specs[job.job_kind].defaults.timeout)
        task = asyncio.create_task(self._execute(job, row), name=f"job-{job.id}")
        self.in_flight[job.id] = task
        task.add_done_callback(lambda _: self._finished(job.id))

    def _finished(self, job_id: int) -> None:
        self.leases.release(job_id)
        self.in_flight.pop(job_id, None)
        self.wake.set()

    async def _drain(self) -> None:
        """Give running jobs the grace period, then hand back the rest."""
        if not self.in_flight:
            return
        tasks = list(self.in_flight.values())
        log.info("waiting up to %.0fs for %d running job(s)", self.config.grace, len(tasks))
        flusher = asyncio.create_task(self._flush_completions(), name="completions")
        try:
            unfinished = await self._grace(tasks)
            self.releasing = True
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            if unfinished and not self.online.is_set():
                log.error("%d job(s) stopped while the database was unreachable: their claims "
                          "wait for stale-claim recovery", len(unfinished))
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    async def _grace(self, tasks: list[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """Wait for `tasks` up to `config.grace` seconds, or until `stop()` is called again;
        return those still running."""
        hurry: asyncio.Task[Any] = asyncio.create_task(self.hurry.wait(), name="hurry")
        waiting: set[asyncio.Task[Any]] = set(tasks)
        deadline = time.monotonic() + self.config.grace
        try:
            while waiting and not hurry.done() and (left := deadline - time.monotonic()) > 0:
                _, waiting = await asyncio.wait({*waiting, hurry}, timeout=left,
                                                return_when=asyncio.FIRST_COMPLETED)
                waiting.discard(hurry)
        finally:
            hurry.cancel()
        return {task for task in tasks if not task.done()}

    # -- running one job -----------------------------------------------------------------

    async def _execute(self, job: Job, row: Mapping[str, Any]) -> None:
        assert self.store is not None
        spec = self.specs[job.job_kind]
        started = time.monotonic()
        problem = payload_problem(job.payload)
        if problem is not None:
            self.observe(job, await self._fail(job, spec, PermanentError(problem)), started)
            return
        denied = await self.limiter.acquire(self.store.pool, job.tenant_id, job.job_kind)
        if denied is not None:
            await self._requeue_rate_limited(job, denied, started)
            return
        try:
            result = await self._run_in_transaction(job, spec)
        except ClaimLost:
            log.warning("job %d (%s): claim lost, its changes were rolled back",
                        job.id, job.job_kind)
            self.observe(job, "lost_claim", started)
        except asyncio.CancelledError:
            await self._hand_back(job)
            self.observe(job, "released", started)
            raise
        except Exception as exc:
            if transaction_conflict(exc) or interrupted_by_connection(exc) or isinstance(
                    exc, NoSlotConnection):
                outcome = await self._hand_back_interrupted(job, exc)
            else:
                outcome = await self._fail(job, spec, exc)
            self.observe(job, outcome, started)
        else:
            if log.isEnabledFor(logging.INFO):
                log.info("job %d (%s) done in %.3fs%s", job.id, job.job_kind,
                         time.monotonic() - started,
                         "" if result is None else f": {safe_str(result, what='its result')}")
            self.observe(job, "done", started)

    async def _run_in_transaction(self, job: Job, spec: KindSpec) -> Mapping[str, Any] | None:
        """Run the handler and mark the job done in its transaction.

        The handler's `tx` is taken from the slot connections on its first use. A handler
        that never used it, or sent no statement, has nothing to commit with its `done`: that
        job is completed later in a batch with others (`complete_jobs`). Raises ClaimLost when
        this worker no longer holds the claim.
        """
        tx = LazyConnection(self.slot_connections)
        try:
            if not self.config.batch_completions:
                conn = tx.connection()
                if isinstance(conn, JobConnection):
                    conn.job_scope = False  # the transaction below is the job's
                async with conn.transaction():
                    result = await self._call_handler(job, spec, conn)
                    await self._complete(conn, job, stored_result(result))
                    return result
            try:
                result = await self._call_handler(job, spec, cast(AsyncConnection[Any], tx))
                stored = stored_result(result)
                used = tx.taken
                if used is not None and used.info.transaction_status != TransactionStatus.IDLE:
                    await self._complete(used, job, stored)
                    await self._commit(tx, job)
                    return result
            except BaseException:
                used = tx.taken
                if used is not None and not used.closed:
                    await used.rollback()
                raise
        finally:
            await tx.release()
        if not await self._complete_later(job, stored):
            raise ClaimLost
        return result

    async def _commit(self, tx: LazyConnection, job: Job) -> None:
        """COMMIT the job's transaction and reset its session, in one round trip
        (`commit_and_release`). When that query fails, its COMMIT may have gone through
        before a reset statement failed (a handler's statement_timeout, say): the job's row
        says which, and only a COMMIT that failed fails the job."""
        assert self.store is not None
        try:
            await tx.commit_and_release()
        except psycopg.Error as exc:
            try:
                committed = await self.store.committed_done(job.id, job.attempts)
            except psycopg.Error:
                raise exc from None  # unknown: the failure path's writes are compare-and-set
            if not committed:
                raise
            log.warning("job %d (%s): committed, but resetting its session failed (%s)",
                        job.id, job.job_kind, error_text(exc))

    async def _complete(self, conn: AsyncConnection[Any], job: Job, stored: str | None) -> None:
        """Mark the job done in its transaction; raises ClaimLost, or ResultRefused."""
        assert self.store is not None
        self.leases.finishing(job.id)
        try:
            held = await self.store.complete(conn, job.id, job.attempts, stored)
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            raise ResultRefused(exc) from exc
        if not held:
            raise ClaimLost

    async def _complete_later(self, job: Job, stored: str | None) -> bool:
        """Queue the job's `done` for the fetch loop's next transaction; False: claim lost."""
        self.leases.finishing(job.id)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.completions.append((Completion(job.id, job.attempts, stored), done))
        self._completion_queued()
        return await done

    async def _call_handler(
        self, job: Job, spec: KindSpec, conn: AsyncConnection[Any]
    ) -> Mapping[str, Any] | None:
        deadline = asyncio.timeout(spec.defaults.timeout)
        try:
            async with deadline:
                result = await spec.handler(job, conn)
        except TimeoutError:
            if not deadline.expired():
                raise  # the handler's own (a mail server that did not answer), kept as it is
            raise TimeoutError(
                f"handler exceeded its timeout of {spec.defaults.timeout:g}s") from None
        except asyncio.CancelledError as exc:
            if self.releasing:
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
        if result is not None and not isinstance(result, Mapping):
            raise PermanentError(
                f"handler returned {type(result).__name__}, expected a mapping or None")
        return result

    async def _fail(self, job: Job, spec: KindSpec, exc: Exception) -> JobOutcome:
        """Carry out `decide_retry` for the failed attempt: write it, log it, wake for it."""
        assert self.store is not None
        self.leases.finishing(job.id)
        decision = decide_retry(attempts=job.attempts, max_attempts=job.max_attempts, exc=exc,
                                policy=spec.defaults.backoff, rng=self.rng)
        outcome: JobOutcome
        store = self.store
        try:
            match decision:
                case Retry(delay=wait, error=error):
                    held = await self._record(
                        lambda: store.retry(job.id, job.attempts, delay=wait, error=error))
                    outcome = "retry"
                    self._wake_in(wait)
                    log.info("job %d (%s) attempt %d failed, retry in %.1fs: %s",
                             job.id, job.job_kind, job.attempts, wait, error)
                case DeadLetter(error=error):
                    held = await self._record(
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

    async def _hand_back_interrupted(self, job: Job, exc: Exception) -> JobOutcome:
        """Hand back a job that the database, not its handler, stopped: its connection failed
        (a restart, a switchover, a pooler), or the server rolled its transaction back for a
        conflict with another, or no slot connection was ready after an outage. The attempt
        is not used: the job runs again as soon as the database answers (the others after
        `CONFLICT_PAUSE`)."""
        store = self.store
        assert store is not None
        conflict = transaction_conflict(exc)
        # a dead connection is replaced by the time the database answers; a conflict or a
        # missing slot connection may not have cleared yet
        delay = 0.0 if interrupted_by_connection(exc) else self.rng.uniform(*CONFLICT_PAUSE)
        try:
            held = await self._record(lambda: store.release(job.id, job.attempts, delay=delay))
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

    async def _hand_back_leftovers(self) -> None:
        """At a clean exit: hand back every job still claimed under this worker's id (an
        outcome that could not be written), waiting for the database up to
        `SHUTDOWN_SETTLE_TIMEOUT` seconds. Their attempt is not counted."""
        store = self.store
        if store is None or not self.started:
            return
        try:
            async with asyncio.timeout(SHUTDOWN_SETTLE_TIMEOUT):
                released = await self._record(
                    lambda: store.release_unrun_claims(list(self.in_flight)))
        except (TimeoutError, psycopg.Error) as exc:
            log.error("could not hand back this worker's leftover claims (%s); they wait for "
                      "stale-claim recovery", str(exc) or "the database did not answer")
            return
        if released:
            log.warning("handed back %d job(s) whose outcome could not be written: %s",
                        len(released), ", ".join(str(row["id"]) for row in released))

    async def _hand_back(self, job: Job) -> None:
        store = self.store
        assert store is not None
        self.leases.finishing(job.id)
        try:
            async with asyncio.timeout(SHUTDOWN_WRITE_TIMEOUT):
                held = await self._record(lambda: store.release(job.id, job.attempts))
        except (TimeoutError, psycopg.Error) as exc:
            log.error("job %d: could not hand back (%s); its lease will expire",
                      job.id, str(exc) or "the database did not answer")
            return
        if held:
            log.warning("job %d (%s) did not finish within the grace period; handed back",
                        job.id, job.job_kind)

    async def _requeue_rate_limited(self, job: Job, denied: Denied, started: float) -> None:
        """No token: back to pending until the next one is due; the attempt is not used up."""
        store = self.store
        assert store is not None
        self.leases.finishing(job.id)
        tenant = self.limiter.tenant_label(job.tenant_id)
        self.metrics.rate_limited(tenant, job.job_kind, denied.scope)
        self._wake_in(denied.retry_after)
        try:
            await self._record(
                lambda: store.release(job.id, job.attempts, delay=requeue_delay(denied)))
        except psycopg.Error as exc:
            log.error("job %d: could not requeue (%s); its lease will expire", job.id, exc)
            self.observe(job, "error", started)
            return
        log.debug("job %d (%s) requeued: %s", job.id, job.job_kind, describe(denied))
        self.observe(job, "rate_limited", started)

    async def _record(self, write: Callable[[], Awaitable[T]]) -> T:
        """Write a job's outcome with `write` (a compare-and-set: False means the claim is
        lost). When the connection fails, write it again once the database answers; after a
        conflict (serialization failure, deadlock) again after a pause; other errors are
        raised."""
        failures = 0
        while True:
            try:
                return await write()
            except psycopg.OperationalError as exc:
                failures += 1
                if transaction_conflict(exc):
                    await asyncio.sleep(self._reconnect_pause(failures))
                    continue
                if not lost_connection(exc):
                    raise
                self._database_error(exc)
                await self.online.wait()
                if failures > 1:  # not a dead pooled connection: do not hammer
                    await asyncio.sleep(self._reconnect_pause(failures - 1))

    def _wake_in(self, delay: float) -> None:
        """Wake the fetch loop when something this worker scheduled `delay` s ahead falls due."""
        asyncio.get_running_loop().call_later(delay + WAKE_SLACK, self.wake.set)

    def observe(self, job: Job, outcome: JobOutcome, started: float) -> None:
        """Record one finished attempt of `job` (its claim latency and run time) in metrics."""
        ran = outcome != "rate_limited"
        if outcome == "done":
            self.heartbeat.completed()
        self.metrics.observe(
            job.job_kind, outcome,
            claim_latency=(job.claimed_at - job.created_at).total_seconds() if ran else None,
            processing=time.monotonic() - started if ran else None,
        )

    # -- the database link --------------------------------------------------------------

    def _database_error(self, exc: psycopg.Error) -> None:
        """A statement failed with `exc`. If the connection failed: pause claiming, reconnect
        in the background. Else log it (the caller retries or gives up).

        A pool retired by the reconnect (PoolClosed) needs nothing: retry on the new one.
        """
        if isinstance(exc, PoolClosed):
            return
        if not lost_connection(exc):
            log.warning("database error: %s", exc)
            return
        if self.online.is_set():
            log.warning("database connection lost (%s); claiming paused until it answers", exc)
        self.online.clear()
        self.database_problem = f"database unreachable: {exc}"
        self.background.start("reconnect", self._reconnect)

    async def _wait_online(self) -> bool:
        """Wait until the database answers (True) or the worker stops (False), beating."""
        while True:
            self.wake.clear()
            if self.stopping.is_set() or self.online.is_set():
                return not self.stopping.is_set()
            self.loop_beat = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), BEAT_EVERY)

    def _reconnect_pause(self, failures: int) -> float:
        return retry_pause(failures, first=RECONNECT_FIRST, cap=RECONNECT_MAX, rng=self.rng)

    async def _reconnect(self, *, replace: bool = False, pause: float = 0.0) -> None:
        """Probe until the database answers, renew the pool, settle leftovers, go online.

        `replace`: a fresh pool even if the first probe answers; `pause`: seconds to wait first.
        """
        await asyncio.sleep(pause)
        lost_at = time.monotonic()
        failures = 0
        logged = lost_at
        while True:
            try:
                await probe(self.dsn, timeout=PROBE_TIMEOUT)
                if self.store is None or failures > 0:
                    await self._fit_budget()
                await self._renew_pool(replace=replace or failures > 0)
                await (self._settle_leftovers() if self.started else self._start_up())
                break
            except ConnectionBudgetError as exc:
                self.database_problem = f"connection budget: {exc}"
                if not self.started:
                    log.error("refusing to start: %s", exc)
                    self.refusal = exc
                    self.stop()
                    return
                failures += 1
                log.error("%s; checking again in %gs", self.database_problem, BUDGET_RETRY)
                await asyncio.sleep(BUDGET_RETRY)
            except (psycopg.OperationalError, SchemaNotMigratedError) as exc:
                failures += 1
                self.database_problem = (f"database unreachable: {exc}"
                                         if isinstance(exc, psycopg.OperationalError) else str(exc))
                if failures == 1 or time.monotonic() - logged >= STILL_DOWN_LOG_EVERY:
                    logged = time.monotonic()
                    log.warning("%s; trying again (%.0fs so far)", self.database_problem,
                                logged - lost_at)
                await asyncio.sleep(self._reconnect_pause(failures))
        self.database_problem = None
        self.online.set()
        self.wake.set()
        if failures:
            log.info("database answers after %.1fs", time.monotonic() - lost_at)

    async def _renew_pool(self, *, replace: bool) -> None:
        """A fresh pool after an outage (its pooled connections are dead, and the pool would
        replace them only with its own backoff, up to minutes); else drop the dead ones."""
        if self.store is not None and not replace:
            await self.slot_connections.fill(self.store.pool, timeout=PROBE_TIMEOUT)  # checks them
            return
        pool = await open_live_pool(self.dsn, size=pool_size(self.slots),
                                    name=f"jobpool-{self.worker_id}", timeout=PROBE_TIMEOUT,
                                    transaction_pooler=self.transaction_pooler)
        if self.store is None:
            self.store = QueueStore(pool, worker_id=self.worker_id, actor=self.actor,
                                    lease=self.lease, transaction_pooler=self.transaction_pooler)
            await self.slot_connections.fill(pool, timeout=PROBE_TIMEOUT)
            return
        retired = await self.store.replace_pool(pool)
        await self.slot_connections.fill(pool, timeout=PROBE_TIMEOUT)
        await retired.close()  # waiting clients get PoolClosed; used connections close on return

    async def _fit_budget(self) -> None:
        """Fit the slots to the connections the role and the server allow now
        (`core.connection_budget.plan_slots`), before a new pool opens: all configured slots
        when they fit, else fewer (logged, in /readyz's notes and `mdm_worker_slots_running`).

        Behind a transaction pooler the server's counts say nothing of the pooler's client
        connections: its own pool_size and max_client_conn are the budget there. Raises
        ConnectionBudgetError when not one slot fits, psycopg.OperationalError.
        """
        if self.transaction_pooler:
            return
        allowance = await connection_allowance(self.dsn, timeout=PROBE_TIMEOUT)
        need = Need(self.config.slots, listener=self.listen_dsn is not None,
                    gauges=self.metrics.gauges is not None,
                    maintenance=not self.config.until_empty)
        budget = plan_slots(need, allowance)
        note = budget.shortfall()
        if note != self.budget_note:
            if note:
                log.warning("%s", note)
            else:
                log.info("running all %d slot(s): the connection budget allows them again",
                         self.config.slots)
        self.budget_note = note
        self.slots = self.slot_connections.count = budget.slots
        self.metrics.slots.set(budget.slots)

    async def _settle_leftovers(self) -> None:
        """Renew the leases of the running jobs and hand back claims this worker never ran."""
        assert self.store is not None
        async with self.claiming:
            await asyncio.to_thread(self.leases.renew)
            released = await self.store.release_unrun_claims(list(self.in_flight))
        if released:
            log.warning("handed back %d job(s) claimed while the connection failed, never run: "
                        "%s", len(released), ", ".join(str(row["id"]) for row in released))

    # -- background ----------------------------------------------------------------------

    async def _refresh_limits(self) -> None:
        """Reload the tenants' rate limits every `limiter.refresh_every` seconds (the old ones
        stay while the database is unreachable)."""
        assert self.store is not None
        while True:
            await asyncio.sleep(self.limiter.refresh_every)
            await self.online.wait()
            try:
                await self.limiter.refresh(self.store.pool)
            except psycopg.OperationalError as exc:
                self._database_error(exc)
                continue
            self.background.healthy("rate-limits")

    async def _watch_tenants(self, missing: tuple[str, ...]) -> None:
        """Check for the lane's tenants that do not exist yet; serve each once it does."""
        while missing:
            await asyncio.sleep(TENANT_CHECK_EVERY)
            await self.online.wait()
            try:
                found, missing = await self._find_tenants(missing)
            except psycopg.OperationalError as exc:
                self._database_error(exc)
                continue
            if found:
                self.tenant_ids = [*(self.tenant_ids or ()), *found.values()]
                log.info("tenant(s) %s exist now: serving them", ", ".join(found))
                self.wake.set()
            self.background.healthy("tenants")

    async def _listen(self) -> None:
        """LISTEN for new jobs; after a lost connection, listen again once the database answers."""
        served = set(self.kinds)
        failures = 0
        while True:
            await self.online.wait()
            try:
                assert self.listen_dsn is not None
                async with await AsyncConnection.connect(with_tcp_liveness(self.listen_dsn),
                                                         autocommit=True) as conn:
                    await LISTEN_FOR_JOBS(conn)
                    self.listening, failures = True, 0
                    self.background.healthy("listen")
                    self.wake.set()  # catch up with whatever arrived while not listening
                    while True:
                        async for note in conn.notifies(timeout=15.0):
                            if note.payload in served:
                                self.wake.set()
                        await PING(conn)
            except psycopg.OperationalError as exc:
                self.listening = False  # readiness says so during the pause below
                failures += 1
                log.warning("listener lost its connection (%s); listening again once the "
                            "database answers", exc)
                self._database_error(exc)
                await asyncio.sleep(self._reconnect_pause(failures))
            finally:
                self.listening = False

    async def _beat(self) -> None:
        """Keep this worker's row in the registry of live workers fresh (worker/heartbeat.py)."""
        store = self.store
        assert store is not None
        await self.heartbeat.run(
            lambda: store.pool, online=self.online, database_error=self._database_error,
            healthy=lambda: self.background.healthy("heartbeat"))

    async def _maintain(self) -> None:
        """Run the periodic maintenance steps when this worker's turn comes
        (worker/maintenance.py)."""
        assert self.store is not None
        await keep_maintained(
            self.store, self.dsn, every=self.config.cleanup_every, online=self.online,
            rng=self.rng, healthy=lambda: self.background.healthy("maintenance"),
            database_error=self._database_error,
        )
