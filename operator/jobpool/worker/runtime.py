"""One worker process: claim into free slots, run each job in its transaction, renew leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import AsyncConnection

from jobpool.core.backoff import backoff_delay
from jobpool.core.outcomes import DeadLetter, Retry, decide_failure
from jobpool.db.connect import open_pool
from jobpool.db.store import QueueStore
from jobpool.errors import PermanentError, RetryAfter
from jobpool.job import Job
from jobpool.registry import KindSpec, Registry
from jobpool.worker.config import WorkerConfig, make_worker_id, resolve_kinds

log = logging.getLogger("jobpool.worker")

CHANNEL = "jobpool"


class ClaimLost(Exception):
    """The job's row is no longer running under this worker's claim."""


class Worker:
    """Runs jobs of `config`'s kinds and tenants with `config.slots` at once.

    `run()` returns after `stop()` (or SIGTERM/SIGINT) once running jobs finished or were
    handed back, or, with `until_empty`, once nothing runnable is left.
    """

    def __init__(
        self, dsn: str, registry: Registry, config: WorkerConfig, *, actor: str,
        rng: random.Random | None = None,
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
        self.attempts: dict[int, int] = {}
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.listening = False
        self.database_ok = False
        self.loop_beat = time.monotonic()
        self.store: QueueStore | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get `config.grace` seconds to finish."""
        if not self.stopping.is_set():
            log.info("worker %s stopping", self.worker_id)
        self.stopping.set()
        self.wake.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    async def run(self) -> None:
        if not self.kinds:
            raise ValueError("this worker serves no job kinds")
        pool = open_pool(self.dsn, size=self.config.slots + 2, name=f"jobpool-{self.worker_id}")
        await pool.open(wait=True, timeout=30)
        try:
            self.store = QueueStore(pool, worker_id=self.worker_id, actor=self.actor)
            await self.store.register_kinds(self.specs.values())
            self.tenant_ids = await self._resolve_tenants()
            self.database_ok = True
            log.info(
                "worker %s: %d slots, kinds %s, tenants %s", self.worker_id, self.config.slots,
                ",".join(self.kinds), ",".join(self.config.tenants) or "all",
            )
            background = [asyncio.create_task(self._listen(), name="listen"),
                          asyncio.create_task(self._renew_leases(), name="leases")]
            if "cleanup_jobs" in self.kinds and not self.config.until_empty:
                background.append(asyncio.create_task(self._schedule_cleanup(), name="cleanup"))
            try:
                await self._fetch_loop()
                await self._drain()
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
        finally:
            await pool.close()

    async def _resolve_tenants(self) -> list[uuid.UUID] | None:
        from jobpool.admin import resolve_tenant

        if not self.config.tenants:
            return None
        assert self.store is not None
        async with self.store.pool.connection() as conn:
            return [(await resolve_tenant(conn, ref))["id"] for ref in self.config.tenants]

    # -- claiming ------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        assert self.store is not None
        while not self.stopping.is_set():
            self.loop_beat = time.monotonic()
            self.wake.clear()
            free = self.config.slots - len(self.in_flight)
            claimed: list[dict[str, Any]] = []
            if free > 0:
                try:
                    claimed = await self.store.claim(
                        kinds=self.kinds, tenants=self.tenant_ids, limit=free,
                        throttled=self.throttled(),
                    )
                    self.database_ok = True
                except psycopg.OperationalError as exc:
                    self.database_ok = False
                    log.warning("claim failed, database unreachable: %s", exc)
                for row in claimed:
                    self._start(row)
            if self.config.until_empty and not claimed and not self.in_flight:
                log.info("worker %s: nothing runnable left", self.worker_id)
                return
            if free > 0 and len(claimed) == free:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.config.poll_interval)

    def throttled(self) -> list[str]:
        """`tenant/kind` pairs to leave out of the next claim (none by default)."""
        return []

    def _start(self, row: dict[str, Any]) -> None:
        job = Job.from_row(row)
        self.attempts[job.id] = job.attempts
        task = asyncio.create_task(self._execute(job, row), name=f"job-{job.id}")
        self.in_flight[job.id] = task
        task.add_done_callback(lambda _: self._finished(job.id))

    def _finished(self, job_id: int) -> None:
        self.in_flight.pop(job_id, None)
        self.attempts.pop(job_id, None)
        self.wake.set()

    async def _drain(self) -> None:
        """Give running jobs the grace period, then hand back the rest."""
        if not self.in_flight:
            return
        tasks = list(self.in_flight.values())
        log.info("waiting up to %.0fs for %d running job(s)", self.config.grace, len(tasks))
        _, unfinished = await asyncio.wait(tasks, timeout=self.config.grace)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)

    # -- running one job -----------------------------------------------------------------

    async def _execute(self, job: Job, row: Mapping[str, Any]) -> None:
        assert self.store is not None
        spec = self.specs[job.job_kind]
        started = time.monotonic()
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
            outcome = await self._fail(job, spec, exc)
            self.observe(job, outcome, started)
        else:
            log.info("job %d (%s) done in %.3fs%s", job.id, job.job_kind,
                     time.monotonic() - started, f": {dict(result)}" if result else "")
            self.observe(job, "done", started)

    async def _run_in_transaction(self, job: Job, spec: KindSpec) -> Mapping[str, Any] | None:
        assert self.store is not None
        async with self.store.pool.connection() as conn, conn.transaction():
            result = await self._call_handler(job, spec, conn)
            if not await self.store.complete(conn, job.id, job.attempts, result):
                raise ClaimLost
            return result

    async def _call_handler(
        self, job: Job, spec: KindSpec, conn: AsyncConnection[Any]
    ) -> Mapping[str, Any] | None:
        try:
            async with asyncio.timeout(spec.defaults.timeout):
                result = await spec.handler(job, conn)
        except TimeoutError:
            raise TimeoutError(
                f"handler exceeded its timeout of {spec.defaults.timeout:g}s") from None
        if result is not None and not isinstance(result, Mapping):
            raise PermanentError(
                f"handler returned {type(result).__name__}, expected a mapping or None")
        return result

    async def _fail(self, job: Job, spec: KindSpec, exc: Exception) -> str:
        assert self.store is not None
        delay = (exc.delay if isinstance(exc, RetryAfter)
                 else backoff_delay(job.attempts, spec.defaults.backoff, self.rng))
        decision = decide_failure(
            attempts=job.attempts, max_attempts=job.max_attempts,
            error=f"{type(exc).__name__}: {exc}", delay=delay,
            permanent=isinstance(exc, PermanentError),
        )
        try:
            match decision:
                case Retry(delay=wait, error=error):
                    held = await self.store.retry(job.id, job.attempts, delay=wait, error=error)
                    outcome = "retry"
                    log.info("job %d (%s) attempt %d failed, retry in %.1fs: %s",
                             job.id, job.job_kind, job.attempts, wait, error)
                case DeadLetter(error=error):
                    held = await self.store.dead_letter(job.id, job.attempts, error=error)
                    outcome = "dlq"
                    log.warning("job %d (%s) moved to the DLQ after %d attempt(s): %s",
                                job.id, job.job_kind, job.attempts, error)
        except psycopg.OperationalError as db_exc:
            log.error("job %d: could not record its failure (%s); its lease will expire",
                      job.id, db_exc)
            return "error"
        if not held:
            log.warning("job %d (%s): claim lost, failure not recorded", job.id, job.job_kind)
            return "lost_claim"
        return outcome

    async def _hand_back(self, job: Job) -> None:
        assert self.store is not None
        try:
            if await self.store.release(job.id, job.attempts):
                log.warning("job %d (%s) did not finish within the grace period; handed back",
                            job.id, job.job_kind)
        except psycopg.Error as exc:
            log.error("job %d: could not hand back (%s); its lease will expire", job.id, exc)

    def observe(self, job: Job, outcome: str, started: float) -> None:
        """Hook for metrics: one finished attempt of `job` with its outcome."""

    # -- background ----------------------------------------------------------------------

    def _lease_interval(self) -> float:
        shortest = min(spec.defaults.stale_ttl for spec in self.specs.values())
        return min(self.config.lease_interval, shortest / 3)

    async def _renew_leases(self) -> None:
        assert self.store is not None
        while True:
            await asyncio.sleep(self._lease_interval())
            ids = list(self.in_flight)
            try:
                held = await self.store.renew_leases(ids)
            except psycopg.Error as exc:
                log.warning("lease renewal failed: %s", exc)
                continue
            for lost in set(ids) - held:
                if lost in self.in_flight:
                    log.warning("job %d: lease lost (recovered elsewhere); its result will be "
                                "discarded", lost)

    async def _listen(self) -> None:
        """LISTEN for new jobs; reconnect with backoff when the connection dies."""
        pause = 0.5
        served = set(self.kinds)
        while True:
            try:
                async with await AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening, pause = True, 0.5
                    self.wake.set()  # catch up with whatever arrived while not listening
                    while True:
                        async for note in conn.notifies(timeout=15.0):
                            if note.payload in served:
                                self.wake.set()
                        await conn.execute("SELECT 1")
            except psycopg.Error as exc:
                self.listening = False
                log.warning("listener lost its connection (%s); reconnecting in %.1fs", exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 30.0)

    async def _schedule_cleanup(self) -> None:
        """Make sure the current slot's `cleanup_jobs` job exists (one per slot, however many
        workers ask)."""
        assert self.store is not None
        every = self.config.cleanup_every
        while True:
            try:
                job_id = await self.store.schedule_cleanup(every)
                if job_id is not None:
                    log.info("scheduled cleanup_jobs job %d", job_id)
            except psycopg.Error as exc:
                log.warning("could not schedule cleanup_jobs: %s", exc)
            await asyncio.sleep(min(60.0, every / 2) * self.rng.uniform(0.8, 1.2))
