"""The admin API's link to its database: it waits for the database, as a worker does.

`jobpool api` serves from its start, whether the database answers or not: while it does not
(down, refusing, not migrated yet) every /v1 call is a 503 naming the reason, `/readyz` says
why it is not ready and `/healthz` stays 200 (a restart would not bring the database back).
A background task probes with a fresh connection (`jobpool.db.reconnect`: every 0.1 s
growing to 1 s, logging every 30 s) and opens the pool once the database answers. A
connection lost later starts the same probe; the pool is then replaced, because its dead
connections would be found one request at a time and replaced only with the pool's own
backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from jobpool.db.connect import open_live_pool, probe
from jobpool.db.failures import broken_as_lost, lost_connection
from jobpool.db.queries import One
from jobpool.db.reconnect import PROBE_TIMEOUT, until_answered
from jobpool.errors import JobpoolError

PING = One("ping")

log = logging.getLogger("jobpool.api")

READY_CHECK_TIMEOUT = 5.0
"""Seconds /readyz's check of a pooled connection may take."""


class DatabaseAwayError(JobpoolError):
    """The API's database does not answer (or is not migrated) now: a 503 naming why."""


class DatabaseLink:
    """The pool of the API's connections to `dsn`, and why there is none while there is none.

    `start()` begins probing; `connection()` lends a pooled connection or raises DatabaseAwayError
    at once (never waits for a database that is away); `close()` ends it all.
    `transaction_pooler`: `dsn` leads to a pooler in transaction mode (the API's own `pooler`
    setting): its connections prepare nothing on the server.
    """

    def __init__(self, dsn: str, *, size: int, name: str, transaction_pooler: bool = False,
                 rng: random.Random | None = None) -> None:
        self.dsn = dsn
        self.size = size
        self.name = name
        self.transaction_pooler = transaction_pooler
        self.rng = rng or random.Random()
        self.pool: AsyncConnectionPool[Any] | None = None
        self.problem: str | None = "waiting for the database"
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def serving(cls, pool: AsyncConnectionPool[Any]) -> DatabaseLink:
        """A link that serves from `pool` (opened by the caller, who closes it) at once, and
        replaces it with pools of the same settings after a lost connection."""
        if not isinstance(pool.conninfo, str):
            raise TypeError("the API's pool must be made from a connection string")
        kwargs = pool.kwargs if isinstance(pool.kwargs, dict) else {}
        link = cls(pool.conninfo, size=pool.max_size, name=pool.name,
                   transaction_pooler=kwargs.get("prepare_threshold", 5) is None)
        link.pool, link.problem = pool, None
        return link

    def start(self) -> None:
        """Probe in the background until the database answers, then open the pool."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._connect(),
                                                                name="api-database")

    def not_ready(self) -> list[str]:
        """Why the API cannot serve now, one sentence each; [] when it can."""
        return [self.problem] if self.problem else []

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection (dict rows). Raises DatabaseAwayError while the database is away;
        a connection that fails on the way (psycopg.OperationalError, raised) starts the
        probe again."""
        if self.problem is not None or self.pool is None:
            raise DatabaseAwayError(self.problem or "waiting for the database")
        try:
            async with self.pool.connection() as conn:
                with broken_as_lost(conn):
                    yield conn
        except psycopg.OperationalError as exc:
            if lost_connection(exc):
                self.lost(exc)
            raise
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            self.lost(exc)  # the pool's sessions began read-only: new ones may not be
            raise

    async def check(self) -> list[str]:
        """`not_ready()`, after one round trip on a pooled connection when it looks ready (a
        database gone while nobody called is found here, by /readyz)."""
        if self.problem is None:
            # a pool busy with other calls is not an outage: only a failed connection counts
            with contextlib.suppress(psycopg.OperationalError, TimeoutError):
                async with asyncio.timeout(READY_CHECK_TIMEOUT), self.connection() as conn:
                    await PING(conn)
        return self.not_ready()

    def _away(self, reason: str) -> None:
        self.problem = reason

    async def _open_pool(self, _failures: int) -> AsyncConnectionPool[Any]:
        await probe(self.dsn, timeout=PROBE_TIMEOUT)
        return await open_live_pool(self.dsn, size=self.size, name=self.name,
                                    timeout=PROBE_TIMEOUT,
                                    transaction_pooler=self.transaction_pooler)

    def lost(self, exc: BaseException) -> None:
        """A connection failed with `exc` (or the database refused a write: read-only): refuse
        calls and probe until the database answers, then serve from a new pool."""
        if self.problem is None:
            what = ("database refuses writes" if isinstance(
                exc, psycopg.errors.ReadOnlySqlTransaction) else "database unreachable")
            log.warning("%s (%s); answering 503 until a new pool answers", what, exc)
            self.problem = f"{what}: {exc}"
        self.start()

    async def close(self) -> None:
        """Stop probing and close the pool."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.pool is not None:
            await self.pool.close()
            self.pool = None

    async def _connect(self) -> None:
        """Probe until the database answers and is migrated, then open a fresh pool."""
        pool = await until_answered(self._open_pool, rng=self.rng, log=log, report=self._away)
        retired, self.pool = self.pool, pool
        self.problem = None
        if retired is not None:
            await retired.close()  # connections in use close when they come back
