"""A worker's row in the registry of live workers (`jobpool.db.live_workers`), kept fresh.

The worker registers at its start-up, before its first claim. The fetch loop tells
`Heartbeat` of each claim and each job done (in memory, no I/O); the worker's lease thread
(worker/leases.py) writes the worker's state every `HEARTBEAT_EVERY` seconds in one UPDATE
on its own connection, outside the event loop: a handler that blocks the loop for longer
than `DEAD_AFTER` seconds does not make its live worker look dead (nor lets its row be
deleted and registered again) while its leases are renewed. A beat registers again when the
row was deleted as dead (after an outage longer than `DEAD_AFTER`), and every `PRUNE_EVERY`
beats deletes the rows of dead workers. `forget` deletes the worker's own row at a clean exit.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from jobpool.db import live_workers

log = logging.getLogger("jobpool.worker")

HEARTBEAT_EVERY = live_workers.HEARTBEAT_EVERY
"""Seconds between a worker's heartbeats."""

WINDOW = 60.0
"""Seconds the claims and completions of a heartbeat count back (its "last minute")."""

PRUNE_EVERY = 12
"""Heartbeats between deletions of dead workers' rows (a minute at 5 s)."""


class MinuteCounter:
    """Events of the last `WINDOW` seconds, in one-second buckets (memory bounded); added to
    from the event loop, read from the lease thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.buckets: deque[list[int]] = deque()
        self._lock = threading.Lock()

    def add(self, n: int = 1) -> None:
        second = int(self.clock())
        with self._lock:
            if self.buckets and self.buckets[-1][0] == second:
                self.buckets[-1][1] += n
            else:
                self.buckets.append([second, n])
            self._drop_old(second)

    def total(self) -> int:
        with self._lock:
            self._drop_old(int(self.clock()))
            return sum(n for _, n in self.buckets)

    def _drop_old(self, second: int) -> None:
        while self.buckets and self.buckets[0][0] <= second - WINDOW:
            self.buckets.popleft()


class Heartbeat:
    """The registry row of one worker: `identity` and, at each beat, its state now.

    `claimed` and `completed` are called in the event loop; `beat` and `forget` in the lease
    thread (or a thread of `asyncio.to_thread`), one at a time, on the lease connection.
    """

    def __init__(self, worker_id: str, *, pool: str | None, lane: str | None,
                 kinds: Sequence[str], tenants: Sequence[str], slots: int,
                 busy: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = live_workers.WorkerIdentity(
            worker_id=worker_id, host=socket.gethostname(), pid=os.getpid(), pool=pool,
            lane=lane, kinds=tuple(kinds), tenants=tuple(tenants), slots=slots)
        self.busy = busy
        self.claims = MinuteCounter(clock)
        self.completions = MinuteCounter(clock)
        self.last_claim_at: datetime | None = None
        self.registered = False
        self.beats = 0

    @property
    def every(self) -> float:
        """Seconds between beats (`HEARTBEAT_EVERY`)."""
        return HEARTBEAT_EVERY

    def claimed(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """The fetch loop claimed `rows` (their `claimed_at` is the database's time)."""
        if rows:
            self.claims.add(len(rows))
            self.last_claim_at = max(row["claimed_at"] for row in rows)

    def completed(self) -> None:
        """A job of this worker was marked done."""
        self.completions.add()

    def state(self) -> live_workers.WorkerBeat:
        return live_workers.WorkerBeat(
            busy_slots=min(self.busy(), self.identity.slots), last_claim_at=self.last_claim_at,
            claims_last_minute=self.claims.total(),
            completions_last_minute=self.completions.total())

    def beat(self, conn: psycopg.Connection[Any]) -> None:
        """Write the state now on `conn` (autocommit), registering when the row is missing;
        at the first beat and every `PRUNE_EVERY` beats, delete dead workers' rows first.
        Raises psycopg.Error."""
        if not self.registered or self.beats % PRUNE_EVERY == PRUNE_EVERY - 1:
            gone = live_workers.forget_dead_workers(conn)
            if gone:
                log.info("forgot %d dead worker(s): %s", len(gone), ", ".join(gone))
        if not live_workers.beat_worker(conn, self.identity, self.state()):
            if self.registered:
                log.warning("worker %s: registered again (its row was taken for a dead "
                            "worker's)", self.identity.worker_id)
            live_workers.register_worker(conn, self.identity, self.state())
        self.registered = True
        self.beats += 1

    def forget(self, conn: psycopg.Connection[Any]) -> None:
        """Delete this worker's row on `conn` (a clean exit); a failure leaves it to die with
        its heartbeat (readers ignore it once its heartbeat is old)."""
        if not self.registered:
            return
        try:
            live_workers.forget_worker(conn, self.identity.worker_id)
        except psycopg.Error as exc:
            log.warning("worker %s: could not delete its row in the registry of live "
                        "workers (%s); readers ignore it once its heartbeat is old",
                        self.identity.worker_id, str(exc) or "the database did not answer")
        else:
            self.registered = False
