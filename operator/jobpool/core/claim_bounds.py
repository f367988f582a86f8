"""Where a worker's claims start while a snapshot held open makes the full claim slow.

The claim finds the head of each (kind, tenant) pair in the pending-jobs index
(ix_aa_job_lane). A claimed job leaves that index only when no snapshot can see it pending any
more: while a session holds a snapshot open (a long transaction, `pg_dump`, a standby's
`hot_standby_feedback`), the entries of every job claimed since are kept and cannot even be
marked dead, so each claim steps over all of them, a heap visit each, before it finds a
pending job. At 3,000 jobs/s that is 180,000 more entries a minute, and the worker's rate
falls to a fraction of what it was.

So while full claims take `SLOW_CLAIM` seconds or more (and `SLOW_PAIR` per pair they read:
not a claim that is long because it reads many pairs), the worker claims *bounded*: only
from the pairs it claimed from since its last full claim, each starting past the last job it
took there (its bound: the job's priority, available_at and id, the index's order). Every job
before a bound was claimed, or locked by another worker's claim, when the bound was set.
A full claim still runs every `FULL_CLAIM_EVERY` seconds, or less often when it is slower
(it takes at most `FULL_CLAIM_SHARE` of the time); it finds what bounded claims pass over:
pairs this worker has not claimed from, and jobs that became ready behind a bound (enqueued by
a transaction that began before the bound's job was enqueued, of a more urgent priority, a
delayed job of a more urgent priority that came due, or handed back by another worker's
aborted claim). Those wait up to one full-claim interval longer, and tenants that were not
served in the last full claim wait for the next one to take their turn: while claims are
fast none of this applies, each claim is a full one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

SLOW_CLAIM = 0.01
"""Seconds a full claim statement may take on the server (to its rows: without the COMMIT or
the network) before it counts as slow: a claim of a few dozen jobs takes about a millisecond
there, one over a thousand tenants' heads a few; ten means it walks entries it cannot skip."""

SLOW_PAIR = 0.0001
"""Seconds per pair read a slow full claim takes at least: a descent to a pair's head takes a
few microseconds, so a claim over ten thousand pairs may take 30 ms and read nothing it could
skip (bounded claims would only hold the other tenants' turns back); a hundred means the
heads it found lay behind hundreds of entries each."""

SLOW_STREAK = 2
"""Slow full claims in a row before the next claims are bounded: the first claim on a new
connection also plans the statement, and a single slow one may be the machine's load."""

FULL_CLAIM_EVERY = 1.0
"""Seconds between full claims at most while claims are bounded: how much longer a job behind
a bound, or of a pair not claimed from, may wait."""

FULL_CLAIM_SHARE = 0.1
"""The share of the time full claims may take while they are slow: one that took 0.5 s is
followed by bounded claims for 5 s."""

Pair = tuple[str, UUID]
"""(job_kind, tenant_id)."""

Bound = tuple[int, datetime, int]
"""(priority, available_at, id) of the last job claimed from a pair, in the index's order."""


class ClaimBounds:
    """Whether the next claim is full or bounded, and the bounds of a bounded one.

    `next_bounds(now)` tells where the next claim starts; `claimed(rows, ...)` records what a
    claim took. `now` is a monotonic clock in seconds (`time.monotonic()`). A fresh instance claims
    full, and so does one whose last full claim that took jobs was fast.
    """

    def __init__(self) -> None:
        self._bounds: dict[Pair, Bound] = {}
        self._recent: set[Pair] = set()
        """Pairs claimed from since the last full claim: their bounds outlive the next one."""
        self._slow = 0
        """Slow full claims in a row."""
        self._bounded_until = 0.0

    def next_bounds(self, now: float) -> Mapping[Pair, Bound] | None:
        """The bounds the next claim starts at (`claim_pairs`), or None for a full claim."""
        return self._bounds if self._bounds and now < self._bounded_until else None

    def claimed(self, rows: Sequence[Mapping[str, Any]], *, full: bool,
                now: float) -> str | None:
        """Record a claim's rows (dicts with job_kind, tenant_id, priority, available_at, id,
        claim_time, the statement's time on the server as a timedelta, and pairs_read, the
        heads it found), whether it was `full`, and when it ended (`now`).

        A full claim that took jobs fast (under `SLOW_CLAIM`, or under `SLOW_PAIR` per pair
        read) ends bounded claiming: the next claim is full again.
        A slow one (the `SLOW_STREAK`th in a row, or while claims are bounded) sets the bounds
        of the pairs it took from (it started at their heads, so its last job is the bound,
        even below the one before) and keeps those of the pairs claimed from since the full
        claim before, so that a full claim that found nothing this once does not end bounded
        claiming; a pair not claimed from for a whole interval is dropped. A full claim that
        took nothing tells nothing of its speed. A bounded claim moves its pairs' bounds on.

        Returns what changed, for the worker's log: "bounded" when bounded claims begin,
        "full" when they end, else None.
        """
        if not full:
            for pair, bound in _last_per_pair(rows).items():
                self._bounds[pair] = max(bound, self._bounds.get(pair, bound))
                self._recent.add(pair)
            return None
        # any row's time will do: every row is written after the walk that found them all
        took = rows[0]["claim_time"].total_seconds() if rows else None
        if took is None and self._slow < SLOW_STREAK:
            return None
        if took is not None and (took < SLOW_CLAIM
                                 or took < SLOW_PAIR * rows[0]["pairs_read"]):
            ended = self._slow >= SLOW_STREAK
            if self._slow:
                self._bounds, self._recent, self._slow, self._bounded_until = {}, set(), 0, 0.0
            return "full" if ended else None
        self._slow += 1
        if self._slow < SLOW_STREAK:
            return None
        self._bounded_until = now + max(FULL_CLAIM_EVERY, (took or 0.0) / FULL_CLAIM_SHARE)
        taken = _last_per_pair(rows)
        self._bounds = {pair: bound for pair, bound in self._bounds.items()
                        if pair in self._recent} | taken
        self._recent = set(taken)
        return "bounded" if self._slow == SLOW_STREAK else None


def claim_pairs(kinds: Sequence[str], tenants: Sequence[UUID] | None,
                bounds: Mapping[Pair, Bound] | None = None) -> str | None:
    """The claim's %(pairs)s: the (kind, tenant) pairs it reads one by one and the position
    past which it reads each, as JSON text; None reads every tenant's pairs of `kinds`.

    For a worker of some `tenants`: every pair of `kinds` x `tenants`, past its bound where
    `bounds` has one, else from the start. For every tenant (`tenants` None): None, or the
    pairs of `bounds` when given (a bounded claim)."""
    if tenants is None:
        if bounds is None:
            return None
        positions: dict[Pair, Bound | None] = dict(bounds)
    else:
        known = bounds or {}
        positions = {(kind, tenant): known.get((kind, tenant))
                     for kind in dict.fromkeys(kinds) for tenant in dict.fromkeys(tenants)}
    return json.dumps([_pair(kind, tenant, bound) for (kind, tenant), bound in positions.items()])


def _pair(kind: str, tenant: UUID, bound: Bound | None) -> dict[str, Any]:
    """One element of %(pairs)s: past `bound`, or from the start (None: before every job,
    '-infinity' included)."""
    priority, available_at, job_id = bound or (-32768, None, 0)
    return {"job_kind": kind, "tenant_id": str(tenant), "priority": priority,
            "available_at": "-infinity" if available_at is None else available_at.isoformat(),
            "id": job_id}


def _last_per_pair(rows: Sequence[Mapping[str, Any]]) -> dict[Pair, Bound]:
    """The last row (in the index's order) of each pair among claimed `rows`."""
    last: dict[Pair, Bound] = {}
    for row in rows:
        pair = (row["job_kind"], row["tenant_id"])
        bound = (row["priority"], row["available_at"], row["id"])
        if pair not in last or bound > last[pair]:
            last[pair] = bound
    return last
