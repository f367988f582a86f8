"""One worker process: the composition of its parts, and what runs beside its fetch loop.

The parts, one owner each: the database link (`worker/database_link.py`: online state,
reconnects, pool renewal), the completer (`worker/completer.py`: batched `done`s, re-sends,
the one-by-one fallback), the executor (`worker/executor.py`: one attempt of one job in its
transaction) and the producer (`worker/producer.py`: the fetch loop over the slots, the
grace period). `Worker` builds them, starts the background tasks (LISTEN, the lease thread
with the heartbeat, rate limits, maintenance, late tenants) and settles what an outage left: when
the database answers again it renews the leases of the running jobs and hands back claims
it never ran. Before each new pool the worker fits its slots to the connections the
database allows (`core.connection_budget`). At a clean exit every job still claimed under
its id is handed back.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from jobpool.core.connection_budget import Need, plan_slots
from jobpool.core.process_group import STOP_SIGNALS
from jobpool.core.retry import error_text
from jobpool.core.shutdown import SHUTDOWN_SETTLE_TIMEOUT
from jobpool.db.connect import KEEP_WHEN_IDLE, connection_allowance, with_tcp_liveness
from jobpool.db.own_sessions import count_as_own
from jobpool.db.queries import Exec, One, Row
from jobpool.db.reconnect import PROBE_TIMEOUT
from jobpool.db.store import QueueStore
from jobpool.db.tenant_lookup import resolve_tenant
from jobpool.errors import UnknownTenantError
from jobpool.job import Job, JobContext
from jobpool.metrics import JobOutcome, WorkerMetrics
from jobpool.registry import KindSpec, Registry
from jobpool.settings import Settings
from jobpool.settings import current as current_settings
from jobpool.worker import tracing
from jobpool.worker.background import BackgroundTasks
from jobpool.worker.completer import Completer
from jobpool.worker.config import (
    POLL_ONLY_INTERVAL,
    WorkerConfig,
    claim_lease,
    make_worker_id,
    resolve_kinds,
)
from jobpool.worker.database_link import DatabaseLink, PoolConnector
from jobpool.worker.executor import JobExecutor
from jobpool.worker.heartbeat import Heartbeat
from jobpool.worker.leases import LeaseKeeper
from jobpool.worker.leftovers import Leftovers, WatchedStore
from jobpool.worker.maintenance import keep_maintained
from jobpool.worker.producer import Producer
from jobpool.worker.slot_connections import SlotConnections
from jobpool.worker.stops import STOP_CHANNEL, Stops
from jobpool.worker.token_store import WAKE_SLACK, TokenStore, warn_uncapped_kinds

log = logging.getLogger("jobpool.worker")

LISTEN_FOR_JOBS = Exec("listen_for_jobs")
LISTEN_FOR_STOPS = Exec("listen_for_stops")
PING = One("ping")

TENANT_CHECK_EVERY = 5.0
"""Seconds between checks for a lane's tenants that do not exist yet."""


def pool_size(slots: int) -> int:
    """Pooled connections of a worker with `slots` slots: one per slot (a handler's `tx`) and
    one for outcomes written alone and token requests; claims have a connection of their own
    (`QueueStore.complete_and_claim`), LISTEN another, lease renewals a third (`LeaseKeeper`)."""
    return slots + 1


class StoreFactory(Protocol):
    """Makes a worker's queue store on its pool (`QueueStore` itself, or a subclass)."""

    def __call__(self, pool: AsyncConnectionPool[Any], *, worker_id: str, actor: str,
                 lease: float, transaction_pooler: bool) -> QueueStore: ...


class Worker:
    """Runs jobs of `config`'s kinds and tenants with `config.slots` at once.

    `run()` returns after `stop()` (or SIGTERM/SIGINT) once running jobs finished or were
    handed back, or, with `until_empty`, once nothing runnable is left. `make_store` makes
    the queue store on the worker's pool (a subclass may narrow what it claims);
    `on_outcome(job, outcome)` is called for every finished attempt. `actor` is the audit
    principal of everything it and its handlers write; `settings` (None: the process's,
    `jobpool.settings.current()`) and `registry` are its own, handed to the handlers as
    `job.context`.
    """

    def __init__(
        self, dsn: str, registry: Registry, config: WorkerConfig, *, actor: str,
        rng: random.Random | None = None, limiter: TokenStore | None = None,
        make_store: StoreFactory = QueueStore,
        on_outcome: Callable[[Job, JobOutcome], None] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.settings = current_settings() if settings is None else settings
        self.job_context = JobContext(actor=actor, settings=self.settings, registry=registry)
        """What its handlers get as `job.context`: this worker's actor, settings, registry."""
        self.dsn = dsn
        self.registry = registry
        self.config = config
        self.actor = actor
        self.worker_id = make_worker_id()
        self.kinds = resolve_kinds(registry.names(), config.kinds, config.exclude_kinds)
        self.specs: dict[str, KindSpec] = {k: registry.get(k) for k in self.kinds}
        self.rng = rng or random.Random()
        self.make_store = make_store
        self.on_outcome = on_outcome
        self.tenant_ids: list[uuid.UUID] | None = None
        self.listening = False
        self.limiter = limiter or TokenStore.from_settings(self.settings)
        warn_uncapped_kinds(self.limiter.caps.kinds, registry.names())
        self.token_wake: asyncio.TimerHandle | None = None
        self.metrics = WorkerMetrics()
        self.leftovers = Leftovers()
        """Jobs claimed under this worker's id whose outcome is not written, and claims that
        got no answer: what a stopping worker must hand back before it exits."""
        self.slots = config.slots
        """Slots the worker runs with: `config.slots`, or fewer for the connection budget."""
        self.budget_note: str | None = None
        self.transaction_pooler = config.pooler == "transaction"
        self.listen_dsn = config.listen_dsn or (None if self.transaction_pooler else dsn)
        """Where LISTEN goes; None: poll-only (a transaction pooler without a direct DSN)."""
        self.poll_interval = (config.poll_interval if self.listen_dsn is not None
                              else min(config.poll_interval, POLL_ONLY_INTERVAL))
        self.lease = claim_lease(config.lease_ttl,
                                 (s.defaults.stale_ttl for s in self.specs.values()))
        """Seconds each claim is leased for: the worker's lease, capped by its kinds' stale
        TTLs, at least `MIN_LEASE_TTL` (`claim_lease`)."""
        self.stops = Stops(grace=config.stop_grace, finishing=lambda job_id:
                           self.leases.is_finishing(job_id),
                           abandon=self._abandon)
        """Stops of running jobs: a stop cancels the job's handler (worker/stops.py)."""
        self.abandoning: set[asyncio.Task[None]] = set()
        """Slots of abandoned jobs getting a connection of their own again (`_abandon`)."""
        where = self.settings
        self.heartbeat = Heartbeat(self.worker_id, pool=where.pool, lane=where.lane,
                                   kinds=self.kinds, tenants=config.tenants, slots=config.slots,
                                   busy=lambda: self.producer.busy())
        self.leases = LeaseKeeper(dsn, worker_id=self.worker_id, actor=actor, lease=self.lease,
                                  recover=not config.until_empty,
                                  transaction_pooler=self.transaction_pooler,
                                  lost=self._claim_lost,
                                  heartbeat=self.heartbeat)
        self.slot_connections = SlotConnections(config.slots)
        self.background = BackgroundTasks(self.rng)
        wake = asyncio.Event()
        self.link: DatabaseLink[QueueStore] = DatabaseLink(
            PoolConnector(dsn, name=f"jobpool-{self.worker_id}",
                          size=lambda: pool_size(self.slots),
                          transaction_pooler=self.transaction_pooler,
                          direct_dsn=config.listen_dsn if self.transaction_pooler else None,
                          slot_connections=self.slot_connections, fit=self._fit_budget,
                          make_store=self._make_store),
            arrive=self._arrive, background=self.background, wake=wake, refused=self.stop,
            rng=self.rng, one_off=config.until_empty)
        self.producer = Producer(
            config=config, kinds=self.kinds, specs=self.specs, wake=wake,
            online=self.link.online, leases=self.leases, slots=lambda: self.slots,
            tenants=lambda: self.tenant_ids, caps=self.claim_caps, claimed=self._claimed,
            observe=self.observe, poll_interval=self.poll_interval, worker_id=self.worker_id,
            job_context=self.job_context, stops=self.stops)
        self.metrics.configured_slots.set(config.slots)
        self.metrics.slots.set(config.slots)
        self.metrics.poll_only.set(int(self.listen_dsn is None))

    def _claim_lost(self, job_id: int, stopped: bool) -> None:
        """The lease renewal found `job_id` no longer claimed here (a stop, a recovery)."""
        self.leftovers.lost(job_id)
        self.producer.claim_lost(job_id, stopped)

    def _stop_notified(self, payload: str) -> None:
        """A stop notification: the stop took the claim of the job its payload names."""
        if payload.strip().isdigit():
            self.leftovers.lost(int(payload))
        self.producer.stop_notified(payload)

    def _make_store(self, pool: AsyncConnectionPool[Any]) -> QueueStore:
        return self.make_store(pool, worker_id=self.worker_id, actor=self.actor,
                               lease=self.lease, transaction_pooler=self.transaction_pooler)

    @property
    def started(self) -> bool:
        """Whether the worker started up (registered, found its tenants) on its database."""
        return self.link.started

    @property
    def wake(self) -> asyncio.Event:
        """Set to wake the fetch loop (a new job, a finished one, something falling due)."""
        return self.producer.wake

    @property
    def claiming(self) -> asyncio.Lock:
        """Held while a claim is written and its jobs start."""
        return self.producer.claiming

    @property
    def loop_beat(self) -> float:
        """`time.monotonic()` of the fetch loop's last beat (/healthz)."""
        return self.producer.loop_beat

    def loop_blocked(self) -> tuple[float, str] | None:
        """Seconds the event loop has been blocked and by what, while it is (/healthz)."""
        return self.leases.blocked()

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get `config.grace` seconds to finish. Called again
        (a second SIGTERM or Ctrl-C): hand the running jobs back now."""
        producer = self.producer
        if producer.stopping.is_set():
            if not producer.hurry.is_set():
                log.warning("worker %s: stopped again; handing back %d running job(s) now",
                            self.worker_id, len(producer.in_flight))
            producer.hurry.set()
        else:
            log.info("worker %s stopping", self.worker_id)
        producer.stopping.set()
        producer.wake.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.stop)

    async def run(self) -> None:
        """Wait until the database answers (serving the probes meanwhile), then work.

        With `until_empty` (a one-off drain, which nobody restarts) a database that is
        unreachable or not migrated at the start raises psycopg.OperationalError or
        SchemaNotMigratedError instead, and one that refuses the probe's statements (a
        statement timeout they cannot meet) StartRefusedError.
        """
        if not self.kinds:
            raise ValueError("this worker serves no job kinds")
        if self.config.until_empty:
            await self.link.probe_first()
        self.link.start()
        try:
            store = self.link.store if await self.producer.wait_online() else None
            if store is None:  # stopped, or refused, before the database answered
                if self.link.refusal is not None:
                    raise self.link.refusal
                return
            watched = WatchedStore(store, self.leftovers)
            completer = Completer(watched, self.link, wake=self.producer.wake,
                                  running=lambda: len(self.producer.in_flight),
                                  slots=lambda: self.slots, delay=self.config.completion_delay,
                                  rng=self.rng, freed=self.producer.slot_freed,
                                  claim_coming=lambda: bool(self.producer.buffer))
            executor = JobExecutor(
                store, writer=self.link, completer=completer,
                slot_connections=self.slot_connections, leases=self.leases,
                limiter=self.limiter, specs=self.specs, wake=self.producer.wake,
                metrics=self.metrics, rng=self.rng, stopped=self.stops.stopping)
            self._start_background(store)
            await self.producer.run(completer, executor, watched)
            await self.producer.drain(completer, executor, watched)
            await self._hand_back_leftovers(store)
        finally:
            await self.background.stop()
            await asyncio.to_thread(self.leases.stop)  # deletes the registry row
            await self._end_abandoning()
            await self.slot_connections.close()
            if self.link.store is not None:
                await self.link.store.close()
                await self.link.store.pool.close()

    def _start_background(self, store: QueueStore) -> None:
        if self.listen_dsn is not None:
            listen_dsn = self.listen_dsn
            self.background.start("listen", lambda: self._listen(listen_dsn))
        self.leases.start()
        self.background.start("loop-watch", self.leases.watch_loop)
        self.background.start("rate-limits", lambda: self._refresh_limits(store))
        if not self.config.until_empty:
            self.background.start("maintenance", lambda: self._maintain(store))

    def not_ready(self) -> list[str]:
        """What keeps this worker from being ready (/readyz); [] when ready."""
        problems = [self.link.problem] if self.link.problem else []
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

    async def _arrive(self, store: QueueStore, first: bool) -> None:
        """The database answers (again): start up the first time, else settle leftovers."""
        await (self._start_up(store) if first else self._settle_leftovers(store))

    async def _start_up(self, store: QueueStore) -> None:
        """Register the kinds and this worker (before its first claim, so that its jobs
        never show a holder that is not live), find the lane's tenants, load the rate limits."""
        await store.register_kinds(self.specs.values())
        await asyncio.to_thread(self.leases.beat)  # later beats come from the lease thread
        if self.config.tenants:
            found, missing = await self._find_tenants(store, self.config.tenants)
            self.tenant_ids = list(found.values())
            if missing:
                self._wait_for_tenants(store, missing)
        try:
            await self.limiter.refresh(store.pool)
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            self.background.failed("rate-limits", exc)  # its task keeps trying meanwhile
        where = self.settings
        log.info(
            "worker %s%s: %d slot(s), kinds %s, tenants %s", self.worker_id,
            f" (pool {where.pool}, lane {where.lane})" if where.pool and where.lane else "",
            self.slots, ",".join(self.kinds), ",".join(self.config.tenants) or "all",
        )

    async def _settle_leftovers(self, store: QueueStore) -> None:
        """Renew the leases of the running jobs and hand back claims this worker never ran
        (its prefetch buffer among them)."""
        async with self.producer.claiming:
            await asyncio.to_thread(self.leases.renew)
            self.producer.unbuffer()
            running = list(self.producer.in_flight)
            released = await store.release_unrun_claims(running)
            self.leftovers.settled(running)
        if released:
            log.warning("handed back %d job(s) claimed while the connection failed, never run: "
                        "%s", len(released), ", ".join(str(row["id"]) for row in released))

    async def _hand_back_leftovers(self, store: QueueStore) -> None:
        """At a clean exit: hand back every job still claimed under this worker's id (an
        outcome that could not be written, a claim whose answer never came), waiting for the
        database up to `SHUTDOWN_SETTLE_TIMEOUT` seconds. Their attempt is not counted. With
        none that could be (`Leftovers.in_doubt`), nothing is asked: the worker exits at
        once, also while the database is unreachable."""
        if not self.leftovers.in_doubt:
            return
        released: list[Row]
        running = list(self.producer.in_flight)
        try:
            async with asyncio.timeout(SHUTDOWN_SETTLE_TIMEOUT):
                released = await self.link.write(lambda: store.release_unrun_claims(running))
        except (TimeoutError, psycopg.Error) as exc:
            log.error("could not hand back this worker's leftover claims (%s); they wait for "
                      "stale-claim recovery", str(exc) or "the database did not answer")
            return
        self.leftovers.settled(running)
        if released:
            log.warning("handed back %d job(s) whose outcome could not be written: %s",
                        len(released), ", ".join(str(row["id"]) for row in released))

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

    def _abandon(self, job_id: int) -> None:
        """A stopped job's handler ignored its stop past the grace (worker/stops.py): its slot
        takes the next job once it has a connection of its own again, as the abandoned handler
        keeps the one it took (`SlotConnections.abandon`) until its task ends."""
        running = self.producer.in_flight.get(job_id)
        if running is not None:
            running.add_done_callback(lambda _: self.slot_connections.ended(job_id))
        task = asyncio.create_task(self._free_abandoned_slot(job_id), name=f"abandon-{job_id}")
        self.abandoning.add(task)
        task.add_done_callback(self.abandoning.discard)

    async def _end_abandoning(self) -> None:
        """Cancel the slots still getting a connection for an abandoned job (`_abandon`: up
        to `slot_connections.REPLACE_TIMEOUT` each; the pool closes next) and wait for them,
        so that none is left pending when the worker's loop ends."""
        tasks = list(self.abandoning)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _free_abandoned_slot(self, job_id: int) -> None:
        try:
            await self.slot_connections.abandon(job_id)
        except Exception as exc:  # the pool closed meanwhile (shutdown, an outage)
            log.warning("no connection for the slot of abandoned job %d (%s)", job_id,
                        error_text(exc))
        finally:
            self.producer.finished(job_id)

    def observe(self, job: Job, outcome: JobOutcome, started: float) -> None:
        """Record one finished attempt of `job` (`started`: its `time.monotonic()` at the
        start): tell `on_outcome`, count a `done` for the live-worker registry, and put its
        claim latency and run time in metrics (and on the attempt's span, worker/tracing.py)."""
        tracing.attempt_outcome(outcome)
        self.leftovers.ended(job.id, outcome, stopping=self.producer.stopping.is_set())
        if self.on_outcome is not None:
            self.on_outcome(job, outcome)
        ran = outcome != "rate_limited"
        if outcome == "done":
            self.heartbeat.completed()
        self.metrics.observe(
            job.job_kind, outcome,
            claim_latency=(job.claimed_at - job.created_at).total_seconds() if ran else None,
            processing=time.monotonic() - started if ran else None,
        )

    def claim_caps(self) -> dict[str, int]:
        """The most jobs of each rate-limited pair the next claim may take (0: leave it out;
        `TokenStore.claim_caps`).

        Wakes the fetch loop when the first token of a pair left out is due: a lease's later
        tokens, and the bucket's refill, fall due with no denial to schedule that. The wake
        already set for that time is kept (this runs at every claim)."""
        wait = self.limiter.next_token_in()
        if wait is not None:
            loop = asyncio.get_running_loop()
            due = loop.time() + wait + WAKE_SLACK
            woken = self.token_wake
            if woken is None or woken.when() <= loop.time() or abs(woken.when() - due) > WAKE_SLACK:
                if woken is not None:
                    woken.cancel()
                self.token_wake = loop.call_later(wait + WAKE_SLACK, self.wake.set)
        return self.limiter.claim_caps(self.kinds)

    def _claimed(self, rows: list[Row]) -> None:
        """A claim took `rows`: the registry counts them, the token store promises their
        tokens until they start, and they are in doubt until their outcome is written
        (`leftovers`)."""
        self.heartbeat.claimed(rows)
        self.limiter.claimed(rows)
        self.leftovers.claimed(rows)

    # -- tenants -------------------------------------------------------------------------

    async def _find_tenants(
        self, store: QueueStore, refs: tuple[str, ...]
    ) -> tuple[dict[str, uuid.UUID], tuple[str, ...]]:
        """The tenants of `refs` (keys or ids) that exist, by ref, and the refs that do not."""
        found: dict[str, uuid.UUID] = {}
        async with store.pool.connection() as conn:
            for ref in refs:
                try:
                    found[ref] = (await resolve_tenant(conn, ref))["id"]
                except UnknownTenantError:
                    continue
        return found, tuple(ref for ref in refs if ref not in found)

    def _wait_for_tenants(self, store: QueueStore, missing: tuple[str, ...]) -> None:
        """Serve tenants created after the start once they exist; with `until_empty` they
        have no jobs to run (a job needs its tenant), so nothing is awaited."""
        if self.config.until_empty:
            log.warning("tenant(s) %s do not exist: nothing to run for them", ", ".join(missing))
            return
        log.warning("tenant(s) %s do not exist yet: serving them once created (checking "
                    "every %gs)", ", ".join(missing), TENANT_CHECK_EVERY)
        self.background.start("tenants", lambda: self._watch_tenants(store, missing))

    async def _watch_tenants(self, store: QueueStore, missing: tuple[str, ...]) -> None:
        """Check for the lane's tenants that do not exist yet; serve each once it does."""
        while missing:
            await asyncio.sleep(TENANT_CHECK_EVERY)
            await self.link.online.wait()
            try:
                found, missing = await self._find_tenants(store, missing)
            except psycopg.OperationalError as exc:
                self.link.lost(exc)
                continue
            if found:
                self.tenant_ids = [*(self.tenant_ids or ()), *found.values()]
                log.info("tenant(s) %s exist now: serving them", ", ".join(found))
                self.producer.wake.set()
            self.background.healthy("tenants")

    # -- background ----------------------------------------------------------------------

    async def _refresh_limits(self, store: QueueStore) -> None:
        """Reload the tenants' rate limits every `limiter.refresh_every` seconds (the old ones
        stay while the database is unreachable)."""
        while True:
            await asyncio.sleep(self.limiter.refresh_every)
            await self.link.online.wait()
            try:
                await self.limiter.refresh(store.pool)
            except psycopg.OperationalError as exc:
                self.link.lost(exc)
                continue
            self.background.healthy("rate-limits")

    async def _listen(self, listen_dsn: str) -> None:
        """LISTEN for new jobs and stops; after a lost connection, listen again once the
        database answers."""
        served = set(self.kinds)
        failures = 0
        while True:
            await self.link.online.wait()
            try:
                async with count_as_own(await AsyncConnection.connect(
                        with_tcp_liveness(listen_dsn), autocommit=True)) as conn:
                    await KEEP_WHEN_IDLE(conn)  # it idles between wake-ups
                    await LISTEN_FOR_JOBS(conn)
                    await LISTEN_FOR_STOPS(conn)
                    self.listening, failures = True, 0
                    self.background.healthy("listen")
                    self.wake.set()  # catch up with whatever arrived while not listening
                    while True:
                        async for note in conn.notifies(timeout=15.0):
                            if note.channel == STOP_CHANNEL:
                                self._stop_notified(note.payload)
                            elif note.payload in served:
                                self.wake.set()
                        await PING(conn)
            except psycopg.OperationalError as exc:
                self.listening = False  # readiness says so during the pause below
                failures += 1
                log.warning("listener lost its connection (%s); listening again once the "
                            "database answers", exc)
                self.link.lost(exc)
                await asyncio.sleep(self.link.pause_after(failures))
            finally:
                self.listening = False

    async def _maintain(self, store: QueueStore) -> None:
        """Run the periodic maintenance steps when this worker's turn comes
        (worker/maintenance.py)."""
        await keep_maintained(
            store, self.dsn, self.registry.steps(), settings=self.settings, actor=self.actor,
            every=self.config.cleanup_every,
            online=self.link.online, rng=self.rng,
            healthy=lambda: self.background.healthy("maintenance"),
            database_error=self.link.lost,
        )
