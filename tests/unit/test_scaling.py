"""The scaling decision: desired replicas from ready and running jobs, table-driven."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobpool.core.crd import API_VERSION
from jobpool.core.poolspec import load_pool
from jobpool.core.scaling import (
    ScalingPolicy,
    bounded_replicas,
    decide_replicas,
    fixed_replicas,
    wanted_replicas,
)

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
POLICY = ScalingPolicy(min_replicas=1, max_replicas=10, workers_per_pod=4)


@dataclass(frozen=True)
class Case:
    name: str
    ready: int
    running: int
    current: int
    expected: int
    reason: str
    policy: ScalingPolicy = POLICY
    since: datetime | None = None


CASES = [
    # The counting query reports 0 ready for an empty table and for jobs scheduled an hour
    # ahead (available_at > now()); both give the minimum.
    Case("empty table gives min", 0, 0, 1, 1, "Steady"),
    Case("jobs scheduled later count as none: min", 0, 0, 1, 1, "Steady"),
    Case("3 running with 4 workers per pod give 1", 0, 3, 1, 1, "Steady"),
    Case("17 ready + 3 running give 5", 17, 3, 1, 5, "ScaledUp"),
    Case("1000 ready give max", 1000, 0, 1, 10, "ScaledUp"),
    Case("exactly one pod's slots give 1", 4, 0, 1, 1, "Steady"),
    Case("one job more needs a second pod", 5, 0, 1, 2, "ScaledUp"),
    Case("scale-up is immediate however recent a scale-down", 40, 0, 2, 10, "ScaledUp",
         since=NOW - timedelta(seconds=1)),
    Case("scale-down held inside the window (first sight)", 0, 0, 5, 5, "ScaleDownHeld"),
    Case("scale-down held inside the window (299 s)", 0, 0, 5, 5, "ScaleDownHeld",
         since=NOW - timedelta(seconds=299)),
    Case("scale-down after the window, one step", 0, 0, 5, 4, "ScaledDown",
         since=NOW - timedelta(seconds=300)),
    Case("scale-down step limited by max_step", 0, 0, 9, 6, "ScaledDown",
         ScalingPolicy(1, 10, 4, max_step=3), since=NOW - timedelta(seconds=600)),
    Case("scale-down never below what demand wants", 8, 0, 5, 2, "ScaledDown",
         ScalingPolicy(1, 10, 4, max_step=10), since=NOW - timedelta(seconds=300)),
    Case("scale to zero when min is 0", 0, 0, 1, 0, "ScaledDown",
         ScalingPolicy(0, 3, 4), since=NOW - timedelta(seconds=300)),
    Case("min 0 and no jobs from zero stays zero", 0, 0, 0, 0, "Steady", ScalingPolicy(0, 3, 4)),
    Case("one job wakes a lane at zero", 1, 0, 0, 1, "ScaledUp", ScalingPolicy(0, 3, 4)),
    Case("raised min applies at once", 0, 0, 1, 3, "RaisedToMin", ScalingPolicy(3, 10, 4)),
    Case("lowered max applies at once", 100, 0, 10, 4, "LoweredToMax", ScalingPolicy(1, 4, 4)),
    Case("target utilisation 0.5 doubles the pods", 8, 0, 1, 4, "ScaledUp",
         ScalingPolicy(1, 10, 4, target_utilization=0.5)),
    Case("zero stabilisation scales down at once", 0, 0, 3, 2, "ScaledDown",
         ScalingPolicy(1, 10, 4, stabilization=0)),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_decide_replicas(case: Case) -> None:
    decision = decide_replicas(
        case.policy, ready=case.ready, running=case.running, current=case.current,
        scale_down_since=case.since, now=NOW,
    )
    assert (decision.replicas, decision.reason) == (case.expected, case.reason)
    assert decision.changes(case.current) == (case.expected != case.current)


def test_held_scale_down_remembers_when_demand_fell() -> None:
    first = decide_replicas(POLICY, ready=0, running=0, current=5, scale_down_since=None, now=NOW)
    assert first.scale_down_since == NOW
    later = NOW + timedelta(seconds=120)
    second = decide_replicas(POLICY, ready=0, running=0, current=5,
                             scale_down_since=first.scale_down_since, now=later)
    assert (second.replicas, second.scale_down_since) == (5, NOW)
    assert "180s" in second.message


def test_returning_demand_resets_the_window() -> None:
    held = decide_replicas(POLICY, ready=0, running=0, current=5, scale_down_since=None, now=NOW)
    back = decide_replicas(POLICY, ready=20, running=0, current=5,
                           scale_down_since=held.scale_down_since, now=NOW + timedelta(seconds=10))
    assert (back.reason, back.scale_down_since) == ("Steady", None)
    again = decide_replicas(POLICY, ready=0, running=0, current=5,
                            scale_down_since=back.scale_down_since,
                            now=NOW + timedelta(seconds=400))
    assert again.reason == "ScaleDownHeld"


def test_stepwise_scale_down_keeps_the_window_open_until_demand_is_met() -> None:
    policy = ScalingPolicy(0, 10, 4, max_step=2)
    since: datetime | None = NOW - timedelta(seconds=300)
    steps = []
    current = 6
    for tick in range(5):
        decision = decide_replicas(policy, ready=0, running=0, current=current,
                                   scale_down_since=since, now=NOW + timedelta(seconds=15 * tick))
        steps.append(decision.replicas)
        current, since = decision.replicas, decision.scale_down_since
        if since is None:
            break
    assert steps == [4, 2, 0]


def test_other_lanes_kinds_do_not_count_for_a_lane() -> None:
    spec = load_pool({
        "apiVersion": API_VERSION, "kind": "JobWorkerPool",
        "metadata": {"name": "p"},
        "spec": {"image": "i", "database": {"secretName": "s"}, "lanes": [
            {"name": "default"}, {"name": "mail", "kinds": ["email_send"]},
        ]},
    })
    assert not spec.lane("default").serves("email_send")
    assert spec.lane("mail").serves("email_send")
    assert not spec.lane("mail").serves("reindex")


def test_fixed_mode_holds_min() -> None:
    decision = fixed_replicas(ScalingPolicy(2, 5, 4), current=4)
    assert (decision.replicas, decision.reason) == (2, "Fixed")


@pytest.mark.parametrize(("current", "expected"), [
    (0, (2, "RaisedToMin")), (1, (2, "RaisedToMin")), (2, None), (4, None), (5, None),
    (9, (5, "LoweredToMax")),
])
def test_without_a_count_only_the_bounds_move_the_replicas(
        current: int, expected: tuple[int, str] | None) -> None:
    """Demand is unknown while the jobs cannot be counted: a count inside the bounds stays,
    one outside them (a hand scale, bounds just changed) goes back in."""
    decision = bounded_replicas(ScalingPolicy(2, 5, 4), current)
    assert (None if decision is None else (decision.replicas, decision.reason)) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "min_replicas (5) must be <= max_replicas (2)"),
        ({"min_replicas": -1}, "min_replicas must be >= 0"),
        ({"workers_per_pod": 0}, "workers_per_pod must be >= 1"),
        ({"target_utilization": 0.0}, "target_utilization must be in (0, 1]"),
        ({"target_utilization": 1.5}, "target_utilization must be in (0, 1]"),
        ({"stabilization": -1.0}, "stabilization must be >= 0"),
        ({"max_step": 0}, "max_step must be >= 1"),
    ],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"min_replicas": 1, "max_replicas": 3, "workers_per_pod": 4}
    with pytest.raises(ValueError) as caught:
        ScalingPolicy(**{**base, **kwargs})
    assert message in str(caught.value)


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="job counts must be >= 0"):
        wanted_replicas(POLICY, -1, 0)
