"""How long a worker may take from SIGTERM to its exit: each step of its shutdown is bounded,
and whatever stops it (a pod's termination grace period) must wait for their sum, or it kills
a worker that is still handing jobs back, whose claims then wait for stale-claim recovery."""

from __future__ import annotations

import math

BUFFER_HAND_BACK_TIMEOUT = 5.0
"""Seconds the hand-back of the prefetch buffer at shutdown may take; past them the buffered
jobs are handed back with the other leftovers at exit."""

SHUTDOWN_WRITE_TIMEOUT = 5.0
"""Seconds a job cancelled at the end of the grace period may take to be handed back, beyond
the stop grace its handler gets to clean up."""

SHUTDOWN_SETTLE_TIMEOUT = 10.0
"""Seconds a stopping worker keeps trying to hand back the jobs still claimed under its id
(outcomes it could not write, a claim whose answer never came), waiting for the database
meanwhile; a worker with none of them exits at once (`jobpool.worker.leftovers`)."""

LEFT_TASKS_WAIT = 1.0
"""Seconds the tasks still running when the worker's main task ends get after their
cancellation."""

EXIT_ALLOWANCE = 5.0
"""Seconds for the rest: the worker's registry row deleted, its connections closed, the
process's own exit."""


def shutdown_bound(grace: float, stop_grace: float) -> float:
    """The seconds a worker's shutdown is given from SIGTERM to its exit: the buffer's
    hand-back, the grace period its running jobs get (`grace`, seconds), the stop grace of
    the handlers cancelled at its end (`stop_grace`, seconds) with their hand-back write, the
    hand-back of leftovers, the leftover tasks, and the exit. Each step but the last is
    bounded by its own timeout; the exit (the lease thread's last round, closing connections)
    can outlast `EXIT_ALLOWANCE` only while the database does not answer, when the claims
    left wait for stale-claim recovery anyway. A second SIGTERM shortens it."""
    return (BUFFER_HAND_BACK_TIMEOUT + grace + stop_grace + SHUTDOWN_WRITE_TIMEOUT
            + SHUTDOWN_SETTLE_TIMEOUT + LEFT_TASKS_WAIT + EXIT_ALLOWANCE)


def termination_grace_seconds(grace: float, stop_grace: float) -> int:
    """A pod's `terminationGracePeriodSeconds` for a worker with `grace` and `stop_grace`
    (seconds): `shutdown_bound`, rounded up to a whole second, so that the kubelet's SIGKILL
    never cuts a shutdown short."""
    return math.ceil(shutdown_bound(grace, stop_grace))
