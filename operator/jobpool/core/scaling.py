"""Desired replicas of a lane from its job count: the operator's scaling decision.

desired = clamp(ceil((ready + running) / (workers_per_pod * target_utilization)), min, max).
Scale-up is immediate. A demand-driven scale-down waits until demand has stayed lower for
the stabilisation window, then removes at most `scale_down_max_step` replicas per decision.
Moving into changed bounds (min raised, max lowered) is immediate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

ScaleReason = Literal[
    "ScaledUp", "ScaledDown", "Steady", "ScaleDownHeld", "RaisedToMin", "LoweredToMax", "Fixed",
]


@dataclass(frozen=True)
class ScalingPolicy:
    """Bounds and targets of one lane.

    workers_per_pod: slots per pod (>= 1). target_utilization: in (0, 1].
    stabilization: seconds (>= 0). max_step: replicas per scale-down decision (>= 1).
    Raises ValueError for out-of-range values, including min_replicas > max_replicas.
    """

    min_replicas: int
    max_replicas: int
    workers_per_pod: int
    target_utilization: float = 1.0
    stabilization: float = 300.0
    max_step: int = 1

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        if self.workers_per_pod < 1:
            raise ValueError(f"workers_per_pod must be >= 1, got {self.workers_per_pod}")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(
                f"target_utilization must be in (0, 1], got {self.target_utilization}"
            )
        if self.stabilization < 0:
            raise ValueError(f"stabilization must be >= 0 seconds, got {self.stabilization}")
        if self.max_step < 1:
            raise ValueError(f"max_step must be >= 1, got {self.max_step}")


@dataclass(frozen=True)
class ScaleDecision:
    """What to do with a lane's replicas now.

    replicas: the count to write. wanted: what demand alone asks for (clamped to bounds).
    scale_down_since: when demand first fell below the current count (None when it has not);
    carry it into the next decision. reason and message: for status and events.
    """

    replicas: int
    wanted: int
    reason: ScaleReason
    message: str
    scale_down_since: datetime | None

    def changes(self, current: int) -> bool:
        """Whether this decision writes a replica count different from `current`."""
        return self.replicas != current


def wanted_replicas(policy: ScalingPolicy, ready: int, running: int) -> int:
    """Replicas demand asks for, clamped to the policy's bounds (ready, running >= 0)."""
    if ready < 0 or running < 0:
        raise ValueError(f"job counts must be >= 0, got ready={ready} running={running}")
    capacity = policy.workers_per_pod * policy.target_utilization
    raw = math.ceil(round((ready + running) / capacity, 9))
    return max(policy.min_replicas, min(policy.max_replicas, raw))


def fixed_replicas(policy: ScalingPolicy, current: int) -> ScaleDecision:
    """The decision for a lane without autoscaling: always min_replicas."""
    return ScaleDecision(
        replicas=policy.min_replicas, wanted=policy.min_replicas, reason="Fixed",
        message=f"fixed at {policy.min_replicas} (autoscaling mode none; was {current})",
        scale_down_since=None,
    )


def bounded_replicas(policy: ScalingPolicy, current: int) -> ScaleDecision | None:
    """The decision while the lane's jobs cannot be counted (its database unreachable, its
    Secret missing): back into the bounds if `current` is outside them (a hand scale, bounds
    just changed), else None (keep the count; demand is unknown)."""
    if current < policy.min_replicas:
        return ScaleDecision(
            policy.min_replicas, policy.min_replicas, "RaisedToMin",
            f"{current} -> {policy.min_replicas}: below minReplicas (jobs not counted)", None)
    if current > policy.max_replicas:
        return ScaleDecision(
            policy.max_replicas, policy.max_replicas, "LoweredToMax",
            f"{current} -> {policy.max_replicas}: above maxReplicas (jobs not counted)", None)
    return None


def decide_replicas(
    policy: ScalingPolicy,
    *,
    ready: int,
    running: int,
    current: int,
    scale_down_since: datetime | None,
    now: datetime,
) -> ScaleDecision:
    """Decide a lane's replicas from its ready and running job counts.

    current: the replicas the Deployment has now. scale_down_since: the previous decision's
    value. now: the time of this decision (timezone-aware). See the module docstring.
    """
    wanted = wanted_replicas(policy, ready, running)
    jobs = f"{ready} ready + {running} running"
    if current < policy.min_replicas:
        return ScaleDecision(
            wanted, wanted, "RaisedToMin", f"{current} -> {wanted}: below minReplicas ({jobs})",
            None,
        )
    if current > policy.max_replicas:
        return ScaleDecision(
            policy.max_replicas, wanted, "LoweredToMax",
            f"{current} -> {policy.max_replicas}: above maxReplicas ({jobs})", None,
        )
    if wanted > current:
        return ScaleDecision(wanted, wanted, "ScaledUp", f"{current} -> {wanted} ({jobs})", None)
    if wanted == current:
        return ScaleDecision(current, wanted, "Steady", f"{current} replicas ({jobs})", None)
    since = scale_down_since if scale_down_since is not None else now
    waited = now - since
    window = timedelta(seconds=policy.stabilization)
    if waited < window:
        left = (window - waited).total_seconds()
        return ScaleDecision(
            current, wanted, "ScaleDownHeld",
            f"{current} replicas, {wanted} wanted ({jobs}); scale-down in {left:.0f}s unless "
            "demand returns",
            since,
        )
    target = max(wanted, current - policy.max_step)
    return ScaleDecision(
        target, wanted, "ScaledDown",
        f"{current} -> {target} ({jobs}; lower demand since {since.isoformat()})",
        since if target > wanted else None,
    )



@dataclass(frozen=True)
class LaneJobs:
    """Jobs one lane can serve: `ready` (pending, available now) and `running`.

    capped: the count stopped at the lane's cap (`lane_count_cap`), so `ready` is a lower
    bound ("at least"); the decision is the same as for any larger count.
    """

    ready: int = 0
    running: int = 0
    capped: bool = False


def lane_count_cap(max_replicas: int, workers_per_pod: int, target_utilization: float) -> int:
    """Jobs worth counting for a lane (>= 1): beyond max_replicas x workers_per_pod x
    target_utilization ready (or running) jobs, `wanted_replicas` is max_replicas whatever
    the rest, so a count stops there and reads no more of the backlog."""
    return max(1, math.ceil(round(max_replicas * workers_per_pod * target_utilization, 9)))
