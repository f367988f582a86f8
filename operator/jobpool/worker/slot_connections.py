"""The connections jobs run on: one per slot, handed to a job only when its handler uses `tx`.

Borrowing a pooled connection for every job cost about 13 µs of CPU per job (the pool's
lock, its bookkeeping, the session check on return; bench/RESULTS.md). So the worker takes
one connection per slot out of its pool when the pool opens and keeps them in a plain list;
a job's `tx` is a `jobpool.worker.executor.JobTransaction` that takes one from the list on
the handler's first use of it (any attribute: `tx.execute`, `tx.cursor()`, `tx.info`, ...).
A handler that never touches `tx` takes none, and its `done` goes into the fetch loop's
batch. The pool keeps its other connections for the worker's own queries (claims, leases,
failure writes).

A running job has a connection waiting for it: the list holds one for every slot that has
not taken its own, so taking never waits. A connection that comes back closed, in a
transaction, or from a pool retired after an outage is returned to its pool and replaced.
A job abandoned after its stop (its handler ignored the cancellation and still runs) keeps
its connection until that handler ends, and its slot gets another one before it takes the
next job (`abandon`).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from jobpool.errors import JobpoolError

log = logging.getLogger("jobpool.worker")


REPLACE_TIMEOUT = 1.0
"""Seconds a finished job waits for the replacement of a connection it closed or broke (the
job's outcome is written after it); without one in time, the next reconnect tops up."""


class NoSlotConnectionError(JobpoolError):
    """No connection is ready for the job: the database was unreachable when one was due."""


class SlotConnections:
    """`count` connections taken out of a pool, lent to one job at a time each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.idle: list[AsyncConnection[Any]] = []
        self.holders: dict[int, AsyncConnection[Any]] = {}
        """The connections lent to the slots' running jobs, by the id of the job that took
        each."""
        self.orphans: dict[AsyncConnection[Any], AsyncConnectionPool[Any]] = {}
        """Connections of abandoned jobs, each with the pool grown by one for it (`abandon`)."""
        self.abandoned: set[int] = set()
        """Ids of the abandoned jobs: a connection is never lent to one of them again."""
        self.pool: AsyncConnectionPool[Any] | None = None

    @property
    def lent(self) -> int:
        """Connections lent to the slots' running jobs."""
        return len(self.holders)

    async def fill(self, pool: AsyncConnectionPool[Any], *, timeout: float) -> None:
        """Serve from `pool` from now on, with live connections: the idle ones go back to
        their pool, `pool` drops those that no longer answer (`check`, after an outage), then
        one connection per slot not lent is taken again.

        A server near its connection limit may give fewer within `timeout` seconds: the
        worker runs with those (a job whose handler finds none fails with NoSlotConnectionError and
        is retried), and every connection handed back tops the list up again.
        """
        previous, self.pool = self.pool, pool
        idle, self.idle = self.idle, []
        if previous is not None:
            for conn in idle:
                await previous.putconn(conn)
        await pool.check()
        try:
            await self._top_up(timeout)
        except PoolTimeout:
            log.warning("%d of %d slot connections ready; the others follow when the server "
                        "gives them", len(self.idle), self.count - self.lent)

    async def _top_up(self, timeout: float | None = None) -> None:
        while len(self.idle) + self.lent < self.count:
            pool = self.pool
            assert pool is not None
            conn = await pool.getconn(timeout)
            if pool is not self.pool:  # replaced meanwhile: its own fill tops the list up
                await pool.putconn(conn)
                return
            if len(self.idle) + self.lent < self.count:
                self.idle.append(conn)
            else:  # a job handed one back meanwhile
                await pool.putconn(conn)

    def take(self, job_id: int) -> tuple[AsyncConnection[Any], AsyncConnectionPool[Any]]:
        """A connection for job `job_id`, and the pool it belongs to; never waits.

        Raises NoSlotConnectionError when none is ready (only after the database was unreachable;
        the next reconnect tops the list up).
        """
        if job_id in self.abandoned:
            raise NoSlotConnectionError("this job was abandoned after its stop: its handler "
                                        "gets no connection (its changes could not commit)")
        if not self.idle or self.pool is None:
            raise NoSlotConnectionError("no database connection is ready for this job (the "
                                        "database was unreachable); it is retried")
        conn = self.holders[job_id] = self.idle.pop()
        return conn, self.pool

    async def give_back(self, conn: AsyncConnection[Any], pool: AsyncConnectionPool[Any],
                        job_id: int) -> None:
        """Keep `conn` (taken by job `job_id`) for the next job if it is fit; else return it
        to `pool` and take a fresh one (left to the next hand-back or reconnect when the pool
        cannot give one within `REPLACE_TIMEOUT`). An abandoned job's goes back to `pool`,
        which shrinks back by the connection it grew by for it."""
        if conn in self.orphans:
            grown = self.orphans.pop(conn)
            await pool.putconn(conn)
            if grown is self.pool:  # not retired after an outage meanwhile
                await grown.resize(grown.min_size - 1, grown.max_size - 1)
            await self._replace()  # in case the slot's own could not be had at the abandon
            return
        self.holders.pop(job_id, None)
        if (pool is self.pool and not conn.closed
                and conn.info.transaction_status == TransactionStatus.IDLE):
            self.idle.append(conn)
            return
        await pool.putconn(conn)  # the pool closes or replaces it
        await self._replace()

    async def abandon(self, job_id: int) -> None:
        """Job `job_id` was abandoned: its handler ignored its stop and runs on, holding its
        connection if it took one, while its slot is freed for the next job. That connection
        no longer counts as the slot's: the pool grows by one connection for as long as the
        handler runs (the worker's own writes keep theirs), and the slot takes one now,
        within `REPLACE_TIMEOUT` seconds, so that the next job finds one. The handler gets no
        connection from here on (`take`), until its task ends (`ended`)."""
        self.abandoned.add(job_id)
        conn = self.holders.pop(job_id, None)
        pool = self.pool
        if conn is None or pool is None:
            return  # the handler never took one: the slot's is in the list
        self.orphans[conn] = pool
        await pool.resize(pool.min_size + 1, pool.max_size + 1)
        await self._replace()

    def ended(self, job_id: int) -> None:
        """The task of abandoned job `job_id` ended: a later attempt of the same job may take
        a connection again."""
        self.abandoned.discard(job_id)

    async def _replace(self) -> None:
        """Top the list up after a lent connection left it, within `REPLACE_TIMEOUT`."""
        try:
            await self._top_up(REPLACE_TIMEOUT)
        except (psycopg.OperationalError, PoolClosed) as exc:
            log.warning("no connection for a slot whose connection left yet (%s)", exc)

    async def close(self) -> None:
        """Return the idle connections to their pool (before the pool closes)."""
        idle, self.idle = self.idle, []
        if self.pool is not None:
            for conn in idle:
                await self.pool.putconn(conn)
