"""A worker's row in the registry of live workers (`jobpool.db.live_workers`), kept fresh.

The worker registers at its start-up, before its first claim. The fetch loop tells
`Heartbeat` of each claim and each job done (in memory, no I/O); its background task writes
the worker's state every `HEARTBEAT_EVERY` seconds in one UPDATE,
registers again when its row was deleted as dead (after an outage longer than `DEAD_AFTER`),
and deletes the rows of dead workers once a minute. `forget` deletes the worker's own row at
a clean exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from jobpool.db.live_workers import (
    HEARTBEAT_EVERY,
    WorkerBeat,
    WorkerIdentity,
    beat_worker,
    forget_dead_workers,
    forget_worker,
    register_worker,
)

log = logging.getLogger("jobpool.worker")

WINDOW = 60.0
"""Seconds the claims and completions of a heartbeat count back (its "last minute")."""

PRUNE_EVERY = 12
"""Heartbeats between deletions of dead workers' rows (a minute at 5 s)."""

FORGET_TIMEOUT = 2.0
"""Seconds a clean exit waits to delete its row; a row left behind dies with its heartbeat."""


class MinuteCounter:
    """Events of the last `WINDOW` seconds, in one-second buckets (memory bounded)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.buckets: deque[list[int]] = deque()

    def add(self, n: int = 1) -> None:
        second = int(self.clock())
        if self.buckets and self.buckets[-1][0] == second:
            self.buckets[-1][1] += n
        else:
            self.buckets.append([second, n])
        self._drop_old(second)

    def total(self) -> int:
        self._drop_old(int(self.clock()))
        return sum(n for _, n in self.buckets)

    def _drop_old(self, second: int) -> None:
        while self.buckets and self.buckets[0][0] <= second - WINDOW:
            self.buckets.popleft()


class Heartbeat:
    """The registry row of one worker: `identity` and, at each beat, its state now."""

    def __init__(self, worker_id: str, *, pool: str | None, lane: str | None,
                 kinds: Sequence[str], tenants: Sequence[str], slots: int,
                 busy: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.identity = WorkerIdentity(
            worker_id=worker_id, host=socket.gethostname(), pid=os.getpid(), pool=pool,
            lane=lane, kinds=tuple(kinds), tenants=tuple(tenants), slots=slots)
        self.busy = busy
        self.claims = MinuteCounter(clock)
        self.completions = MinuteCounter(clock)
        self.last_claim_at: datetime | None = None
        self.registered = False

    def claimed(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """The fetch loop claimed `rows` (their `claimed_at` is the database's time)."""
        if rows:
            self.claims.add(len(rows))
            self.last_claim_at = max(row["claimed_at"] for row in rows)

    def completed(self) -> None:
        """A job of this worker was marked done."""
        self.completions.add()

    def state(self) -> WorkerBeat:
        return WorkerBeat(busy_slots=min(self.busy(), self.identity.slots),
                          last_claim_at=self.last_claim_at,
                          claims_last_minute=self.claims.total(),
                          completions_last_minute=self.completions.total())

    async def beat(self, pool: AsyncConnectionPool[Any], *, prune: bool = False) -> None:
        """Write the state now (registering when the row is missing); with `prune`, delete
        dead workers' rows first."""
        async with pool.connection() as conn:
            if prune or not self.registered:
                gone = await forget_dead_workers(conn)
                if gone:
                    log.info("forgot %d dead worker(s): %s", len(gone), ", ".join(gone))
            if not await beat_worker(conn, self.identity, self.state()):
                if self.registered:
                    log.warning("worker %s: registered again (its row was taken for a dead "
                                "worker's)", self.identity.worker_id)
                await register_worker(conn, self.identity, self.state())
        self.registered = True

    async def run(self, pool: Callable[[], AsyncConnectionPool[Any]], *,
                  online: asyncio.Event, healthy: Callable[[], None],
                  database_error: Callable[[psycopg.Error], None]) -> None:
        """Beat every `HEARTBEAT_EVERY` seconds while the database answers (`pool()` gives
        the worker's current pool: it is replaced after an outage); the worker's start-up
        beat registered it."""
        beats = 0
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            await online.wait()
            try:
                await self.beat(pool(), prune=beats % PRUNE_EVERY == PRUNE_EVERY - 1)
            except psycopg.OperationalError as exc:
                database_error(exc)
            else:
                beats += 1
                healthy()

    async def forget(self, pool: AsyncConnectionPool[Any]) -> None:
        """Delete this worker's row (a clean exit); a failure leaves it to die with its
        heartbeat."""
        if not self.registered:
            return
        try:
            async with asyncio.timeout(FORGET_TIMEOUT), pool.connection() as conn:
                await forget_worker(conn, self.identity.worker_id)
        except (TimeoutError, psycopg.Error) as exc:
            log.warning("worker %s: could not delete its row in the registry of live "
                        "workers (%s); readers ignore it once its heartbeat is old",
                        self.identity.worker_id, str(exc) or "the database did not answer")
        else:
            self.registered = False
