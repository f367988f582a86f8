"""When the operator retires the schedules of a deleted pool (pure).

A pool's workers declare its schedules when they start and retire those its spec no longer
has; a pool deleted for good leaves its schedules behind, and every other worker of the
database goes on enqueueing their ticks. The operator retires them (`retire_pool_schedules`:
every schedule the pool's owner declared, audited; also for a pool whose last spec had none,
whose workers may not all have retired the ones it dropped) once it is safe to:

- not while a pool of the same name is stored again (deleted and created again, by
  `kubectl replace --force` or a reinstall): that pool's workers own the schedules, and
  retire what its spec dropped when they start. The gone pool is forgotten then;
- not while a Deployment of the pool is left: the garbage collector has not removed it yet,
  and a pool created again in that time could take it over with its pods running, which
  declared their schedules long before and would not declare them again;
- then again each round for `linger_seconds` after the first retirement: a pod of the
  deleted pool still shutting down in that time (its container restarted before its pod
  was deleted) may declare the schedules again, once.

A gone pool's database is the one its DSN Secret names, or, when the Secret went with the
pool (its namespace deleted, or one app holding both), the DSN the operator last read for
it. A retirement that keeps failing (the database or the Secret out of reach) is tried each
round and given up after `GIVE_UP_AFTER` seconds, logged with `jobpool schedules retire`,
which does the same by hand. The operator keeps gone pools in memory, while it leads: one
deleted while no operator led, or not yet retired when the leader stopped, keeps its
schedules until that command runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from jobpool.core.poolspec import PoolSpec
from jobpool.core.shutdown import termination_grace_seconds

GIVE_UP_AFTER = 3600.0
"""Seconds of failed tries (the database or the pool's Secret out of reach) before a gone
pool's schedules are left to `jobpool schedules retire`: longer than a database's usual
maintenance window."""
WARN_EVERY = 20
"""Failed tries between two warnings (the first failure is always logged)."""

Step = Literal["forget", "wait", "retire"]
"""What to do about a gone pool this round: forget it (nothing left to retire, or it is back),
wait (its Deployments are not collected yet), or retire its schedules."""

Failure = Literal["give up", "warn", "quiet"]
"""What a failed try leads to: give the pool up, log a warning, or neither."""


@dataclass
class GonePool:
    """A pool the operator saw deleted, as it was last stored (`body`); the DSN the operator
    last read for it (`dsn`, None if none); and how its retirement went: when it first
    succeeded and since when tries fail (seconds since the epoch, None if not), how many
    failed in a row, whether its wait for its Deployments was logged."""

    body: dict[str, Any]
    dsn: str | None = None
    retired_at: float | None = None
    failing_since: float | None = None
    failures: int = 0
    waiting: bool = False


def retirement_step(gone: GonePool, *, stored: bool, deployments: bool, now: float,
                    linger: float) -> Step:
    """This round's step for `gone`: `stored` whether a pool of its name is stored now,
    `deployments` whether a Deployment of it is left, `now` seconds since the epoch, `linger` the
    seconds to keep retiring after the first success (`linger_seconds`)."""
    if stored:
        return "forget"
    if deployments:
        return "wait"
    if gone.retired_at is not None and now - gone.retired_at >= linger:
        return "forget"
    return "retire"


def linger_seconds(pool: PoolSpec, interval: float) -> float:
    """Seconds to keep retiring after the first retirement: the pool's pods' termination
    grace (the longest a pod of it may still run once deleted), plus two rounds of
    `interval` seconds for the garbage collector to delete the pods after their
    Deployments."""
    return termination_grace_seconds(pool.grace_seconds, pool.stop_grace_seconds) + 2 * interval


def failed_try(gone: GonePool, now: float) -> Failure:
    """Record a failed try of `gone`'s retirement at `now` (seconds since the epoch) and say
    what it leads to (`Failure`)."""
    gone.failures += 1
    if gone.failing_since is None:
        gone.failing_since = now
    if now - gone.failing_since >= GIVE_UP_AFTER:
        return "give up"
    return "warn" if gone.failures == 1 or gone.failures % WARN_EVERY == 0 else "quiet"


def succeeded(gone: GonePool, now: float) -> None:
    """Record a retirement of `gone` that went through at `now`."""
    gone.failures, gone.failing_since = 0, None
    if gone.retired_at is None:
        gone.retired_at = now
