"""Leader election rules (pure): who acts, and what a replica writes into the Lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobpool.k8s.lease import LeaseTiming, lease_body, micro_time, next_move, released

NOW = datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=UTC)
TIMING = LeaseTiming()


def held(by: str | None, renewed: datetime, duration: int = 15) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "jobpool-operator", "namespace": "ops", "resourceVersion": "9"},
            "spec": {"holderIdentity": by, "renewTime": micro_time(renewed),
                     "leaseDurationSeconds": duration, "leaseTransitions": 2}}


@pytest.mark.parametrize(("lease", "move"), [
    (None, "create"),
    (held("me", NOW - timedelta(seconds=60)), "renew"),  # still mine, however late
    (held("other", NOW - timedelta(seconds=14)), "wait"),
    (held("other", NOW - timedelta(seconds=16)), "take"),  # expired
    (held(None, NOW), "take"),  # released
])
def test_next_move(lease: dict[str, Any] | None, move: str) -> None:
    assert next_move(lease, "me", NOW) == move


def test_taking_a_lease_counts_a_transition_and_keeps_the_resource_version() -> None:
    body = lease_body(held("other", NOW - timedelta(seconds=20)), name="jobpool-operator",
                      namespace="ops", me="me", now=NOW, timing=TIMING, move="take")
    assert body["metadata"]["resourceVersion"] == "9"  # a stale write loses with a 409
    spec = body["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("me", 3)
    assert spec["acquireTime"] == spec["renewTime"] == "2026-11-30T12:00:00.250000Z"
    assert spec["leaseDurationSeconds"] == 15


def test_renewing_keeps_the_acquire_time() -> None:
    lease = held("me", NOW - timedelta(seconds=5))
    lease["spec"]["acquireTime"] = "2026-11-30T11:00:00.000000Z"
    spec = lease_body(lease, name="jobpool-operator", namespace="ops", me="me", now=NOW,
                      timing=TIMING, move="renew")["spec"]
    assert spec["acquireTime"] == "2026-11-30T11:00:00.000000Z"
    assert (spec["renewTime"], spec["leaseTransitions"]) == ("2026-11-30T12:00:00.250000Z", 2)


def test_a_released_lease_is_taken_at_once() -> None:
    lease = released(held("me", NOW))
    assert lease["spec"]["holderIdentity"] is None
    assert lease["metadata"]["resourceVersion"] == "9"
    assert next_move(lease, "other", NOW) == "take"


def test_a_leader_stops_acting_before_a_standby_may_take_over() -> None:
    assert TIMING.renew_every < TIMING.renew_deadline < TIMING.duration
    assert TIMING.duration + TIMING.retry_every < 30  # failover within 30 s
