"""Leader election on a coordination.k8s.io/v1 Lease (pure): what a replica does next.

One replica leads: it renews the Lease every `renew_every` seconds; the others wait. When the
leader stops renewing (it crashed, or lost the API), a standby takes the Lease once
`duration` seconds passed since the last renewal. A leader that could not renew for
`renew_deadline` seconds stops acting before anyone may take over (renew_deadline <
duration), so two replicas never act at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from jobpool.k8s.status import parse_timestamp

LEASE_NAME = "jobpool-operator"


@dataclass(frozen=True)
class LeaseTiming:
    """Seconds: how long a Lease holds, how often the leader renews it, how long a leader
    may fail to renew before it stops acting, how often a standby looks."""

    duration: float = 15.0
    renew_every: float = 5.0
    renew_deadline: float = 10.0
    retry_every: float = 2.0


Move = Literal["create", "renew", "take", "wait"]


def next_move(lease: Mapping[str, Any] | None, me: str, now: datetime) -> Move:
    """What replica `me` does with the Lease as read at `now` (None: there is none).

    create: there is none; renew: `me` holds it; take: nobody holds it or its holder let it
    expire; wait: another replica holds it.
    """
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if holder == me:
        return "renew"
    renewed = parse_timestamp(spec.get("renewTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not holder or renewed is None or renewed + timedelta(seconds=duration) < now:
        return "take"
    return "wait"


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
    spec.update(holderIdentity=me, leaseDurationSeconds=int(timing.duration), renewTime=stamp)
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
