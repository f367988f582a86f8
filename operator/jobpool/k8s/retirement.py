"""When the operator retires the schedules of a deleted pool (pure).

A pool's workers declare its schedules when they start and retire those its spec no longer
has; a pool deleted for good leaves its schedules behind, and every other worker of the
database goes on enqueueing their ticks. The operator retires them (`retire_pool_schedules`:
every schedule the pool's owner declared, audited) once it is safe to:

- not while a pool of the same name is stored again (deleted and created again, by
  `kubectl replace --force` or a reinstall): that pool's workers own the schedules, and
  retire what its spec dropped when they start. The gone pool is forgotten then;
- not while a Deployment of the pool is left: the garbage collector has not removed it yet,
  and a pool created again in that time could take it over with its pods running, which
  declared their schedules long before and would not declare them again;
- then again each round for `linger_seconds` after the first retirement: a pod of the
  deleted pool still shutting down in that time (its container restarted before its pod
  was deleted) may declare the schedules again, once.

A gone pool whose retirement keeps failing is given up after `GIVE_UP_AFTER` tries (the
operator logs `jobpool schedules retire`, which does the same by hand). The operator keeps
gone pools in memory: one deleted while no operator ran is not seen, and keeps its
schedules until that command runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from jobpool.core.poolspec import PoolSpec
from jobpool.core.shutdown import termination_grace_seconds

GIVE_UP_AFTER = 10
"""Failed tries (the database or the pool's Secret not reachable) before a gone pool's
schedules are left to `jobpool schedules retire`."""

Step = Literal["forget", "wait", "retire"]
"""What to do about a gone pool this round: forget it (nothing left to retire, or it is back),
wait (its Deployments are not collected yet), or retire its schedules."""


@dataclass
class GonePool:
    """A pool the operator saw deleted, as it was last stored (`body`), and how its
    retirement went: when it first succeeded (seconds since the epoch, None before) and how
    many tries failed."""

    body: dict[str, Any]
    retired_at: float | None = None
    failures: int = field(default=0)


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
