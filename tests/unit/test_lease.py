"""Leader election rules (pure): who acts, and what a replica writes into the Lease."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobpool.k8s.lease import (
    LeaseTiming,
    Observation,
    lease_body,
    may_act,
    micro_time,
    next_move,
    observe,
    released,
    write_budget,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=UTC)
TIMING = LeaseTiming()


def held(by: str | None, renewed: datetime, duration: int = 15) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "jobpool-operator", "namespace": "ops", "resourceVersion": "9"},
            "spec": {"holderIdentity": by, "renewTime": micro_time(renewed),
                     "leaseDurationSeconds": duration, "leaseTransitions": 2}}


@pytest.mark.parametrize(("lease", "seen_ago", "move"), [
    (None, None, "create"),
    (held("me", NOW - timedelta(seconds=60)), 60.0, "renew"),  # still mine, however late
    (held("other", NOW), 14.0, "wait"),
    (held("other", NOW), 15.0, "take"),  # unchanged for its duration, by my clock
    (held(None, NOW), 0.0, "take"),  # released
])
def test_next_move(lease: dict[str, Any] | None, seen_ago: float | None, move: str) -> None:
    seen = observe(None, lease, 100.0 - (seen_ago or 0.0))
    assert next_move(lease, "me", seen, 100.0) == move


@pytest.mark.parametrize("skew", [-10.0, -5.0, 0.0, 5.0, 10.0, 3600.0])
def test_a_standby_judges_the_lease_by_its_own_clock_never_by_the_holders(skew: float) -> None:
    # the holder's clock is `skew` seconds off: the renewTime it writes says nothing
    lease = held("other", NOW + timedelta(seconds=skew))
    seen = observe(None, lease, 500.0)  # first read: the record is new to me
    assert next_move(lease, "me", seen, 500.0) == "wait"
    assert next_move(lease, "me", observe(seen, lease, 514.9), 514.9) == "wait"
    assert next_move(lease, "me", observe(seen, lease, 515.0), 515.0) == "take"
    renewed = held("other", NOW + timedelta(seconds=skew + 5))  # renewed meanwhile
    later = observe(seen, renewed, 514.0)
    assert later == Observation(later.record, 514.0)
    assert next_move(renewed, "me", later, 528.9) == "wait"


def test_a_leader_acts_until_its_renew_deadline_and_writes_end_before_the_lease_can_expire(
) -> None:
    assert may_act(100.0, 109.9, TIMING) and not may_act(100.0, 110.0, TIMING)
    assert not may_act(None, 100.0, TIMING)
    assert write_budget(100.0, 100.0, TIMING) == 15.0
    assert write_budget(100.0, 109.0, TIMING) == 6.0  # ends by 115, the earliest takeover
    assert write_budget(100.0, 110.0, TIMING) is None
    assert TIMING.request_timeout == TIMING.duration - TIMING.renew_deadline


@pytest.mark.parametrize("timing", [
    {"renew_every": 10.0, "renew_deadline": 10.0}, {"renew_deadline": 15.0},
    {"renew_every": 0.0}, {"retry_every": 0.0},
])
def test_a_timing_that_allows_two_leaders_is_refused(timing: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="lease timing"):
        LeaseTiming(**timing)


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
    assert next_move(lease, "other", observe(None, lease, 1.0), 1.0) == "take"


def test_a_leader_stops_acting_before_a_standby_may_take_over() -> None:
    assert TIMING.renew_every < TIMING.renew_deadline < TIMING.duration
    assert TIMING.duration + TIMING.retry_every < 30  # failover within 30 s


# -- two replicas on one Lease, simulated: each with its own clocks ---------------------------


@dataclass
class Replica:
    """A replica running the election's rules as k8s.leader does: a read, then a write
    conditional on the resourceVersion read, `latency` seconds later."""

    name: str
    wall_skew: float  # seconds its wall clock is off
    mono_offset: float  # its monotonic clock's own zero
    pauses: tuple[tuple[float, float], ...] = ()  # (from, to) in true seconds: SIGSTOP
    killed_at: float = float("inf")
    cut_at: float = float("inf")  # from then on it runs, but no request reaches the API
    renewed_at: float | None = None
    seen: Observation | None = None
    next_at: float = 0.0
    planned: tuple[dict[str, Any], str | None, float, float] | None = None
    acted: list[float] = field(default_factory=list)
    conflicts: int = 0

    def mono(self, t: float) -> float:
        return t + self.mono_offset

    def running(self, t: float) -> bool:
        return t < self.killed_at and not any(start <= t < end for start, end in self.pauses)

    def step(self, t: float, store: dict[str, Any], latency: float = 0.2) -> None:
        if not self.running(t):
            return
        if may_act(self.renewed_at, self.mono(t), TIMING):
            self.acted.append(t)  # the controller writes only now
        if self.planned is not None:
            body, version, started, write_at = self.planned
            if t < write_at:
                return
            self.planned = None
            if store["version"] == version:  # the API server's resourceVersion check
                store["version"] = str(int(store["version"] or 0) + 1)
                store["lease"] = {**body, "metadata": {**body["metadata"],
                                                       "resourceVersion": store["version"]}}
                self.renewed_at, self.next_at = started, t + TIMING.renew_every
            else:  # 409 Conflict: another replica wrote first
                self.renewed_at, self.next_at = None, t + TIMING.retry_every
                self.conflicts += 1
            return
        if t < self.next_at:
            return
        if t >= self.cut_at:  # the request fails: nothing learnt, nothing written
            self.next_at = t + TIMING.retry_every
            return
        lease = copy.deepcopy(store["lease"])
        now = self.mono(t)
        self.seen = observe(self.seen, lease, now)
        move = next_move(lease, self.name, self.seen, now)
        if move == "wait":
            self.renewed_at, self.next_at = None, t + TIMING.retry_every
            return
        wall = NOW + timedelta(seconds=t + self.wall_skew)
        body = lease_body(lease, name="jobpool-operator", namespace="ops", me=self.name,
                          now=wall, timing=TIMING, move=move)
        self.planned = (body, store["version"], now, t + latency)


def simulate(*replicas: Replica, until: float = 120.0, tick: float = 0.05) -> list[float]:
    """Run the replicas; the true times at which some replica acted. Fails if two act at
    once."""
    store: dict[str, Any] = {"lease": None, "version": None}
    acting: list[float] = []
    for step in range(int(until / tick)):
        t = step * tick
        before = {r.name: len(r.acted) for r in replicas}
        for replica in replicas:
            replica.step(t, store)
        now_acting = [r.name for r in replicas if len(r.acted) > before[r.name]]
        assert len(now_acting) <= 1, f"two leaders at {t:.2f} s: {now_acting}"
        if now_acting:
            acting.append(t)
    return acting


@pytest.mark.parametrize("skew", [-10.0, 10.0])
def test_a_killed_leader_is_replaced_within_the_lease_duration_whatever_the_skew(
    skew: float,
) -> None:
    a = Replica("a", wall_skew=skew, mono_offset=1000.0, killed_at=30.3)
    b = Replica("b", wall_skew=-skew, mono_offset=-7.0, next_at=0.1)
    simulate(a, b)
    assert a.acted and a.acted[0] < 1.0
    failover = b.acted[0] - a.killed_at
    assert failover <= TIMING.duration + 2 * TIMING.retry_every < 30


@pytest.mark.parametrize("skew", [-10.0, 10.0])
def test_a_paused_leader_that_resumes_after_its_lease_expired_never_writes(skew: float) -> None:
    # a is stopped for 40 s between reading the Lease and writing it (SIGSTOP, a long GC)
    a = Replica("a", wall_skew=skew, mono_offset=50.0, pauses=((20.9, 60.9),))
    b = Replica("b", wall_skew=-skew, mono_offset=0.0, next_at=0.1)
    simulate(a, b)
    assert not [t for t in a.acted if t >= 20.9]  # not once after it resumed
    assert b.acted and b.acted[0] < 60.9  # b took over while a was stopped
    assert a.conflicts == 1 and a.renewed_at is None  # its stale write lost with a 409


@pytest.mark.parametrize("skew", [-10.0, 10.0])
def test_a_leader_cut_off_from_the_api_stops_before_the_standby_starts(skew: float) -> None:
    a = Replica("a", wall_skew=skew, mono_offset=0.0, cut_at=30.3)
    b = Replica("b", wall_skew=-skew, mono_offset=77.0, next_at=0.1)
    simulate(a, b)
    assert b.acted and max(a.acted) < b.acted[0]
    assert b.acted[0] - 30.3 <= TIMING.duration + 2 * TIMING.retry_every


def test_a_leader_stopped_past_its_renew_deadline_waits_for_a_renewal_before_writing() -> None:
    a = Replica("a", wall_skew=0.0, mono_offset=0.0, pauses=((16.0, 28.0),))  # renewed 15.6
    b = Replica("b", wall_skew=0.0, mono_offset=0.0, next_at=0.1)
    simulate(a, b)
    resumed = [t for t in a.acted if t >= 28.0]
    assert resumed and resumed[0] > 28.2  # its deadline 25.6 passed: only after a renewal
    assert not b.acted


def test_with_both_running_one_leads_throughout() -> None:
    a = Replica("a", wall_skew=10.0, mono_offset=3.0)
    b = Replica("b", wall_skew=-10.0, mono_offset=9.0, next_at=0.05)
    acting = simulate(a, b)
    assert a.acted and not b.acted
    assert acting[-1] > 119.0
