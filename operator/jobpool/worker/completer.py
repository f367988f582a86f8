"""Batched `done`s: the jobs whose handler wrote nothing are marked done together, with the
next claim, in one transaction (`QueueStore.complete_and_claim`).

A job queues its `done` (`Completer.complete`) and waits for the answer: True when its
`done` was written, False when this worker no longer held its claim. When the connection
fails under a batch, the batch is queued again, marked `resent` (that try may have
committed unseen), and written with the next claim on a fresh connection. When the database
refuses a batch, each `done` is written on its own (`QueueStore.complete_alone`), so only
the job whose `done` is refused fails. When the claim fails on a live connection, the link
replaces the pooled connections after a pause that grows while claims keep failing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import psycopg

from jobpool.core.retry import error_text, retry_pause
from jobpool.db.failures import lost_connection, primary_message, refuses_value
from jobpool.db.queries import Row
from jobpool.db.reconnect import RECONNECT_FIRST
from jobpool.db.store import UNCAPPED, Completion, Written
from jobpool.errors import PermanentError

log = logging.getLogger("jobpool.worker")

Pending = tuple[Completion, "asyncio.Future[bool]"]
"""A queued `done` and the future its job waits on (True: written; False: claim lost)."""

DONE_WAIT = 0.05
"""Seconds a queued `done` waits at most for the claim the buffer's low-water mark sends
(`claim_coming`): the length of work the buffer holds (core/prefetch.py, `LOOKAHEAD`), so in a
steady flow the mark comes first; when the slots take long jobs meanwhile, this bounds it."""

LOCKED_RETRY = 0.2
"""Seconds before a `done` whose row another session held locked is sent again when no claim
takes it first (while the worker drains at shutdown, nothing else would)."""

LOCKED_WARN_AFTER = 10.0
"""Seconds a `done` may wait for a lock on its row before a warning names the job."""

CLAIM_RETRY_MAX = 30.0
"""Cap on the pause, seconds, before claiming again after claims failed on a live connection."""


class ResultRefused(PermanentError):
    """The database refused to record the job done with its result.

    The message keeps the server's primary message only: its detail (the failing row) and
    the statement's text around the error would carry the result itself into `last_error`.
    """

    def __init__(self, exc: psycopg.Error) -> None:
        super().__init__(f"the database refused to record the job done with its result "
                         f"({type(exc).__name__}: {primary_message(exc)})")


class CompletionStore(Protocol):
    """What the completer needs of the queue store (`jobpool.db.store.QueueStore`)."""

    async def complete_and_claim(
        self, completions: Sequence[Completion], *, kinds: Sequence[str],
        tenants: Sequence[uuid.UUID] | None, limit: int, caps: Mapping[str, int] = UNCAPPED,
    ) -> Written:
        """Mark `completions` done and claim up to `limit` jobs in one transaction."""
        ...

    async def complete_alone(self, completion: Completion) -> bool:
        """Mark one completion done in its own transaction; False: claim lost."""
        ...


class LinkReports(Protocol):
    """How the completer reports a failure to the database link (`DatabaseLink`)."""

    def lost(self, exc: psycopg.Error) -> None:
        """A statement failed with `exc` (a lost connection takes the link offline)."""
        ...

    def replace_connections(self, problem: str, *, pause: float) -> None:
        """Go offline for `problem`; reconnect on a fresh pool after `pause` seconds."""
        ...


class Completer:
    """The queue of batched `done`s of one worker and their writes.

    `running()`: jobs running now; `slots()`: the worker's slots; `wake` is set when the
    fetch loop should write the queue (`delay`: seconds a lone `done` may wait for others);
    `freed()` is called when a job queues its `done`: its handler is over, its slot may take
    the next job while the `done` waits (`waiting` counts those jobs).
    """

    def __init__(
        self, store: CompletionStore, link: LinkReports, *, wake: asyncio.Event,
        running: Callable[[], int], slots: Callable[[], int], delay: float,
        rng: random.Random, freed: Callable[[], None] = lambda: None,
        claim_coming: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.link = link
        self.wake = wake
        self.running = running
        self.slots = slots
        self.delay = delay
        self.rng = rng
        self.freed = freed
        self.claim_coming = claim_coming
        self.waiting = 0
        """Jobs waiting in `complete` for their `done` to be written."""
        self.queue: list[Pending] = []
        self.queued_at: float | None = None
        """Event-loop time the oldest queued `done` was queued at (None: the queue is empty)."""
        self.claim_failures = 0
        """Claims in a row that failed on a live connection (`_claim_failed`)."""
        self.locked_since: dict[int, float] = {}
        """Job id -> event-loop time its `done` first met a lock on its row."""

    async def complete(self, completion: Completion) -> bool:
        """Queue `completion` for the fetch loop's next transaction and wait for it to be
        written: False when this worker no longer held the claim. Raises ResultRefused."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        if not self.queue:
            self.queued_at = loop.time()
        self.queue.append((completion, done))
        self.waiting += 1
        try:
            self._queued()
            self.freed()
            return await done
        finally:
            self.waiting -= 1
            self.locked_since.pop(completion.job_id, None)

    def _queued(self) -> None:
        """Wake the fetch loop for the queued `done`s once half the slots wait on one or every
        running job does, else at most `delay` seconds later; while a claim is coming anyway
        (`claim_coming`: buffered jobs start in the freed slots, and the buffer's low-water
        mark sends the next claim, with these `done`s) at most `DONE_WAIT` seconds later."""
        waiting = len(self.queue)
        if self.claim_coming():
            if waiting == 1:
                asyncio.get_running_loop().call_later(DONE_WAIT, self.wake.set)
            return
        if waiting >= self.running() or waiting * 2 >= self.slots():
            self.wake.set()
        elif waiting == 1:
            asyncio.get_running_loop().call_later(self.delay, self.wake.set)

    async def gather(self) -> None:
        """Let jobs that are finishing right now queue their `done` too, so that one
        transaction takes them all (a few event-loop turns, no waiting)."""
        seen = -1
        while seen != len(self.queue) and 0 < len(self.queue) < self.running():
            seen = len(self.queue)
            for _ in range(4):
                await asyncio.sleep(0)

    def overdue(self) -> bool:
        """Whether the oldest queued `done` has waited `DONE_WAIT` seconds or more."""
        return (self.queued_at is not None
                and asyncio.get_running_loop().time() - self.queued_at >= DONE_WAIT)

    def take(self) -> list[Pending]:
        """The queued `done`s, to go with the next claim (`send`); the queue is empty after."""
        batch, self.queue, self.queued_at = self.queue, [], None
        return batch

    async def send(
        self, batch: list[Pending], *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None,
        limit: int, caps: Callable[[], Mapping[str, int]],
    ) -> list[Row]:
        """Write `batch` and claim up to `limit` jobs (`caps()`: the most of each rate-limited
        pair, `QueueStore.claim`), in one transaction; the claimed rows ([] when that failed:
        the link says why)."""
        if not batch and limit <= 0:
            return []
        try:
            held, claimed, busy = await self.store.complete_and_claim(
                [completion for completion, _ in batch], kinds=kinds, tenants=tenants,
                limit=max(limit, 0), caps=caps() if limit > 0 else UNCAPPED,
            )
        except Exception as exc:
            if not isinstance(exc, psycopg.Error) or not (lost_connection(exc) or batch):
                self._claim_failed(exc, batch)
                return []
            if lost_connection(exc):  # written with the next claim, on a fresh connection
                self._requeue(batch)
                self.link.lost(exc)
                return []
            log.warning("the batched done of %d job(s) was refused (%s: %s); recording each "
                        "on its own", len(batch), type(exc).__name__, primary_message(exc))
            await self._complete_one_by_one(batch)
            return []
        self.claim_failures = 0
        for completion, done in batch:
            if completion.job_id not in busy:
                done.set_result(completion.job_id in held)
        self._wait_for_locks([(c, done) for c, done in batch if c.job_id in busy])
        return claimed

    async def flush(self) -> None:
        """Keep writing the queued `done`s while running jobs finish (after claiming
        stopped); runs until cancelled."""
        while True:
            self.wake.clear()
            await self.send(self.take(), kinds=(), tenants=None, limit=0, caps=dict)
            await self.wake.wait()

    def _wait_for_locks(self, busy: list[Pending]) -> None:
        """Queue again the `done`s whose rows another session held locked (a handler's own
        open transaction on its row, an admin's, this worker's lease renewal for a moment):
        written with the next claim, or `LOCKED_RETRY` seconds on; a warning names a job
        whose `done` has waited `LOCKED_WARN_AFTER` seconds."""
        if not busy:
            return
        self._queue_first(busy)
        loop = asyncio.get_running_loop()
        now = loop.time()
        for completion, _ in busy:
            since = self.locked_since.setdefault(completion.job_id, now)
            if since <= now - LOCKED_WARN_AFTER:
                log.warning("job %d: its done has waited %.0fs for a lock another session "
                            "holds on its row (an open transaction?); it is written once the "
                            "lock goes", completion.job_id, now - since)
                self.locked_since[completion.job_id] = math.inf  # said once
        loop.call_later(LOCKED_RETRY, self.wake.set)

    def _requeue(self, batch: list[Pending]) -> None:
        """Put `batch` back at the head of the queue, marked `resent`: its try may have
        committed unseen, so the next write also asks whether it did."""
        self._queue_first([(c._replace(resent=True), done) for c, done in batch])

    def _queue_first(self, batch: list[Pending]) -> None:
        """Put `batch` at the head of the queue (sent before what was queued meanwhile)."""
        self.queue[:0] = batch
        if batch and self.queued_at is None:
            self.queued_at = asyncio.get_running_loop().time()

    def _claim_failed(self, exc: Exception, batch: list[Pending]) -> None:
        """The claim failed on a live connection: a statement refused (a handler left a
        prepared statement of the name psycopg uses next), or its rows could not be read.

        The worker goes on: claiming pauses (growing from RECONNECT_FIRST to
        CLAIM_RETRY_MAX seconds while it keeps failing), the pool's connections are
        replaced, claims that committed unread are handed back, and the batched `done`s are
        written again.
        """
        self._requeue(batch)
        self.claim_failures += 1
        pause = retry_pause(self.claim_failures, first=RECONNECT_FIRST, cap=CLAIM_RETRY_MAX,
                            rng=self.rng)
        problem = f"claim failed: {error_text(exc)}"
        log.warning("%s; replacing the pooled connections and claiming again in %.1fs",
                    problem, pause, exc_info=exc)
        self.link.replace_connections(problem, pause=pause)

    async def _complete_one_by_one(self, batch: list[Pending]) -> None:
        """Record each `done` of a refused batch in its own transaction, so that only the job
        whose `done` the database refuses fails: refuses its value (`refuses_value`:
        ResultRefused, to the DLQ). Any other refusal (a lost connection, a
        conflict, what a pooler or a session refuses) says nothing about the job: the rest
        of the batch goes with a later claim, as after a failed claim."""
        for index, (completion, done) in enumerate(batch):
            try:
                done.set_result(await self.store.complete_alone(completion))
            except psycopg.Error as exc:
                if refuses_value(exc):
                    done.set_exception(ResultRefused(exc))
                    continue
                rest = batch[index:]
                if lost_connection(exc):  # the rest go with the next claim, on a fresh connection
                    self._requeue(rest)
                    self.link.lost(exc)
                else:
                    self._claim_failed(exc, rest)
                return
