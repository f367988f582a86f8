"""What a worker may have left claimed under its id in the database, and whether it must hand
that back before it exits.

A job claimed under the worker's id is its own until an outcome is written (done, retry, DLQ,
a hand-back) or its claim is taken away (a stop, stale-claim recovery). `Leftovers` keeps the
jobs claimed whose outcome was not confirmed, and whether a claim went out whose answer never
came (its commit may have gone through, with rows the worker never saw). A hand-back of every
claim but the running ones (`release_unrun_claims`) settles both. A stopping worker with
neither has nothing in the database to hand back, and exits at once even while the database
is unreachable; one with either waits for the database to hand them back
(`jobpool.core.shutdown.SHUTDOWN_SETTLE_TIMEOUT`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence

from jobpool.db.queries import Row
from jobpool.db.store import UNCAPPED, Completion, QueueStore, Written
from jobpool.metrics import JobOutcome

SETTLED: frozenset[JobOutcome] = frozenset(
    {"done", "retry", "dlq", "rate_limited", "lost_claim", "stopped", "released"})
"""Outcomes that leave the job claimed under the worker's id no longer: written, or the claim
was gone. `error` (the write was refused) leaves it claimed; `released` does too when the
worker was stopping, because the hand-back of a job cancelled at the end of the grace period
reports no failure."""


class Leftovers:
    """The jobs this worker claimed whose outcome is not confirmed, and whether a claim's
    answer never came; `in_doubt` when either may leave a job claimed under its id."""

    def __init__(self) -> None:
        self.jobs: set[int] = set()
        self.claim_unanswered = False

    @property
    def in_doubt(self) -> bool:
        """Whether some job may be claimed under this worker's id with no outcome written."""
        return self.claim_unanswered or bool(self.jobs)

    def claimed(self, rows: Iterable[Row]) -> None:
        """A claim's answer: its rows are this worker's until their outcome."""
        self.jobs.update(row["id"] for row in rows)

    def ended(self, job_id: int, outcome: JobOutcome, *, stopping: bool) -> None:
        """An attempt of `job_id` ended with `outcome` (`stopping`: the worker was)."""
        if outcome in SETTLED and not (stopping and outcome == "released"):
            self.jobs.discard(job_id)

    def lost(self, job_id: int) -> None:
        """The claim of `job_id` was taken away (a stop, stale-claim recovery), also from a
        buffered job that then never runs."""
        self.jobs.discard(job_id)

    def settled(self, running: Collection[int]) -> None:
        """Every claim under this worker's id but the `running` jobs was handed back."""
        self.jobs &= set(running)
        self.claim_unanswered = False


class WatchedStore:
    """The queue store as the completer and the fetch loop use it, telling `leftovers` of
    each claim that got no answer and of each hand-back of the unrun claims."""

    def __init__(self, store: QueueStore, leftovers: Leftovers) -> None:
        self.store = store
        self.leftovers = leftovers

    async def complete_and_claim(
        self, completions: Sequence[Completion], *, kinds: Sequence[str],
        tenants: Sequence[uuid.UUID] | None, limit: int, caps: Mapping[str, int] = UNCAPPED,
    ) -> Written:
        """`QueueStore.complete_and_claim`; a claim that raised may have committed unseen."""
        try:
            return await self.store.complete_and_claim(
                completions, kinds=kinds, tenants=tenants, limit=limit, caps=caps)
        except BaseException:
            if limit > 0:
                self.leftovers.claim_unanswered = True
            raise

    async def complete_alone(self, completion: Completion) -> bool:
        """`QueueStore.complete_alone`."""
        return await self.store.complete_alone(completion)

    async def release_unrun_claims(self, running: Sequence[int]) -> list[Row]:
        """`QueueStore.release_unrun_claims`, settling the leftovers when it went through."""
        released = await self.store.release_unrun_claims(running)
        self.leftovers.settled(running)
        return released
