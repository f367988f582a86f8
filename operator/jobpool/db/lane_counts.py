"""Job counts per lane for the scaler: `count_lane_jobs` (scaling.sql), capped per lane.

Each lane's ready and running jobs are counted up to the lane's cap (`lane_count_cap`), the
count beyond which its scaling decision no longer changes, so a tick reads a bounded number
of index entries whatever the backlog; a capped count is reported as "at least".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg

from jobpool.core.poolspec import Lane
from jobpool.core.scaling import LaneJobs, lane_count_cap
from jobpool.db.failures import closed_meanwhile, open_or_none
from jobpool.db.queries import Many, One, Row
from jobpool.errors import JobpoolError

T = TypeVar("T")

COUNT_LANE_JOBS = Many("count_lane_jobs")
COUNT_TRANSACTION = One("count_transaction")
SCHEDULE_RUNS = Many("schedule_runs")
RETIRE_POOL_SCHEDULES = Many("retire_pool_schedules")

CONNECT_TIMEOUT = 10
"""Seconds to wait for the database before a scaling round gives up."""

STATEMENT_TIMEOUT_MS = 5000
"""Milliseconds a count may run before the database cancels it (the tick reports the error
and the next tick counts again)."""

ANSWER_TIMEOUT = STATEMENT_TIMEOUT_MS / 1000 + 5
"""Seconds the operator waits for a count's answer: the statement timeout cancels a slow
count on the server, but a connection that went silent (a network partition, a stopped
server) never answers, and the one loop that syncs every pool would wait for it for good."""

IDLE_DROP = 600.0
"""Seconds after which the connection of a DSN no count used is closed (a pool deleted, its
Secret changed), unless the counter is told a longer `idle_drop` (three scale intervals)."""



class SilentDatabaseError(psycopg.OperationalError, JobpoolError):
    """The database did not answer a count within `ANSWER_TIMEOUT` seconds (a lost
    connection for psycopg's sake, but not one a new connection would mend at once)."""


def cap_of(lane: Lane) -> int:
    """The most jobs worth counting for `lane` (see `lane_count_cap`)."""
    return lane_count_cap(lane.max_replicas, lane.workers_per_pod,
                          lane.autoscaling.target_utilization)


def lanes_parameter(lanes: Sequence[Lane]) -> str:
    """The `lanes` JSON parameter of `count_lane_jobs`: name, kinds, exclude_kinds, tenants,
    cap."""
    return json.dumps(
        [
            {
                "name": lane.name,
                "kinds": None if lane.kinds is None else list(lane.kinds),
                "exclude_kinds": list(lane.exclude_kinds),
                "tenants": list(lane.tenants),
                "cap": cap_of(lane),
            }
            for lane in lanes
        ]
    )


async def count_lane_jobs(
    conn: psycopg.AsyncConnection[Any], lanes: Sequence[Lane]
) -> dict[str, LaneJobs]:
    """Ready and running jobs per lane name, counted by the database at its `now()`, each up
    to the lane's cap (`LaneJobs.capped` tells when the ready count stopped there).

    Every lane gets an entry (zeros when it has no jobs). A lane naming a tenant that does
    not exist counts nothing for it.
    """
    if not lanes:
        return {}
    rows = await COUNT_LANE_JOBS(conn, {"lanes": lanes_parameter(lanes)})
    counts = {lane.name: LaneJobs() for lane in lanes}
    for row in rows:
        name, ready, running, cap = _row(row)
        counts[name] = LaneJobs(ready=ready, running=running, capped=ready >= cap)
    return counts


class LaneCounter:
    """The operator's database work, one pooled connection per database DSN:
    `count_lane_jobs`, its pools' schedule runs, and the retirement of a deleted pool's
    schedules (`jobpool.k8s.retirement`).

    Each tick reuses the connection its DSN last used (a new connection per tick costs the
    database a backend start); one broken by an error is dropped and made again next tick,
    and one found closed while it idled (a server restart, an `idle_session_timeout`, a
    pooler's idle timeout) is made again at once for the same count. Every count is a
    transaction with `count_transaction`'s settings (a statement timeout, no JIT).
    """

    def __init__(self) -> None:
        self.connections: dict[str, psycopg.AsyncConnection[Any]] = {}
        self.idle_drop = IDLE_DROP
        """Seconds after which the connection of a DSN no count used is closed."""
        self._used: dict[str, float] = {}

    async def __call__(self, dsn: str, lanes: Sequence[Lane]) -> dict[str, LaneJobs]:
        """Counts of `lanes` in the database of `dsn` (see `count_lane_jobs`). Raises the
        psycopg.Error of the count, or SilentDatabaseError (a psycopg.OperationalError) when
        the database did not answer within `ANSWER_TIMEOUT` seconds."""
        return await self._answer(dsn, lambda conn: count_lane_jobs(conn, lanes))

    async def schedule_runs(self, dsn: str, owner: str,
                            names: Sequence[str]) -> list[dict[str, Any]]:
        """The `schedule_runs` rows of the schedules `names` at `dsn`: each one's owner, and
        the last and next run of those `owner` owns (None for another owner's). Raises as
        a count does."""
        return await self._answer(
            dsn, lambda conn: SCHEDULE_RUNS(conn, {"owner": owner, "names": list(names)}))

    async def retire_pool_schedules(self, dsn: str, owner: str, actor: str) -> list[str]:
        """Delete every schedule `owner` declared at `dsn` (a pool deleted for good), audited
        with `actor`; the names retired, sorted. Raises as a count does."""
        rows = await self._answer(
            dsn, lambda conn: RETIRE_POOL_SCHEDULES(conn, {"owner": owner, "actor": actor}))
        return [str(row["name"]) for row in rows]

    async def _answer(self, dsn: str,
                      ask: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """`ask` on the connection of `dsn`, which is dropped when it fails or goes silent.

        A silent connection is closed under the waiting query before that is cancelled:
        psycopg would otherwise send the server a cancel request and wait for it (10 s more,
        through the same silent network)."""
        kept = open_or_none(self.connections.get(dsn))
        try:
            return await self._ask(await self._connection(dsn), dsn, ask)
        except SilentDatabaseError:
            raise  # a new connection would meet the same silence
        except psycopg.Error as exc:
            if not closed_meanwhile(kept, exc):
                raise
        return await self._ask(await self._connection(dsn), dsn, ask)

    async def _ask(self, conn: psycopg.AsyncConnection[Any], dsn: str,
                   ask: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """`ask` on `conn`, the connection of `dsn` (see `_answer`)."""
        asking = asyncio.ensure_future(_in_count_transaction(conn, ask))
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT):  # not wait_for: see `event_loop`
                return await asyncio.shield(asking)
        except TimeoutError:
            self._forget(dsn)
            conn.pgconn.finish()
            asking.cancel()
            await asyncio.wait({asking}, timeout=1.0)
            raise SilentDatabaseError(
                f"the database did not answer within {ANSWER_TIMEOUT:g}s") from None
        except psycopg.Error:
            await self._drop(dsn)
            raise
        except BaseException:
            asking.cancel()
            raise

    async def _connection(self, dsn: str) -> psycopg.AsyncConnection[Any]:
        now = time.monotonic()
        for idle in [other for other, used in self._used.items()
                     if other != dsn and now - used > self.idle_drop]:
            await self._drop(idle)
        self._used[dsn] = now
        conn = self.connections.get(dsn)
        if conn is None or conn.closed:
            conn = self.connections[dsn] = await _connect(dsn)
        return conn

    async def _drop(self, dsn: str) -> None:
        conn = self._forget(dsn)
        if conn is not None and not conn.closed:
            await conn.close()

    def _forget(self, dsn: str) -> psycopg.AsyncConnection[Any] | None:
        """Stop keeping the connection of `dsn`; it, if there was one."""
        self._used.pop(dsn, None)
        return self.connections.pop(dsn, None)

    async def close(self) -> None:
        """Close every connection."""
        for dsn in list(self.connections):
            await self._drop(dsn)


async def count_lane_jobs_at(dsn: str, lanes: Sequence[Lane]) -> dict[str, LaneJobs]:
    """`count_lane_jobs` on a short-lived connection to `dsn` (tools and tests; the operator
    keeps its connections in a `LaneCounter`)."""
    async with await _connect(dsn) as conn:
        return await _in_count_transaction(conn, lambda c: count_lane_jobs(c, lanes))


async def _connect(dsn: str) -> psycopg.AsyncConnection[Any]:
    """A counting connection to `dsn`: autocommit, transactions at READ COMMITTED whatever
    the role's default, nothing prepared on the server (a count every scale interval gains
    nothing from a prepared plan, and a pooler in transaction mode would run it on a server
    connection without it), no startup options (a pooler refuses them)."""
    conn = await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name="jobpool-operator",
        prepare_threshold=None)
    await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)  # stated in the BEGIN
    return conn


async def _in_count_transaction(
    conn: psycopg.AsyncConnection[Any],
    ask: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
) -> T:
    """`ask` on `conn` in a transaction with `count_transaction`'s settings."""
    async with conn.transaction():
        await COUNT_TRANSACTION(conn, {"timeout_ms": STATEMENT_TIMEOUT_MS})
        return await ask(conn)


def _row(row: Row) -> tuple[str, int, int, int]:
    return str(row["lane"]), int(row["ready"]), int(row["running"]), int(row["cap"])
