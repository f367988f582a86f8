"""Two operator processes share the Lease jobpool-operator: one leads at a time. The leader
killed: the standby takes over (failover measured, within 30 s). The leader paused (SIGSTOP)
past its Lease: the standby takes over, and the paused one writes nothing once it resumes.
Clocks 10 s or 30 s apart (libfaketime) give no second leader. A leader stopped cleanly
(SIGTERM) gives the Lease up."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import Operator, Tools, restricted_namespace
from .control_plane import ControlPlane
from .helpers import (
    OPERATOR_NAMESPACE,
    deployments,
    described,
    eventually,
    example_pool,
    operator_writes,
    pools_path,
)

pytestmark = pytest.mark.controlplane

FAILOVER = 30.0
"""Seconds within which a standby must lead after the leader died (the Lease's duration of
15 s plus a standby's look every 2 s, with room)."""
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/jobpool-operator"


def holder(plane: ControlPlane) -> str:
    lease = plane.admin.get(LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def led_by(plane: ControlPlane, operator: Operator) -> bool:
    return f"/{operator.pid}/" in holder(plane)


def serves_new_pool(plane: ControlPlane, dsn: str, leader: Operator) -> str:
    namespace = restricted_namespace(plane, dsn)
    plane.admin.create(pools_path(namespace), example_pool())
    eventually(lambda: len(deployments(plane, namespace)) == 4,
               f"the leader to serve a pool in {namespace}", logs=leader)
    return namespace


def writes_of(plane: ControlPlane, operator: Operator) -> list[dict[str, Any]]:
    return operator_writes(plane, credential=operator.credential)


def test_failover_after_the_leader_is_killed_or_paused(
    release: Tools, dsn: str, tmp_path: Path
) -> None:
    plane = release.plane
    first = Operator(plane, tmp_path, "first").start()
    second = third = None
    try:
        eventually(lambda: led_by(plane, first), "the first operator to lead", logs=first)
        second = Operator(plane, tmp_path, "second").start()
        serves_new_pool(plane, dsn, first)
        assert [w for w in writes_of(plane, second)
                if w["objectRef"].get("resource") != "leases"] == []

        # killed: no clean release of the Lease, the standby waits out its duration
        killed_at = time.monotonic()
        first.signal(signal.SIGKILL)
        eventually(lambda: led_by(plane, second), "the standby to lead", wait=FAILOVER * 2)
        failover = time.monotonic() - killed_at
        print(f"failover after SIGKILL: {failover:.1f} s")
        assert failover <= FAILOVER
        serves_new_pool(plane, dsn, second)

        # paused past its Lease: a third process takes over; the paused one, resumed,
        # stands by and writes nothing
        third = Operator(plane, tmp_path, "third").start()
        time.sleep(3)
        second.signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        eventually(lambda: led_by(plane, third), "the third operator to lead",
                   wait=FAILOVER * 2)
        print(f"failover after SIGSTOP: {time.monotonic() - paused_at:.1f} s")
        before = len(writes_of(plane, second))
        second.signal(signal.SIGCONT)
        serves_new_pool(plane, dsn, third)
        time.sleep(10)
        resumed = writes_of(plane, second)[before:]
        assert [w for w in resumed if w["objectRef"].get("resource") != "leases"
                or w["responseStatus"].get("code", 500) < 300] == [], described(resumed)
        assert led_by(plane, third)
    finally:
        for operator in (first, second, third):
            if operator is not None:
                operator.stop()


def test_a_leader_that_stops_cleanly_gives_its_lease_up(
    release: Tools, tmp_path: Path
) -> None:
    plane = release.plane
    first = Operator(plane, tmp_path, "first").start()
    second = None
    try:
        eventually(lambda: led_by(plane, first), "the first operator to lead", logs=first)
        first.stop()  # SIGTERM, as a rolling update sends it
        # released, not left to expire: a standby takes it at its next look
        assert holder(plane) == ""
        second = Operator(plane, tmp_path, "second").start()
        eventually(lambda: led_by(plane, second), "the second operator to lead", logs=second)
    finally:
        for operator in (first, second):
            if operator is not None:
                operator.stop()


# 10 s: the most the operator promises to bear; 30 s: beyond the Lease's duration, which a
# leader election by the standby's clock against the holder's renewTime could not bear
@pytest.mark.parametrize("skew", ["+10s", "-10s", "+30s", "-30s"])
def test_skewed_clocks_give_one_leader(
    release: Tools, dsn: str, tmp_path: Path, skew: str
) -> None:
    if not LIBFAKETIME.is_file():
        pytest.skip(f"libfaketime not installed ({LIBFAKETIME}; Debian package faketime)")
    plane = release.plane
    # the leader runs on the true clock with "+" (the standby's runs ahead, so the Lease
    # looks old to it), on a skewed one with "-" (it writes renewTimes in the past);
    # preloaded into the operator's own process (the faketime command would be a parent
    # process), on the wall clock alone, as a host's skew is
    skewed = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": skew, "DONT_FAKE_MONOTONIC": "1"}
    leader = Operator(plane, tmp_path, "leader",
                      extra_env=skewed if skew.startswith("-") else None).start()
    standby = None
    try:
        eventually(lambda: led_by(plane, leader), "the leader to lead", logs=leader)
        standby = Operator(plane, tmp_path, "standby",
                           extra_env=skewed if skew.startswith("+") else None).start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert led_by(plane, leader), f"the Lease moved to {holder(plane)}"
            time.sleep(0.5)
        serves_new_pool(plane, dsn, leader)
        assert [w for w in writes_of(plane, standby)
                if w["objectRef"].get("resource") != "leases"] == []
    finally:
        for operator in (leader, standby):
            if operator is not None:
                operator.stop()
