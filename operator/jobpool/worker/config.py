"""What one worker process serves and how it paces itself."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from jobpool.core.suggestions import did_you_mean
from jobpool.core.tenants import tenant_ref
from jobpool.settings import MIN_LEASE_TTL, POOLERS, Settings, default_of

log = logging.getLogger("jobpool.worker")

POLL_ONLY_INTERVAL = 0.5
"""Seconds between claims, at most, of a worker without a LISTEN connection (behind a
transaction pooler with no `listen_dsn`): a new job waits at most this long for a free slot
to claim it."""


def claim_lease(lease_ttl: float, stale_ttls: Iterable[float]) -> float:
    """Seconds each claim is leased for: `lease_ttl`, capped by the served kinds' stale TTLs
    (seconds), never below `MIN_LEASE_TTL`: the lease is renewed every third of it, and a
    kind may declare a stale TTL of a millisecond, which would lapse under a live worker
    between two renewals (its jobs then run twice, at once, and use up their attempts)."""
    return max(MIN_LEASE_TTL, min([lease_ttl, *stale_ttls]))


@dataclass(frozen=True)
class WorkerConfig:
    """One worker process.

    kinds: kinds to serve; None = every registered kind except `exclude_kinds`.
    tenants: tenant keys or ids to serve; () = all (ValueError for text that is neither).
    slots: jobs run at once (default 4).
    prefetch: the most claimed jobs a worker may hold beyond its free slots, not started
        yet, so that a freed slot starts the next job without waiting for a claim; it holds
        about what its slots start in 50 ms (core/prefetch.py), up to this (0: claim only into
        free slots).
    grace: seconds running jobs get to finish after SIGTERM before they are handed back.
    stop_grace: seconds a stopped job's handler gets to clean up after its cancellation
        (`jobpool jobs stop`, worker/stops.py) before the worker abandons it and frees its slot.
    poll_interval: seconds between claims when no NOTIFY arrives.
    lease_ttl: seconds a claim holds without renewal (renewed every third of that; capped at
        the shortest stale TTL of the kinds served): a dead worker's jobs run again about
        this long after it died.
    cleanup_every: seconds between runs of the periodic maintenance steps (done-job
        retention, outbox compaction; default 5 minutes).
    until_empty: exit once nothing runnable is left (and schedule no cleanup).
    completion_delay: seconds a batched `done` may wait for more to join it (it goes at once
        when half the slots or all running jobs wait on one).
    pooler: "none" or "transaction" (`jobpool.settings.POOLERS`): a transaction pooler gets
        no server-side prepared statements and no session settings.
    listen_dsn: where the LISTEN connection goes (None: the worker's DSN, or no LISTEN at
        all behind a transaction pooler: poll-only, `POLL_ONLY_INTERVAL`).
    """

    kinds: tuple[str, ...] | None = None
    exclude_kinds: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    slots: int = default_of("slots")
    prefetch: int = default_of("prefetch")
    grace: float = default_of("grace")
    stop_grace: float = default_of("stop_grace")
    poll_interval: float = default_of("poll_interval")
    lease_ttl: float = default_of("lease_ttl")
    cleanup_every: float = 300.0
    until_empty: bool = False
    completion_delay: float = 0.002
    pooler: str = default_of("pooler")
    listen_dsn: str | None = default_of("listen_dsn")

    @classmethod
    def from_settings(cls, settings: Settings, **serves: Any) -> WorkerConfig:
        """The worker `settings` describe: each field that is a setting (slots, prefetch, grace,
        poll_interval, lease_ttl, pooler, listen_dsn) from them, the others from `serves`
        (kinds, exclude_kinds, tenants, until_empty, ...). TypeError for a key of `serves`
        that is no field or is a setting (the settings say it)."""
        own = {item.name for item in fields(Settings)}
        taken = {item.name: getattr(settings, item.name) for item in fields(cls)
                 if item.name in own}
        clash = sorted(set(serves) & set(taken))
        if clash:
            raise TypeError(f"{', '.join(clash)} come from the settings, not as arguments")
        return cls(**taken, **serves)

    def __post_init__(self) -> None:
        for ref in self.tenants:
            tenant_ref(ref)  # ValueError naming it: no database query could ever find it
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0 jobs, got {self.prefetch}")
        if self.pooler not in POOLERS:
            raise ValueError(f"pooler must be one of {', '.join(POOLERS)}, got {self.pooler!r}")
        if self.completion_delay < 0:
            raise ValueError(f"completion_delay must be >= 0 seconds, got {self.completion_delay}")
        for name in ("grace", "stop_grace", "poll_interval", "lease_ttl", "cleanup_every"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


def make_worker_id() -> str:
    """`<host>/<pid>/<uuid>`: unique per process and readable in `claimed_by`."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4()}"


def resolve_kinds(
    registered: tuple[str, ...], kinds: tuple[str, ...] | None, exclude: tuple[str, ...]
) -> tuple[str, ...]:
    """The kinds a worker serves; raises ValueError naming a kind to serve that is not
    registered. A kind to exclude that is not registered is logged as a warning, not
    refused: a pool's catch-all lane excludes every other lane's kinds, and one of them
    missing from the image must not stop that lane too; a misspelt `--exclude-kinds` would
    serve the kind meant, so the warning names the likeliest one."""
    unknown = sorted(set(kinds or ()) - set(registered))
    if unknown:
        raise ValueError(f"unknown job kind(s) {_unknown_text(unknown, registered)}")
    excluded_unknown = sorted(set(exclude) - set(registered))
    if excluded_unknown:
        log.warning("unknown job kind(s) to exclude %s",
                    _unknown_text(excluded_unknown, registered))
    chosen = registered if kinds is None else kinds
    return tuple(k for k in chosen if k not in set(exclude))


def _unknown_text(unknown: list[str], registered: tuple[str, ...]) -> str:
    hint = did_you_mean(unknown[0], registered) if len(unknown) == 1 else ""
    return (f"{', '.join(unknown)}{hint}: registered kinds are {', '.join(registered)} "
            "(load more with --import MODULE)")
