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
from the pairs its last full claim took jobs from, each starting past the last job taken
there (its bound: the job's priority, available_at and id, the index's order). Every job
before a bound was claimed, or locked by another worker's claim, when the bound was set.
A full claim still runs after ten times its own time (`FULL_CLAIM_SHARE`); it finds what
bounded claims pass over: the other pairs, whose tenants take their turns there, and jobs
that became ready behind a bound (enqueued by a transaction that began before the bound's
job was enqueued, of a more urgent priority, taken back from a dead worker, handed back by
another). A full claim that does not take from a pair drops its bound, so a pair whose
tenant lost its turn is not served past older jobs of its own. While claims are fast none of
this applies: each claim is a full one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

SLOW_CLAIM = 0.01
"""Seconds a full claim may take on the server before it counts as slow, from its
transaction's start to the rows it writes (the batched `done`s before it and the claim; not
the COMMIT nor the network): a claim of a few dozen jobs takes about a millisecond there, one
over a thousand tenants' heads a few; ten means it walks entries it cannot skip."""

SLOW_PAIR = 0.0001
"""Seconds per pair read a slow full claim takes at least: a descent to a pair's head takes a
few microseconds, so a claim over ten thousand pairs may take 30 ms and read nothing it could
skip (bounded claims would only hold the other tenants' turns back); a hundred means the
heads it found lay behind hundreds of entries each."""

SLOW_STREAK = 3
"""Slow full claims in a row before the next claims are bounded: the first claim on a new
connection also plans the statement, and a claim now and then is slow for the machine's load
(its server process waiting for a core); while a snapshot is held every claim is slow."""

FULL_CLAIM_SHARE = 0.1
"""The share of the time full claims take while they are slow: one that took 50 ms is followed
by bounded claims for 0.5 s, one of `SLOW_CLAIM` by 0.1 s. That interval is how much longer a
job behind a bound, or a tenant the last full claim did not serve, waits for a full claim."""

Pair = tuple[str, UUID]
"""(job_kind, tenant_id)."""

Bound = tuple[int, datetime, int]
"""(priority, available_at, id) of the last job claimed from a pair, in the index's order."""

Change = Literal["bounded", "full"] | None
"""What a claim changed: bounded claims began, they ended, or nothing."""


class ClaimBounds:
    """Whether the next claim is full or bounded, and the bounds of a bounded one.

    `next_bounds(now)` tells where the next claim starts; `claimed(rows, ...)` records what a
    claim took. `now` is a monotonic clock in seconds (`time.monotonic()`). A fresh instance
    claims full, and so does one whose last full claim that took jobs was fast.
    """

    def __init__(self) -> None:
        self._bounds: dict[Pair, Bound] = {}
        self._slow = 0
        """Slow full claims in a row."""
        self._bounded_until = 0.0

    def next_bounds(self, now: float) -> Mapping[Pair, Bound] | None:
        """The bounds the next claim starts at (`claim_parameters`), or None for a full
        claim."""
        return self._bounds if self._bounds and now < self._bounded_until else None

    def claimed(self, rows: Sequence[Mapping[str, Any]], *, full: bool, pairs_read: int,
                now: float) -> Change:
        """Record a claim's rows (dicts with job_kind, tenant_id, priority, available_at, id,
        and took: the claim statement's seconds to them), whether it was `full`, how many
        (kind, tenant) pairs it read (`pairs_read`), and when it ended (`now`).

        A full claim that took jobs fast (under `SLOW_CLAIM`, or under `SLOW_PAIR` per pair
        read) ends bounded claiming: the next claim is full again. A slow one (the
        `SLOW_STREAK`th in a row, or any after) makes the pairs it took from the bounds, each
        at the last job it took there (it started at their heads: a job that lay behind the
        old bound is behind the new one no more), and drops the others: a pair whose tenant
        lost its turn in the full claim is not served past jobs of its own that wait behind its
        bound. A full claim that took nothing tells nothing of its speed, and found nothing
        behind any bound: while claims are bounded, they stay so. A bounded claim moves its
        pairs' bounds on.

        Returns what changed, for the worker's log: "bounded" when bounded claims begin,
        "full" when they end, else None.
        """
        if not full:
            for pair, bound in _last_per_pair(rows).items():
                self._bounds[pair] = max(bound, self._bounds.get(pair, bound))
            return None
        if not rows:
            if self._bounds:
                self._bounded_until = now + SLOW_CLAIM / FULL_CLAIM_SHARE
            return None
        # any row's time will do: every row is written after the walk that found them all
        took = rows[0]["took"]
        if took < SLOW_CLAIM or took < SLOW_PAIR * pairs_read:
            ended = self._slow >= SLOW_STREAK
            if self._slow:
                self._bounds, self._slow, self._bounded_until = {}, 0, 0.0
            return "full" if ended else None
        self._slow += 1
        if self._slow < SLOW_STREAK:
            return None
        self._bounded_until = now + took / FULL_CLAIM_SHARE
        self._bounds = _last_per_pair(rows)
        return "bounded" if self._slow == SLOW_STREAK else None


def pairs_read(kinds: Sequence[str], tenants: Sequence[UUID] | None, heads: int) -> int:
    """The (kind, tenant) pairs a full claim of `kinds` and `tenants` (a worker's: each named
    once) read: every pair of them for a worker of some tenants, else the `heads` it found
    (the claim's `heads` column) and one descent more per kind, which found no further
    tenant."""
    if tenants is None:
        return heads + len(kinds)
    return len(kinds) * len(tenants)


def bounds_json(bounds: Mapping[Pair, Bound]) -> str:
    """The claim's %(bounds)s: one object per pair, with its position (jsonb text)."""
    return json.dumps([
        {"job_kind": kind, "tenant_id": str(tenant), "priority": priority,
         "available_at": available_at.isoformat(), "id": job_id}
        for (kind, tenant), (priority, available_at, job_id) in bounds.items()])


def _last_per_pair(rows: Sequence[Mapping[str, Any]]) -> dict[Pair, Bound]:
    """The last row (in the index's order) of each pair among claimed `rows`."""
    last: dict[Pair, Bound] = {}
    for row in rows:
        pair = (row["job_kind"], row["tenant_id"])
        bound = (row["priority"], row["available_at"], row["id"])
        if pair not in last or bound > last[pair]:
            last[pair] = bound
    return last
