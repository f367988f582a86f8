"""A stopped job's handler is interrupted: the worker's running tasks by job id, and their
cancellation.

`jobpool jobs stop` (the API, the console) marks the job `failed` and, in the same
transaction, notifies the `jobpool_stop` channel with the job's id (`stop_job`). The worker's
LISTEN connection hands the notification to `Stops.notified`; a worker without one (poll-only,
behind a transaction pooler) learns it from its lease renewal, which finds the claim gone
(`LeaseKeeper`'s `lost`, at most a third of the lease later). Either way the worker cancels the
job's task: the handler gets `asyncio.CancelledError`, its transaction is rolled back (the
outcome write is compare-and-set on the claim the stop took away, so nothing it wrote
commits), and psycopg cancels the statement a handler was awaiting on its backend (the cancel
request `pg_cancel_backend` sends; an index build's CREATE INDEX CONCURRENTLY stops).

A handler may catch the CancelledError to clean up; it has `grace` seconds for that (the
worker's `stop_grace`, 10 s by default). Past them
the task is cancelled again and abandoned: the slot is freed for the next claim, and the task
is left to end on its own (its connection stays with it until then).

A job whose outcome is being written (`finishing`) is not cancelled: that write finds the
claim gone and rolls back by itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobpool.metrics import JobOutcome

log = logging.getLogger("jobpool.worker")

STOP_CHANNEL = "jobpool_stop"
"""The NOTIFY channel of stops; payload: the stopped job's id."""


@dataclass
class Running:
    """One job's task, and when its stop was delivered (None: not stopped)."""

    kind: str
    task: asyncio.Task[None]
    stopped_at: float | None = None
    outcome: JobOutcome = "stopped"
    """What the cancelled attempt counts as: `stopped`, or `lost_claim` (taken back by
    stale-claim recovery)."""
    overdue: asyncio.TimerHandle | None = field(default=None, repr=False)


class Stops:
    """The running jobs of one worker by id; cancels the handler of a stopped one.

    `grace`: seconds (> 0) a cancelled handler may take to clean up. `finishing(job_id)`: True
    while the job's outcome is being written (left alone). `abandon(job_id)`: free the job's
    slot (the worker's bookkeeping of a finished task). Everything runs in the worker's event
    loop.
    """

    def __init__(self, *, grace: float, finishing: Callable[[int], bool],
                 abandon: Callable[[int], None]) -> None:
        if not grace > 0:
            raise ValueError(f"stop grace must be > 0 seconds, got {grace}")
        self.grace = grace
        self._finishing = finishing
        self._abandon = abandon
        self._running: dict[int, Running] = {}

    def running(self, job_id: int, kind: str, task: asyncio.Task[None]) -> None:
        """Job `job_id` of `kind` runs in `task` from now on."""
        self._running[job_id] = Running(kind, task)

    def finished(self, job_id: int) -> None:
        """Job `job_id`'s task ended (or was abandoned); logs how long a stop took."""
        job = self._running.pop(job_id, None)
        if job is None or job.stopped_at is None:
            return
        if job.overdue is not None:
            job.overdue.cancel()
        if job.task.done():
            log.info("job %d (%s): its handler ended %.3fs after its cancellation, its "
                     "changes rolled back", job_id, job.kind, time.monotonic() - job.stopped_at)

    def stopping(self, job_id: int) -> bool:
        """Whether job `job_id`'s task is being cancelled for a stop (not for a shutdown)."""
        job = self._running.get(job_id)
        return job is not None and job.stopped_at is not None

    def outcome(self, job_id: int) -> JobOutcome:
        """What job `job_id`'s cancelled attempt counts as (`stopping` is True)."""
        return self._running[job_id].outcome

    def notified(self, payload: str) -> None:
        """A notification on `STOP_CHANNEL`: stop the job it names if it runs here."""
        try:
            job_id = int(payload)
        except ValueError:
            log.warning("ignoring a stop notification that names no job id: %r", payload[:100])
            return
        self.stop(job_id, "stopped")

    def claim_lost(self, job_id: int, stopped: bool) -> None:
        """The lease renewal found job `job_id` no longer claimed by this worker: `stopped`,
        or taken back by stale-claim recovery (it runs elsewhere). Its handler's work cannot
        commit either way, so cancel it."""
        if stopped:
            self.stop(job_id, "stopped")
        else:
            self.stop(job_id, "lost its claim to stale-claim recovery", outcome="lost_claim")

    def stop(self, job_id: int, why: str, *, outcome: JobOutcome = "stopped") -> None:
        """Cancel job `job_id`'s handler, unless it is not running here, is already being
        stopped, or its outcome is being written."""
        job = self._running.get(job_id)
        if job is None or job.stopped_at is not None or job.task.done():
            return
        if self._finishing(job_id):
            return  # its outcome write finds the claim gone and rolls back
        log.info("job %d (%s) %s: cancelling its handler (%gs to clean up)", job_id, job.kind,
                 why, self.grace)
        job.stopped_at, job.outcome = time.monotonic(), outcome
        job.task.cancel()
        job.overdue = asyncio.get_running_loop().call_later(self.grace, self._overdue, job_id)

    def _overdue(self, job_id: int) -> None:
        """The grace is over and the handler still runs: cancel it again, free its slot."""
        job = self._running.get(job_id)
        if job is None or job.task.done():
            return
        log.error("job %d (%s): its handler did not end within %gs of its stop; cancelled "
                  "again and abandoned (its slot is free, its changes cannot commit)", job_id,
                  job.kind, self.grace)
        job.task.cancel()
        self._abandon(job_id)
