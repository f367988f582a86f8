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

A writing job's COMMIT leaves its session's reset to the next job on the connection, which
sends it with its BEGIN (`jobpool.db.connect.end_job_transaction`). A connection that is not
taken again within `IDLE_RESET_AFTER` seconds is reset on its own, in the list (its lock
keeps a job that takes it meanwhile waiting until the reset is over); one that goes back to
its pool before is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from jobpool.errors import JobpoolError

log = logging.getLogger("jobpool.worker")


REPLACE_TIMEOUT = 1.0
"""Seconds a finished job waits for the replacement of a connection it closed or broke (the
job's outcome is written after it); without one in time, the next reconnect tops up."""


IDLE_RESET_AFTER = 0.25
"""Seconds a connection whose session reset was left to its next job (`reset_due`) may sit
unused before it is reset on its own: how long a handler's forgotten session advisory lock,
temp tables or role may outlive its job. Under load every connection is taken again sooner,
and the reset goes with the next job's BEGIN."""


def reset_due(conn: AsyncConnection[Any]) -> bool:
    """Whether `conn`'s last job left its session reset to the next (`JobConnection`)."""
    return bool(getattr(conn, "reset_due", False))


class NoSlotConnectionError(JobpoolError):
    """No connection is ready for the job: the database was unreachable when one was due."""


class SlotConnections:
    """`count` connections taken out of a pool, lent to one job at a time each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.idle: list[AsyncConnection[Any]] = []
        self.lent = 0
        self.pool: AsyncConnectionPool[Any] | None = None
        self.settling: set[asyncio.Task[None]] = set()
        """Resets of idle connections under way (`_settle`)."""

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
                await self._return(conn, previous)
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

    def take(self) -> tuple[AsyncConnection[Any], AsyncConnectionPool[Any]]:
        """A connection for one job, and the pool it belongs to; never waits.

        Raises NoSlotConnectionError when none is ready (only after the database was unreachable;
        the next reconnect tops the list up).
        """
        if not self.idle or self.pool is None:
            raise NoSlotConnectionError("no database connection is ready for this job (the "
                                        "database was unreachable); it is retried")
        self.lent += 1
        return self.idle.pop(), self.pool

    async def give_back(self, conn: AsyncConnection[Any], pool: AsyncConnectionPool[Any]) -> None:
        """Keep `conn` for the next job if it is fit; else return it to `pool` and take a
        fresh one (left to the next hand-back or reconnect when the pool cannot give one
        within `REPLACE_TIMEOUT`)."""
        self.lent -= 1
        if (pool is self.pool and not conn.closed
                and conn.info.transaction_status == TransactionStatus.IDLE):
            self.idle.append(conn)
            if reset_due(conn):
                cast(Any, conn).idle_since = time.monotonic()
                asyncio.get_running_loop().call_later(IDLE_RESET_AFTER, self._settle_if_idle,
                                                      conn)
            return
        await self._return(conn, pool)  # the pool closes or replaces it
        try:
            await self._top_up(REPLACE_TIMEOUT)
        except (psycopg.OperationalError, PoolClosed) as exc:
            log.warning("no connection to replace a job's closed one yet (%s)", exc)

    def _settle_if_idle(self, conn: AsyncConnection[Any]) -> None:
        """Reset `conn` on its own if it is still unused and its reset still due (a job that
        took it meanwhile sent the reset with its BEGIN, or is about to)."""
        since = getattr(conn, "idle_since", 0.0)
        if (conn in self.idle and reset_due(conn)
                and time.monotonic() - since >= IDLE_RESET_AFTER * 0.9):
            task = asyncio.create_task(self._settle(conn), name="settle-session")
            self.settling.add(task)
            task.add_done_callback(self.settling.discard)

    async def _settle(self, conn: AsyncConnection[Any]) -> None:
        try:
            await conn.settle_reset()  # type: ignore[attr-defined]
        except psycopg.Error as exc:
            log.warning("resetting an idle job connection failed (%s); replacing it", exc)
            await conn.close()
            if conn in self.idle and self.pool is not None:
                self.idle.remove(conn)
                await self.pool.putconn(conn)
                try:
                    await self._top_up(REPLACE_TIMEOUT)
                except (psycopg.OperationalError, PoolClosed, PoolTimeout) as top_up:
                    log.warning("no connection to replace it yet (%s)", top_up)

    @staticmethod
    async def _return(conn: AsyncConnection[Any], pool: AsyncConnectionPool[Any]) -> None:
        """Give `conn` back to `pool`; closed first if its last job left its session reset to
        the next (the pool's other users, the worker's own queries, must not inherit it). It
        goes back at shutdown or to a pool retired after an outage, so no reset is sent,
        which could wait on a server that no longer answers."""
        if reset_due(conn):
            await conn.close()
        await pool.putconn(conn)

    async def close(self) -> None:
        """Return the idle connections to their pool (before the pool closes)."""
        if self.settling:
            await asyncio.gather(*self.settling, return_exceptions=True)
        idle, self.idle = self.idle, []
        if self.pool is not None:
            for conn in idle:
                await self._return(conn, self.pool)
