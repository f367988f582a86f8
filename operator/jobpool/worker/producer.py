"""The worker's fetch loop over its slots: claim into the free ones and a bounded buffer
beside them, run each claimed job on a task of its own (`JobExecutor.execute`), and at the
end give the running jobs the grace period before handing back the rest.

Each claim goes out with the `done`s the completer queued (one transaction) and takes up to
the free slots plus the room in the prefetch buffer: what the slots start in a few claim
round trips at the rate they run, at most `WorkerConfig.prefetch` jobs (core/prefetch.py).
A job starts as soon as a slot frees: a slot is busy while its handler runs, not while its
batched `done` waits for the next claim, so the next claim goes out while jobs run, once
the buffer has fallen to its low-water mark (`low_water`), and not before (`claim_ahead`):
the `done`s queued meanwhile wait for it, while the buffer's jobs take their slots. One
claim is in flight at a time, written in one write (`jobpool.db.one_write`), so the server
never waits for the rest of it while the loop runs jobs. Buffered jobs start in claim
order. Each is covered by the lease thread from its claim on, with no deadline until it
starts (its kind's timeout counts from its start). A buffered job that a stop or
stale-claim recovery took away is dropped unrun. The buffer is handed back whole (the
attempts not counted, idle workers woken) once its oldest job has waited `BUFFER_WAIT`
seconds, because every slot runs a long handler (and it is refilled only while jobs flow:
`claim_limit`), at shutdown, and after an outage.

The loop waits for a wake-up (LISTEN, a finished job, a queued `done`, something scheduled
falling due) or the poll interval, and while the database link is offline for it to answer
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from jobpool.core.prefetch import (
    buffer_room,
    claim_limit,
    first_room,
    low_water,
    observed_rate,
)
from jobpool.core.shutdown import BUFFER_HAND_BACK_TIMEOUT, SHUTDOWN_WRITE_TIMEOUT
from jobpool.db.queries import Row
from jobpool.job import Job, JobContext
from jobpool.metrics import JobOutcome
from jobpool.registry import KindSpec
from jobpool.worker import tracing
from jobpool.worker.completer import Pending
from jobpool.worker.config import WorkerConfig
from jobpool.worker.stops import Stops

log = logging.getLogger("jobpool.worker")

BEAT_EVERY = 5.0
"""Seconds between fetch-loop beats (/healthz) while claiming waits for the database."""

BUFFER_WAIT = 1.0
"""Seconds the oldest job of the prefetch buffer may wait for a slot; past them every slot is
taken by handlers that run long, and the whole buffer is handed back (the attempts not
counted) for other workers to run, and refilled only once a slot frees. A claim sees pauses
and stops at once; a buffered job is at most this long behind them."""


class Batches(Protocol):
    """The completer's side the producer needs (`jobpool.worker.completer.Completer`)."""

    async def gather(self) -> None: ...

    def take(self) -> list[Pending]: ...

    def overdue(self) -> bool:
        """Whether a queued `done` has waited long enough to go without the low-water claim."""
        ...

    @property
    def waiting(self) -> int:
        """Jobs whose handler is over and whose `done` waits to be written."""
        ...

    async def send(
        self, batch: list[Pending], *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None,
        limit: int, caps: Callable[[], Mapping[str, int]],
    ) -> list[Row]: ...

    async def flush(self) -> None: ...


class Attempts(Protocol):
    """The executor's side the producer needs (`jobpool.worker.executor.JobExecutor`)."""

    releasing: bool

    async def execute(self, job: Job) -> JobOutcome: ...


class Returns(Protocol):
    """The store's hand-backs of claimed jobs that never ran (`QueueStore`): pending again at
    their place in the queue, the attempt not counted, idle workers woken."""

    async def release_unrun_claims(self, running: Sequence[int]) -> list[Row]: ...


class Holds(Protocol):
    """The lease keeper's side the producer needs (`LeaseKeeper`)."""

    def hold(self, job_id: int, kind: str, timeout: float) -> None: ...

    def running(self, job_id: int, kind: str, timeout: float) -> None: ...

    def release(self, job_id: int) -> None: ...


class Producer:
    """Claims into free slots and runs the claimed jobs of one worker.

    `slots()`: the slots the worker runs with now; `tenants()`: the tenant ids it serves
    (None: all); `caps()`: the most jobs of each rate-limited pair the next claim may take
    (`QueueStore.claim`); `claimed(rows)` and `observe(job, outcome, started)` report claims
    and finished attempts; `wake` is set by whoever has news for the loop, `online` by the
    database link. `in_flight` maps each
    started job's id to its task (until its outcome is written); `buffer` holds the claimed
    jobs not started yet, in claim order (at most `config.prefetch` beyond the free slots).
    """

    def __init__(
        self, *, config: WorkerConfig, kinds: Sequence[str], specs: Mapping[str, KindSpec],
        wake: asyncio.Event, online: asyncio.Event, leases: Holds, slots: Callable[[], int],
        tenants: Callable[[], Sequence[uuid.UUID] | None], caps: Callable[[], Mapping[str, int]],
        claimed: Callable[[list[Row]], None],
        observe: Callable[[Job, JobOutcome, float], None], poll_interval: float,
        worker_id: str, job_context: JobContext, stops: Stops,
    ) -> None:
        self.config = config
        self.kinds = kinds
        self.specs = specs
        self.online = online
        self.leases = leases
        self.slots = slots
        self.tenants = tenants
        self.caps = caps
        self.claimed = claimed
        self.observe = observe
        self.poll_interval = poll_interval
        self.worker_id = worker_id
        self.job_context = job_context
        self.stops = stops
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.buffer: dict[int, Buffered] = {}
        self.prefetch = config.prefetch
        self.rate = 0.0
        """Jobs started per second, smoothed over claim rounds (`core.prefetch.observed_rate`)."""
        self.started = 0
        """Jobs started since the last claim round."""
        self.room = first_room(self.prefetch)
        """Jobs the buffer may hold now (`core.prefetch.buffer_room`): at most `prefetch`, and
        at the first claim at most `core.prefetch.FIRST_ROOM`."""
        self._rate_since: float | None = None
        self.wake = wake
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        """Set by a second stop: the grace period ends at once."""
        self.claiming = asyncio.Lock()
        """Held while a claim is written and its jobs start (settling after an outage takes
        it, to see every claimed job started)."""
        self.loop_beat = time.monotonic()
        self._completer: Batches | None = None
        self._executor: Attempts | None = None

    def busy(self) -> int:
        """Slots taken: started jobs whose handler has not ended (a job waiting for its
        batched `done` no longer takes one)."""
        waiting = self._completer.waiting if self._completer is not None else 0
        return max(len(self.in_flight) - waiting, 0)

    async def wait_online(self) -> bool:
        """Wait until the database answers (True) or the worker stops (False), beating."""
        while True:
            self.wake.clear()
            if self.stopping.is_set() or self.online.is_set():
                return not self.stopping.is_set()
            self.loop_beat = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BEAT_EVERY):  # not wait_for: see `event_loop`
                    await self.wake.wait()

    async def run(self, completer: Batches, executor: Attempts, returns: Returns) -> None:
        """Claim and start jobs until stopped (or, with `until_empty`, nothing is left)."""
        self._completer, self._executor = completer, executor
        while not self.stopping.is_set():
            self.loop_beat = time.monotonic()
            if not self.online.is_set():
                await self.wait_online()
                continue
            self.wake.clear()
            self.fill()
            async with self.claiming:  # not while settling after an outage hands back the buffer
                await self._hand_back_stalled(returns)
            if self.claim_ahead():
                await self._wait_for_wake()
                continue
            if not self.buffer:  # else the claim goes now, to be back before the buffer runs dry
                await completer.gather()
            batch = completer.take()
            self._measure_rate()
            limit = claim_limit(slots=self.slots(), busy=self.busy(),
                                buffered=len(self.buffer), room=self.room, sending=bool(batch))
            async with self.claiming:  # settling after an outage sees every claimed job started
                claimed = await completer.send(batch, kinds=self.kinds, tenants=self.tenants(),
                                               limit=limit, caps=self.caps)
                self.claimed(claimed)
                for row in claimed:
                    self._buffer(Job.from_row(row, self.job_context), row.get("trace_context"))
                self.fill()
            if not self.online.is_set():
                continue  # the claim failed: claim again once the database answers
            # a job that finished during the claim may have enqueued more: claim again first
            if (self.config.until_empty and not claimed and not self.in_flight
                    and not self.buffer and not self.wake.is_set()):
                log.info("worker %s: nothing runnable left", self.worker_id)
                return
            if limit > 0 and len(claimed) == limit:
                continue
            await self._wait_for_wake()

    def claim_ahead(self) -> bool:
        """Whether the buffer holds more than its low-water mark: the slots have work for more
        than the next claim's round trip, so the claim waits until it falls to the mark (the
        queued `done`s go with it), or until a queued `done` is overdue (the slots took long
        jobs meanwhile: `completer.DONE_WAIT`). A claim sent earlier would take only the few
        jobs the buffer has room for, and cost a transaction; sent later, the slots would
        wait for it."""
        completer = self._completer
        return (len(self.buffer) > low_water(self.room)
                and not (completer is not None and completer.overdue()))

    def _measure_rate(self) -> None:
        """Update the start rate and the buffer's room from the jobs started since the last
        claim round (core/prefetch.py)."""
        now, since, started = time.monotonic(), self._rate_since, self.started
        self.started, self._rate_since = 0, now
        if since is None:  # the first round: the rate is measured from here on
            return
        self.rate = observed_rate(self.rate, started, now - since)
        self.room = buffer_room(self.rate, self.prefetch, self.busy())

    async def _wait_for_wake(self) -> None:
        """Wait for a wake-up, at most `_wait_for()` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._wait_for()):  # not wait_for: see `event_loop`
                await self.wake.wait()

    def _wait_for(self) -> float:
        """Seconds the loop may wait for a wake-up: the poll interval, or less while the
        buffer's oldest job is due to be handed back (`BUFFER_WAIT`)."""
        if not self.buffer:
            return self.poll_interval
        oldest = next(iter(self.buffer.values())).claimed
        return min(self.poll_interval, max(oldest + BUFFER_WAIT - time.monotonic(), 0.0))

    def _buffer(self, job: Job, trace_context: Any) -> None:
        """Hold a just-claimed job until a slot frees; its lease is renewed from now on, with
        no deadline until it starts."""
        self.leases.hold(job.id, job.job_kind, math.inf)
        self.buffer[job.id] = Buffered(job, trace_context, time.monotonic())

    def fill(self) -> None:
        """Start buffered jobs, oldest claim first, while a slot is free (not while the
        database link is offline: the buffer is handed back when it answers again)."""
        executor = self._executor
        if (not self.buffer or executor is None or not self.online.is_set()
                or self.stopping.is_set()):
            return
        free = self.slots() - self.busy()
        if free <= 0:
            return
        buffer = self.buffer
        for _ in range(min(free, len(buffer))):
            waiting = buffer.pop(next(iter(buffer)))
            self._start(executor, waiting.job, waiting.trace_context)
        if len(buffer) <= low_water(self.room):
            self.wake.set()  # the next claim goes out while the started jobs run

    def unbuffer(self) -> list[int]:
        """Drop every buffered job (to be handed back by the caller); their ids. Their leases
        are no longer renewed."""
        dropped = list(self.buffer)
        self.buffer.clear()
        for job_id in dropped:
            self.leases.release(job_id)
        return dropped

    def claim_lost(self, job_id: int, stopped: bool) -> None:
        """The lease renewal found job `job_id` no longer claimed here (`stopped`: by a stop,
        else by stale-claim recovery): a buffered one is dropped unrun, a started one's
        handler is cancelled (worker/stops.py)."""
        if self._drop(job_id, "stopped" if stopped else "taken back by stale-claim recovery"):
            return
        self.stops.claim_lost(job_id, stopped)

    def stop_notified(self, payload: str) -> None:
        """A stop notification (payload: the job's id): a buffered job is dropped unrun (the
        stop took its claim), a started one's handler is cancelled."""
        if payload.strip().isdigit() and self._drop(int(payload), "stopped"):
            return
        self.stops.notified(payload)

    def _drop(self, job_id: int, why: str) -> bool:
        """Drop buffered job `job_id` (its claim is gone); False if it is not buffered."""
        waiting = self.buffer.pop(job_id, None)
        if waiting is None:
            return False
        self.leases.release(job_id)
        log.info("job %d (%s) %s before it started: not run", job_id, waiting.job.job_kind, why)
        self.wake.set()
        return True

    async def _hand_back_stalled(self, returns: Returns) -> None:
        """Hand back the whole buffer once its oldest job has waited `BUFFER_WAIT` seconds
        for a slot (jobs start in claim order, so no slot freed meanwhile)."""
        if (self.buffer and time.monotonic() - next(iter(self.buffer.values())).claimed
                >= BUFFER_WAIT):
            await self._hand_back_buffer(returns, "every slot stayed busy")

    def _start(self, executor: Attempts, job: Job, trace_context: Any = None) -> None:
        self.leases.running(job.id, job.job_kind, self.specs[job.job_kind].defaults.timeout)
        self.started += 1
        task = asyncio.create_task(self._attempt(executor, job, trace_context),
                                   name=f"job-{job.id}")
        self.in_flight[job.id] = task
        self.stops.running(job.id, job.job_kind, task)  # a stop cancels it: worker/stops.py
        task.add_done_callback(lambda _: self.finished(job.id))

    async def _attempt(self, executor: Attempts, job: Job, trace_context: Any) -> None:
        """Run one attempt in its span (`trace_context`: the enqueuer's, stored with the job;
        worker/tracing.py) and report its outcome."""
        started = time.monotonic()
        with tracing.attempt_span(job, trace_context):
            try:
                outcome = await executor.execute(job)
            except asyncio.CancelledError:
                stopped = self.stops.stopping(job.id)  # stopped: its outcome, no hand-back
                self.observe(job, self.stops.outcome(job.id) if stopped else "released",
                             started)
                raise
            self.observe(job, outcome, started)

    def finished(self, job_id: int) -> None:
        """The job's task ended (or a stopped job's handler was abandoned): free its slot."""
        self.stops.finished(job_id)
        self.leases.release(job_id)
        self.in_flight.pop(job_id, None)
        self.wake.set()
        self.fill()

    def slot_freed(self) -> None:
        """A handler ended and its `done` waits for the next claim: its slot takes the next
        buffered job now."""
        self.fill()

    async def drain(self, completer: Batches, executor: Attempts, returns: Returns) -> None:
        """Hand back the buffered jobs at once, give running jobs the grace period, then
        hand back the rest."""
        await self._hand_back_buffer(returns)
        if not self.in_flight:
            return
        tasks = list(self.in_flight.values())
        log.info("waiting up to %.0fs for %d running job(s)", self.config.grace, len(tasks))
        flusher = asyncio.create_task(completer.flush(), name="completions")
        try:
            unfinished = await self._grace(tasks)
            executor.releasing = True
            for task in unfinished:
                task.cancel()
            if unfinished:  # each one's hand-back write is bounded too: wait for that
                await asyncio.wait(unfinished,
                                   timeout=self.config.stop_grace + SHUTDOWN_WRITE_TIMEOUT)
            self._abandon_stuck({task for task in unfinished if not task.done()})
            if unfinished and not self.online.is_set():
                log.error("%d job(s) stopped while the database was unreachable: their claims "
                          "wait for stale-claim recovery", len(unfinished))
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    def _abandon_stuck(self, stuck: set[asyncio.Task[None]]) -> None:
        """Leave the jobs whose handlers did not end within `config.stop_grace` (and the
        hand-back write's own bound) of their cancellation (a handler that catches
        asyncio.CancelledError and goes on): no longer running here, so the hand-back at
        exit (`release_unrun_claims`) takes their claims back, their attempt not counted;
        their transactions roll back as the worker's connections close. Waiting for them
        would keep the worker from exiting for as long as they run, a second SIGTERM or
        Ctrl-C notwithstanding."""
        for job_id, task in list(self.in_flight.items()):
            if task not in stuck:
                continue
            del self.in_flight[job_id]
            self.leases.release(job_id)  # handed back at exit: no lease to renew
            if not self.online.is_set():  # its hand-back waits for the database
                log.error("job %d: its hand-back did not get through within %gs, the database "
                          "being unreachable; the worker stops without it", job_id,
                          self.config.stop_grace + SHUTDOWN_WRITE_TIMEOUT)
            else:
                log.error("job %d did not end within %gs of its cancellation (a handler that "
                          "ignores asyncio.CancelledError?): the worker stops without it; its "
                          "claim is handed back and its transaction rolls back", job_id,
                          self.config.stop_grace + SHUTDOWN_WRITE_TIMEOUT)

    async def _hand_back_buffer(self, returns: Returns, why: str = "stopping") -> None:
        """Hand back every claimed job that has not started (at shutdown, or when the buffer
        stalled; not while the database is unreachable: then they go with the leftovers at
        exit, or with those the link settles when it answers again)."""
        dropped = self.unbuffer()
        if not dropped or not self.online.is_set():
            return
        try:
            async with asyncio.timeout(BUFFER_HAND_BACK_TIMEOUT):
                released = await returns.release_unrun_claims(list(self.in_flight))
        except (TimeoutError, psycopg.Error) as exc:
            log.warning("could not hand back %d buffered job(s) now (%s); handed back at exit",
                        len(dropped), str(exc) or "the database did not answer")
            return
        log.info("handed back %d claimed job(s) that had not started (%s)", len(released), why)

    async def _grace(self, tasks: list[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """Wait for `tasks` up to `config.grace` seconds, or until `hurry` is set; return
        those still running."""
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


class Buffered:
    """A claimed job waiting in the buffer for a slot: the job, its enqueuer's trace context,
    and its claim's `time.monotonic()`."""

    __slots__ = ("claimed", "job", "trace_context")

    def __init__(self, job: Job, trace_context: Any, claimed: float) -> None:
        self.job = job
        self.trace_context = trace_context
        self.claimed = claimed
