"""The registry of live workers (`mdm.aa_worker`, `sql/live_workers.sql`).

Every worker process registers a row (host, pid, pool, lane, kinds, tenants, slots) and renews
its heartbeat every `HEARTBEAT_EVERY` seconds (from its lease thread, outside its event loop)
with its busy slots, its last claim and its claims and completions of the last minute: one
small UPDATE per beat, never one per job. A
row whose heartbeat is older than `DEAD_AFTER` seconds belongs to a dead worker: readers
ignore it and whoever notices deletes it (a worker at its start and once a minute); a worker
that exits cleanly deletes its own row. Whatever needs to know which workers live reads
`live_workers` here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, Connection

from jobpool.db.queries import Exec, Many, One, Row

BEAT_WORKER = One("beat_worker")
FORGET_DEAD_WORKERS = Many("forget_dead_workers")
FORGET_WORKER = Exec("forget_worker")
LIVE_WORKERS = Many("live_workers")
REGISTER_WORKER = Exec("register_worker")
RUNNING_JOBS = Many("running_jobs")

HEARTBEAT_EVERY = 5.0
"""Seconds between a worker's heartbeats."""

DEAD_AFTER = 30.0
"""Seconds without a heartbeat after which a worker counts as dead (six missed beats: a busy
database or a short network fault does not make a live worker vanish)."""

MAX_RUNNING_SHOWN = 200
"""Running jobs the overview lists, longest-running first (a pool's slots, in practice)."""


@dataclass(frozen=True)
class WorkerIdentity:
    """What a worker registers once: who it is and what it serves."""

    worker_id: str
    host: str
    pid: int
    pool: str | None
    lane: str | None
    kinds: tuple[str, ...]
    tenants: tuple[str, ...]
    """Tenant keys or ids as configured; (): every tenant."""
    slots: int


@dataclass(frozen=True)
class WorkerBeat:
    """What a heartbeat carries: the worker's state now."""

    busy_slots: int
    last_claim_at: datetime | None
    """The database's time of the worker's last claim (None: none yet)."""
    claims_last_minute: int
    completions_last_minute: int
    """Jobs the worker marked done in the last minute."""


def _params(identity: WorkerIdentity, beat: WorkerBeat) -> dict[str, Any]:
    params = {**asdict(identity), **asdict(beat)}
    params["kinds"], params["tenants"] = list(identity.kinds), list(identity.tenants)
    return params


# The writes below run on the worker's lease connection, in its lease thread (synchronous
# psycopg): a handler that blocks the event loop does not stop the heartbeat.

def register_worker(conn: Connection[Any], identity: WorkerIdentity, beat: WorkerBeat) -> None:
    """Add the worker's row (or renew it, if it exists)."""
    REGISTER_WORKER.sync(conn, _params(identity, beat))


def beat_worker(conn: Connection[Any], identity: WorkerIdentity, beat: WorkerBeat) -> bool:
    """Renew the worker's heartbeat; False when its row is gone (deleted as dead while the
    worker could not beat: register again)."""
    return BEAT_WORKER.sync(conn, {
        "worker_id": identity.worker_id, **asdict(beat)}) is not None


def forget_worker(conn: Connection[Any], worker_id: str) -> None:
    """Delete the worker's row (a clean exit)."""
    FORGET_WORKER.sync(conn, {"worker_id": worker_id})


def forget_dead_workers(conn: Connection[Any], *, dead_after: float = DEAD_AFTER) -> list[str]:
    """Delete the rows of workers silent for more than `dead_after` seconds; their ids."""
    rows = FORGET_DEAD_WORKERS.sync(conn, {"dead_after": dead_after})
    return [row["worker_id"] for row in rows]


async def live_workers(conn: AsyncConnection[Any], *,
                       dead_after: float = DEAD_AFTER) -> list[Row]:
    """The rows of the workers that beat within `dead_after` seconds (by lane, host, pid)."""
    return await LIVE_WORKERS(conn, {"dead_after": dead_after})


async def running_jobs(conn: AsyncConnection[Any], *, tenants: Sequence[str] | None,
                       limit: int = MAX_RUNNING_SHOWN,
                       dead_after: float = DEAD_AFTER) -> list[Row]:
    """Running jobs of `tenants` (keys; None: all), longest-running first, at most `limit`:
    id, tenant, kind, holder, claimed_at, age_seconds, the holder's lane and `holder_live`
    (False: its holder no longer beats)."""
    return await RUNNING_JOBS(conn, {
        "tenants": None if tenants is None else list(tenants), "limit": limit,
        "dead_after": dead_after})

