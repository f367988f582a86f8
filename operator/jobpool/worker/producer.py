"""The worker's fetch loop over its slots: claim into the free ones, run each claimed job
on a task of its own (`JobExecutor.execute`), and at the end give the running jobs the
grace period before handing back the rest.

Each claim goes out with the `done`s the completer queued (one transaction). The loop
waits for a wake-up (LISTEN, a finished job, a queued `done`, something scheduled falling
due) or the poll interval, and while the database link is offline for it to answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

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


class Batches(Protocol):
    """The completer's side the producer needs (`jobpool.worker.completer.Completer`)."""

    async def gather(self) -> None: ...

    def take(self) -> list[Pending]: ...

    async def send(
        self, batch: list[Pending], *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None,
        limit: int, throttled: Callable[[], list[str]],
    ) -> list[Row]: ...

    async def flush(self) -> None: ...


class Attempts(Protocol):
    """The executor's side the producer needs (`jobpool.worker.executor.JobExecutor`)."""

    releasing: bool

    async def execute(self, job: Job) -> JobOutcome: ...


class Holds(Protocol):
    """The lease keeper's side the producer needs (`LeaseKeeper`)."""

    def hold(self, job_id: int, kind: str, timeout: float) -> None: ...

    def release(self, job_id: int) -> None: ...


class Producer:
    """Claims into free slots and runs the claimed jobs of one worker.

    `slots()`: the slots the worker runs with now; `tenants()`: the tenant ids it serves
    (None: all); `throttled()`: the pairs the next claim leaves out; `claimed(rows)` and
    `observe(job, outcome, started)` report claims and finished attempts; `wake` is set by
    whoever has news for the loop, `online` by the database link. `in_flight` maps each
    running job's id to its task.
    """

    def __init__(
        self, *, config: WorkerConfig, kinds: Sequence[str], specs: Mapping[str, KindSpec],
        wake: asyncio.Event, online: asyncio.Event, leases: Holds, slots: Callable[[], int],
        tenants: Callable[[], Sequence[uuid.UUID] | None], throttled: Callable[[], list[str]],
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
        self.throttled = throttled
        self.claimed = claimed
        self.observe = observe
        self.poll_interval = poll_interval
        self.worker_id = worker_id
        self.job_context = job_context
        self.stops = stops
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.wake = wake
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        """Set by a second stop: the grace period ends at once."""
        self.claiming = asyncio.Lock()
        """Held while a claim is written and its jobs start (settling after an outage takes
        it, to see every claimed job started)."""
        self.loop_beat = time.monotonic()

    async def wait_online(self) -> bool:
        """Wait until the database answers (True) or the worker stops (False), beating."""
        while True:
            self.wake.clear()
            if self.stopping.is_set() or self.online.is_set():
                return not self.stopping.is_set()
            self.loop_beat = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), BEAT_EVERY)

    async def run(self, completer: Batches, executor: Attempts) -> None:
        """Claim and start jobs until stopped (or, with `until_empty`, nothing is left)."""
        while not self.stopping.is_set():
            self.loop_beat = time.monotonic()
            if not self.online.is_set():
                await self.wait_online()
                continue
            self.wake.clear()
            await completer.gather()
            batch = completer.take()
            free = self.slots() - len(self.in_flight) + len(batch)
            async with self.claiming:  # settling after an outage sees every claimed job started
                claimed = await completer.send(batch, kinds=self.kinds, tenants=self.tenants(),
                                               limit=free, throttled=self.throttled)
                self.claimed(claimed)
                for row in claimed:
                    self._start(executor, Job.from_row(row, self.job_context),
                                row.get("trace_context"))
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

    def _start(self, executor: Attempts, job: Job, trace_context: Any = None) -> None:
        self.leases.hold(job.id, job.job_kind, self.specs[job.job_kind].defaults.timeout)
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

    async def drain(self, completer: Batches, executor: Attempts) -> None:
        """Give running jobs the grace period, then hand back the rest."""
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
            await asyncio.gather(*unfinished, return_exceptions=True)
            if unfinished and not self.online.is_set():
                log.error("%d job(s) stopped while the database was unreachable: their claims "
                          "wait for stale-claim recovery", len(unfinished))
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

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
