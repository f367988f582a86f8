"""The worker's link to its database: whether it answers now, and the pool it answers on.

`DatabaseLink` is the one place that says the database is online or not (`online`,
`problem`): whoever sees a connection fail calls `lost`; claiming pauses, and a background
task probes with a fresh connection until the database answers (`jobpool.db.reconnect`:
every 0.1 s growing to 1 s), renews the pool through its `Connector`, lets the worker settle
what the outage left (`arrive`) and goes online again. `write` carries a compare-and-set
outcome write through such an outage. The link knows no SQL: `PoolConnector` reaches
PostgreSQL, a fake of the `Connector` protocol stands in for it in unit tests.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed

from jobpool.core.retry import retry_pause
from jobpool.db.connect import open_live_pool, probe
from jobpool.db.failures import lost_connection, transaction_conflict
from jobpool.db.reconnect import PROBE_TIMEOUT, RECONNECT_FIRST, RECONNECT_MAX, until_answered
from jobpool.db.store import QueueStore
from jobpool.errors import ConnectionBudgetError, JobpoolError
from jobpool.worker.background import BackgroundTasks
from jobpool.worker.slot_connections import SlotConnections

log = logging.getLogger("jobpool.worker")

S = TypeVar("S")
T = TypeVar("T")

BUDGET_RETRY = 5.0
"""Seconds between checks of the connection budget while it leaves no slot (after the start:
at the start the worker refuses instead)."""


class Connector(Protocol[S]):
    """How a `DatabaseLink` reaches its database (`PoolConnector` for PostgreSQL)."""

    async def probe(self) -> None:
        """Check on a fresh connection that the database answers and is migrated; raises
        psycopg.OperationalError or SchemaNotMigratedError."""
        ...

    async def fit(self) -> None:
        """Fit the worker to the connections the database allows, before a new pool opens;
        raises ConnectionBudgetError when not one slot fits, psycopg.OperationalError."""
        ...

    async def attach(self, store: S | None, *, replace: bool) -> S:
        """The store on live connections: a new one on a new pool when `store` is None, on a
        new pool when `replace`, else `store` with its dead pooled connections dropped.
        Raises psycopg.OperationalError."""
        ...


class DatabaseLink(Generic[S]):
    """Online state, reconnects and pool renewal of one worker.

    `online` is set and cleared here alone, and `problem` (what /readyz reports) written
    here alone; others wait on `online` and report failures through `lost` or
    `replace_connections`. `arrive(store, first)` runs each time the database answers again
    (`first`: the first time, the worker's start-up), under the link's reconnect task;
    `refused` is called when the connection budget leaves no slot at the first start, and,
    for a `one_off` worker (a drain, which nobody restarts), when the database answers its
    first start with an error other than a lost connection (a read-only database, a
    `statement_timeout` too short for its statements, a missing privilege): a long-running
    worker waits for that to be mended, a one-off drain would wait without end.
    """

    def __init__(
        self, connector: Connector[S], *, arrive: Callable[[S, bool], Awaitable[None]],
        background: BackgroundTasks, wake: asyncio.Event, refused: Callable[[], None],
        rng: random.Random, one_off: bool = False,
    ) -> None:
        self.connector = connector
        self.arrive = arrive
        self.background = background
        self.wake = wake
        self.refused = refused
        self.rng = rng
        self.online = asyncio.Event()
        self.problem: str | None = "waiting for the database"
        self.store: S | None = None
        """The store, from the first time the database answered on."""
        self.started = False
        """Whether the first arrival (the worker's start-up) completed."""
        self.arrival_refused = False
        """Whether the last arrival failed on a statement the database refused (a read-only
        default, a missing GRANT): the next one takes a fresh pool, whose sessions start with
        the role's settings of then (its pooled sessions keep those they began with)."""
        self.one_off = one_off
        self.refusal: JobpoolError | None = None
        """Why the worker refused to start (its connection budget leaves no slot, or, one
        off, the database refused its start: StartRefusedError)."""

    def start(self) -> None:
        """Begin reaching the database (in the background)."""
        self.background.start("reconnect", self.reconnect)

    def lost(self, exc: psycopg.Error) -> None:
        """A statement failed with `exc`. If the connection failed: go offline (claiming
        pauses), reconnect in the background. Else log it (the caller retries or gives up).

        A pool retired by the reconnect (PoolClosed) needs nothing: retry on the new one.
        """
        if isinstance(exc, PoolClosed):
            return
        if not lost_connection(exc):
            log.warning("database error: %s", exc)
            return
        if self.online.is_set():
            log.warning("database connection lost (%s); claiming paused until it answers", exc)
        self.online.clear()
        self.problem = f"database unreachable: {exc}"
        self.background.start("reconnect", self.reconnect)

    def replace_connections(self, problem: str, *, pause: float) -> None:
        """Go offline for `problem` (a live connection misbehaved) and, after `pause`
        seconds, reconnect on a fresh pool."""
        self.problem = problem
        self.online.clear()
        self.background.start("reconnect", lambda: self.reconnect(replace=True, pause=pause))

    def pause_after(self, failures: int) -> float:
        """Seconds to wait after `failures` failures in a row (RECONNECT_FIRST growing to
        RECONNECT_MAX, jittered)."""
        return retry_pause(failures, first=RECONNECT_FIRST, cap=RECONNECT_MAX, rng=self.rng)

    async def write(self, write: Callable[[], Awaitable[T]]) -> T:
        """Run `write` (a compare-and-set outcome write) until it goes through: when the
        connection fails, again once the database answers; after a conflict (serialization
        failure, deadlock) again after a pause. Other errors are raised."""
        failures = 0
        while True:
            try:
                return await write()
            except psycopg.OperationalError as exc:
                failures += 1
                if transaction_conflict(exc):
                    await asyncio.sleep(self.pause_after(failures))
                    continue
                if not lost_connection(exc):
                    raise
                self.lost(exc)
                await self.online.wait()
                if failures > 1:  # not a dead pooled connection: do not hammer
                    await asyncio.sleep(self.pause_after(failures - 1))

    async def reconnect(self, *, replace: bool = False, pause: float = 0.0) -> None:
        """Probe until the database answers, renew the pool, let the worker arrive, go online.

        `replace`: a fresh pool even if the first probe answers; `pause`: seconds to wait first.
        """
        await asyncio.sleep(pause)
        failures = 0
        while True:
            try:
                await until_answered(lambda failed: self._arrive(replace, failed), rng=self.rng,
                                     log=log, report=self._away, failures=failures)
                break
            except StartRefusedError as exc:
                self.problem = str(exc)
                log.error("refusing to start: %s", exc)
                self.refusal = exc
                self.refused()
                return
            except ConnectionBudgetError as exc:
                self.problem = f"connection budget: {exc}"
                if not self.started:
                    log.error("refusing to start: %s", exc)
                    self.refusal = exc
                    self.refused()
                    return
                failures += 1
                log.error("%s; checking again in %gs", self.problem, BUDGET_RETRY)
                await asyncio.sleep(BUDGET_RETRY)
        self.problem = None
        self.online.set()
        self.wake.set()

    def _away(self, reason: str) -> None:
        self.problem = reason

    async def _arrive(self, replace: bool, failures: int) -> None:
        """One try: probe, fit the budget (first time, or after failures), attach the store
        (a new pool after failures), let the worker arrive."""
        try:
            await self.connector.probe()
            if self.store is None or failures > 0:
                await self.connector.fit()
            self.store = await self.connector.attach(
                self.store, replace=replace or failures > 0 or self.arrival_refused)
            await self.arrive(self.store, not self.started)
        except psycopg.Error as exc:
            self.arrival_refused = True
            self._refuse_one_off_start(exc)
            raise
        self.arrival_refused = False
        self.started = True

    async def probe_first(self) -> None:
        """A one-off drain's probe before it waits for anything. Raises the probe's error
        (psycopg.OperationalError: unreachable; SchemaNotMigratedError), or StartRefusedError
        for a statement the database refused (a statement timeout the probe cannot meet)."""
        try:
            await self.connector.probe()
        except psycopg.Error as exc:
            self._refuse_one_off_start(exc)
            raise

    def _refuse_one_off_start(self, exc: psycopg.Error) -> None:
        """Raise StartRefusedError from `exc` when it answered a one-off drain's start with an
        error no wait mends by itself (a read-only role, a statement timeout it cannot meet);
        a lost connection is waited for (or, at the first probe, raised as it is)."""
        if self.one_off and not self.started and not lost_connection(exc):
            raise StartRefusedError(
                f"the database refused the start of this one-off drain "
                f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]})") from exc


class StartRefusedError(JobpoolError):
    """The database answered a one-off worker's start with an error no retry mends by
    itself (see `DatabaseLink`)."""


class PoolConnector:
    """A `Connector` to PostgreSQL: fresh-connection probes, a pool of `size()` connections
    named `name`, the slot connections filled from it, the store `make_store(pool)` makes
    (a `QueueStore`) on the first pool, its pool replaced after an outage. `direct_dsn`:
    straight to PostgreSQL past a transaction pooler, for handlers' session connections
    (`JobConnection.direct_dsn`)."""

    def __init__(
        self, dsn: str, *, name: str, size: Callable[[], int], transaction_pooler: bool,
        direct_dsn: str | None,
        slot_connections: SlotConnections, fit: Callable[[], Awaitable[None]],
        make_store: Callable[[AsyncConnectionPool[Any]], QueueStore],
    ) -> None:
        self.dsn = dsn
        self.name = name
        self.size = size
        self.transaction_pooler = transaction_pooler
        self.direct_dsn = direct_dsn
        self.slot_connections = slot_connections
        self._fit = fit
        self.make_store = make_store

    async def probe(self) -> None:
        await probe(self.dsn, timeout=PROBE_TIMEOUT, for_worker=True)

    async def fit(self) -> None:
        await self._fit()

    async def attach(self, store: QueueStore | None, *, replace: bool) -> QueueStore:
        """A fresh pool after an outage (its pooled connections are dead, and the pool would
        replace them only with its own backoff, up to minutes); else drop the dead ones."""
        if store is not None and not replace:
            await self.slot_connections.fill(store.pool, timeout=PROBE_TIMEOUT)  # checks them
            return store
        pool = await open_live_pool(self.dsn, size=self.size(), name=self.name,
                                    timeout=PROBE_TIMEOUT,
                                    transaction_pooler=self.transaction_pooler,
                                    direct_dsn=self.direct_dsn)
        if store is None:
            try:
                await self.slot_connections.fill(pool, timeout=PROBE_TIMEOUT)
            except BaseException:
                await pool.close()  # the next try opens a fresh one
                raise
            return self.make_store(pool)
        retired = await store.replace_pool(pool)
        await self.slot_connections.fill(pool, timeout=PROBE_TIMEOUT)
        await retired.close()  # waiting clients get PoolClosed; used connections close on return
        return store
