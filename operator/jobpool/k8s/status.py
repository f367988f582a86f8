"""The `.status` of a JobWorkerPool: per-lane replicas and job counts, and conditions (pure).

Conditions: Ready (every lane's Deployment exists and has its replicas ready), Degraded
(the spec is invalid or incomplete, or counting jobs failed), ScalingActive (the last count
succeeded and some lane scales). Every field written here is declared in the CRD.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from jobpool.core.poolspec import Lane, PoolSpec
from jobpool.core.scaling import LaneJobs, ScaleDecision
from jobpool.k8s.manifests import deployment_name

ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Condition:
    """One condition as it should be now (the transition time is filled in by merging)."""

    type: str
    status: ConditionStatus
    reason: str
    message: str


def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(value: object) -> datetime | None:
    """A time written by `timestamp` (or any ISO 8601 time); None if absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None,
    current: Sequence[Condition],
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Conditions for the status: lastTransitionTime moves only when a status flips."""
    before = {str(c.get("type")): c for c in previous or () if isinstance(c, Mapping)}
    merged: list[dict[str, Any]] = []
    for condition in current:
        old = before.get(condition.type)
        if old is not None and old.get("status") == condition.status and old.get(
            "lastTransitionTime"
        ):
            since = str(old["lastTransitionTime"])
        else:
            since = timestamp(now)
        entry: dict[str, Any] = {
            "type": condition.type,
            "status": condition.status,
            "reason": condition.reason,
            "message": condition.message,
            "lastTransitionTime": since,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        merged.append(entry)
    return merged


def invalid_spec_conditions(error: str) -> list[Condition]:
    """Conditions of a pool whose spec cannot run."""
    return [
        Condition("Ready", "False", "InvalidSpec", error),
        Condition("Degraded", "True", "InvalidSpec", error),
        Condition("ScalingActive", "False", "InvalidSpec",
                  "nothing scales until the spec is fixed"),
    ]


def pool_conditions(
    pool: PoolSpec,
    lanes: Sequence[Mapping[str, Any]],
    *,
    count_error: str | None,
    problems: Sequence[str] = (),
) -> list[Condition]:
    """Conditions of a valid pool from its lane statuses and the last counting attempt.

    problems: things that went wrong this round besides counting (e.g. KEDA missing).
    """
    not_ready = [
        str(lane["name"]) for lane in lanes
        if lane.get("currentReplicas") is None
        or int(lane.get("readyReplicas") or 0) < int(lane.get("desiredReplicas") or 0)
    ]
    if not_ready:
        ready = Condition("Ready", "False", "LanesNotReady",
                          f"lanes without their replicas ready: {', '.join(not_ready)}")
    else:
        ready = Condition("Ready", "True", "AllLanesReady", f"{len(lanes)} lanes ready")
    troubles = [*pool.warnings, *problems]
    if count_error:
        degraded = Condition("Degraded", "True", "CountFailed", count_error)
    elif troubles:
        reason = "UnservedKinds" if pool.warnings else "ReconcileProblem"
        degraded = Condition("Degraded", "True", reason, "; ".join(troubles))
    else:
        degraded = Condition("Degraded", "False", "AsExpected", "no problems")
    modes = {lane.autoscaling.mode for lane in pool.lanes}
    if count_error:
        scaling = Condition("ScalingActive", "False", "CountFailed", count_error)
    elif modes <= {"none"}:
        scaling = Condition("ScalingActive", "False", "ScalingDisabled",
                            "every lane has autoscaling mode none")
    else:
        scaling = Condition("ScalingActive", "True", "JobsCounted",
                            "replicas follow the ready and running jobs of each lane")
    return [ready, degraded, scaling]


def lane_status(
    pool: PoolSpec,
    lane: Lane,
    *,
    live: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None,
    jobs: LaneJobs | None = None,
    decision: ScaleDecision | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """One entry of `status.lanes`; counts and scale history carry over from `previous`."""
    old = dict(previous or {})
    entry: dict[str, Any] = {
        "name": lane.name,
        "deployment": deployment_name(pool.name, lane.name),
        "mode": lane.autoscaling.mode,
        "kinds": list(lane.kinds) if lane.kinds is not None else ["*"],
        "excludeKinds": list(lane.exclude_kinds),
        "tenants": list(lane.tenants),
        "minReplicas": lane.min_replicas,
        "maxReplicas": lane.max_replicas,
    }
    for key in ("readyJobs", "runningJobs", "lastScaleTime", "lastScaleReason",
                "lastScaleMessage", "scaleDownSince", "desiredReplicas"):
        if old.get(key) is not None:
            entry[key] = old[key]
    if live is not None:
        spec = live.get("spec") or {}
        state = live.get("status") or {}
        entry["currentReplicas"] = int(spec.get("replicas") or 0)
        entry["readyReplicas"] = int(state.get("readyReplicas") or 0)
        entry["desiredReplicas"] = entry["currentReplicas"]
    if jobs is not None:
        entry["readyJobs"] = jobs.ready
        entry["runningJobs"] = jobs.running
    if decision is not None and now is not None:
        entry["desiredReplicas"] = decision.replicas
        entry.pop("scaleDownSince", None)
        if decision.scale_down_since is not None:
            entry["scaleDownSince"] = timestamp(decision.scale_down_since)
        if live is not None and decision.changes(entry["currentReplicas"]):
            entry["lastScaleTime"] = timestamp(now)
            entry["lastScaleReason"] = decision.reason
            entry["lastScaleMessage"] = decision.message
            entry["currentReplicas"] = decision.replicas
    return entry


def pool_status(
    lanes: Sequence[Mapping[str, Any]],
    conditions: Sequence[Mapping[str, Any]],
    generation: int | None,
    counted_at: datetime | None,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole `.status`: lanes, totals for the printer columns, conditions."""
    status: dict[str, Any] = {
        "lanes": [dict(lane) for lane in lanes],
        "laneCount": len(lanes),
        "replicas": sum(int(lane.get("desiredReplicas") or 0) for lane in lanes),
        "readyReplicas": sum(int(lane.get("readyReplicas") or 0) for lane in lanes),
        "readyJobs": sum(int(lane.get("readyJobs") or 0) for lane in lanes),
        "runningJobs": sum(int(lane.get("runningJobs") or 0) for lane in lanes),
        "conditions": [dict(condition) for condition in conditions],
    }
    if generation is not None:
        status["observedGeneration"] = generation
    elif previous and previous.get("observedGeneration") is not None:
        status["observedGeneration"] = previous["observedGeneration"]
    if counted_at is not None:
        status["lastCountTime"] = timestamp(counted_at)
    return status


def previous_lanes(status: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The lane entries of an existing status, by lane name."""
    lanes = (status or {}).get("lanes") or []
    return {
        str(lane["name"]): lane for lane in lanes if isinstance(lane, Mapping) and "name" in lane
    }
