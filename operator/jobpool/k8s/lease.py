"""Leader election on a coordination.k8s.io/v1 Lease (pure): what a replica does next.

One replica leads: it renews the Lease every `renew_every` seconds; the others wait. A
standby judges the Lease by its own clock alone, never by the times written in it (the
holder's clock may be ahead or behind): it notes when it last saw the Lease's record
change, and takes the Lease once the record stayed the same for the record's
`leaseDurationSeconds` (the holder crashed, or lost the API). A leader acts only until
`renew_deadline` seconds after it sent its last successful renewal, by its own clock
(renew_deadline < duration): a standby saw that renewal after it was sent, so it waits
longer than the leader acts, and two replicas never act at once. Writes of the Lease carry
the resourceVersion read, so of two replicas writing at once one gets 409 Conflict and
loses. Times here are seconds of a monotonic clock (`now`), except the stamps written
into the Lease for people to read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

LEASE_NAME = "jobpool-operator"


@dataclass(frozen=True)
class LeaseTiming:
    """Seconds: how long a Lease holds, how often the leader renews it, how long a leader
    may fail to renew before it stops acting, how often a standby looks.

    Raises ValueError unless 0 < renew_every < renew_deadline < duration and retry_every > 0.
    """

    duration: float = 15.0
    renew_every: float = 5.0
    renew_deadline: float = 10.0
    retry_every: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_every < self.renew_deadline < self.duration:
            raise ValueError(
                "lease timing: need 0 < renew_every < renew_deadline < duration, got "
                f"{self.renew_every}, {self.renew_deadline}, {self.duration} seconds")
        if self.retry_every <= 0:
            raise ValueError(f"lease timing: retry_every must be > 0, got {self.retry_every}")

    @property
    def request_timeout(self) -> float:
        """Seconds a request of the election may take: the margin between the renew
        deadline and the Lease's duration."""
        return self.duration - self.renew_deadline


@dataclass(frozen=True)
class Observation:
    """The Lease's record as a replica last saw it change, and when (`since`, by its own
    monotonic clock)."""

    record: tuple[Any, ...]
    since: float


Move = Literal["create", "renew", "take", "wait"]


def observe(seen: Observation | None, lease: Mapping[str, Any] | None,
            now: float) -> Observation | None:
    """What replica knows after reading `lease` at `now`: `seen` if the record is the same,
    else the new record seen from `now` on (None: there is no Lease)."""
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    record = tuple(spec.get(key) for key in (
        "holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime",
        "leaseTransitions"))
    if seen is not None and seen.record == record:
        return seen
    return Observation(record, now)


def next_move(lease: Mapping[str, Any] | None, me: str, seen: Observation | None,
              now: float) -> Move:
    """What replica `me` does with the Lease read at `now` (None: there is none).

    seen: `observe(...)` of this very read. create: there is none; renew: `me` holds it;
    take: nobody holds it, or its record stayed unchanged for its duration since `seen`;
    wait: another replica holds it.
    """
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if holder == me:
        return "renew"
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not holder or seen is None or now >= seen.since + duration:
        return "take"
    return "wait"


def may_act(renewed_at: float | None, now: float, timing: LeaseTiming) -> bool:
    """Whether a replica whose last successful renewal was sent at `renewed_at` (None:
    it does not hold the Lease) may still act at `now`."""
    return renewed_at is not None and now < renewed_at + timing.renew_deadline


def write_budget(renewed_at: float | None, now: float, timing: LeaseTiming) -> float | None:
    """Seconds a write started at `now` may take, so that it ends before a standby may
    take the Lease; None: this replica may not write."""
    if renewed_at is None or not may_act(renewed_at, now, timing):
        return None
    return renewed_at + timing.duration - now


def lease_body(
    lease: Mapping[str, Any] | None, *, name: str, namespace: str, me: str, now: datetime,
    timing: LeaseTiming, move: Move,
) -> dict[str, Any]:
    """The Lease to write for `move` (create, renew or take): `me` holding it from `now`."""
    spec = dict((lease or {}).get("spec") or {})
    stamp = micro_time(now)
    if move != "renew":
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (move == "take")
    spec.update(holderIdentity=me, leaseDurationSeconds=math.ceil(timing.duration), renewTime=stamp)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    version = ((lease or {}).get("metadata") or {}).get("resourceVersion")
    if version:
        metadata["resourceVersion"] = version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": spec}


def released(lease: Mapping[str, Any]) -> dict[str, Any]:
    """The Lease given up by its holder on a clean stop, so a standby takes it at once."""
    body = {key: value for key, value in lease.items() if key in ("apiVersion", "kind")}
    body["metadata"] = {key: lease["metadata"][key] for key in
                        ("name", "namespace", "resourceVersion") if key in lease["metadata"]}
    body["spec"] = {**(lease.get("spec") or {}), "holderIdentity": None}
    return body


def micro_time(moment: datetime) -> str:
    """A MicroTime as the API writes it (RFC 3339 with microseconds, UTC)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
