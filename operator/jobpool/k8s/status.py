"""The `.status` of a JobWorkerPool: per-lane replicas and job counts, and conditions (pure).

Conditions: Ready (reconciled, and every lane's Deployment has its replicas ready), Degraded
(something needs a human: the spec is invalid or incomplete, reconciling or counting jobs
failed), ScalingActive (the last count succeeded and some lane scales), Reconciled (the
pool's children match its spec). Every field written here is declared in the CRD.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from jobpool.core.poolspec import Lane, PoolSpec, Problem
from jobpool.core.scaling import LaneJobs, ScaleDecision
from jobpool.core.schedules import former_owners, schedule_owner
from jobpool.k8s.manifests import deployment_name

ConditionStatus = Literal["True", "False", "Unknown"]
KEDA_RULE = (
    "get, list, create, patch and delete on scaledobjects and triggerauthentications in API "
    "group keda.sh (chart value rbac.keda=true)"
)
"""What the operator's ServiceAccount needs for lanes in keda mode."""


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
        Condition("Reconciled", "False", "InvalidSpec",
                  "nothing is applied until the spec is fixed"),
    ]


def pool_conditions(
    pool: PoolSpec,
    lanes: Sequence[Mapping[str, Any]],
    *,
    count_error: str | None,
    problems: Sequence[Problem] = (),
    schedules: Sequence[Mapping[str, Any]] = (),
) -> list[Condition]:
    """Conditions of a valid pool from its lane statuses, reconcile problems and last count.

    problems: why the last reconcile left children unlike the spec (a failed call, a child
    name held by another object, KEDA unavailable). Any problem makes the pool not Ready
    and Degraded: the Deployments running are not the ones the spec asks for. schedules:
    the `schedule_status` entries; one another pool declared makes the pool Degraded (its
    workers declare none of its schedules until a human renames one of the two).
    """
    joined = "; ".join(problem.message for problem in problems)
    if problems:
        reconciled = Condition("Reconciled", "False", problems[0].reason, joined)
    else:
        reconciled = Condition("Reconciled", "True", "ChildrenMatchSpec",
                               "every lane's children match the spec")
    clashes = [Problem("ScheduleDeclaredElsewhere", schedule_clash(entry))
               for entry in schedules if entry.get("declaredBy") is not None]
    return [_ready(lanes, problems, joined),
            _degraded(pool, count_error, [*problems, *clashes]),
            _scaling(pool, count_error), reconciled]


def schedule_clash(entry: Mapping[str, Any]) -> str:
    """What a `status.schedules` entry with `declaredBy` means, for the Degraded condition."""
    return (f"schedule {entry['name']!r} is declared by pool {entry['declaredBy']!r}: this "
            "pool's workers declare none of its schedules until it is renamed in one pool or "
            "dropped from the other")


def _ready(
    lanes: Sequence[Mapping[str, Any]], problems: Sequence[Problem], joined: str
) -> Condition:
    if problems:
        return Condition("Ready", "False", problems[0].reason, joined)
    not_ready = [
        str(lane["name"]) for lane in lanes
        if lane.get("currentReplicas") is None
        or int(lane.get("readyReplicas") or 0) < int(lane.get("desiredReplicas") or 0)
    ]
    if not_ready:
        return Condition("Ready", "False", "LanesNotReady",
                         f"lanes without their replicas ready: {', '.join(not_ready)}")
    return Condition("Ready", "True", "AllLanesReady", f"{len(lanes)} lanes ready")


def _degraded(pool: PoolSpec, count_error: str | None, problems: Sequence[Problem]) -> Condition:
    troubles = [*problems]
    if count_error:
        troubles.append(Problem("CountFailed", count_error))
    troubles += pool.warnings
    if not troubles:
        return Condition("Degraded", "False", "AsExpected", "no problems")
    return Condition("Degraded", "True", troubles[0].reason,
                     "; ".join(trouble.message for trouble in troubles))


def _scaling(pool: PoolSpec, count_error: str | None) -> Condition:
    if count_error:
        return Condition("ScalingActive", "False", "CountFailed", count_error)
    if {lane.autoscaling.mode for lane in pool.lanes} <= {"none"}:
        return Condition("ScalingActive", "False", "ScalingDisabled",
                         "every lane has autoscaling mode none")
    return Condition("ScalingActive", "True", "JobsCounted",
                     "replicas follow the ready and running jobs of each lane")


def condition_of(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    """The condition of type `kind` in a written status; {} if there is none."""
    for condition in (status or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return {}


def previous_count_error(status: Mapping[str, Any] | None) -> str | None:
    """The error of the last job count, as written in ScalingActive; None if it worked."""
    scaling = condition_of(status, "ScalingActive")
    return str(scaling.get("message")) if scaling.get("reason") == "CountFailed" else None


def keda_unavailable(
    pool: PoolSpec, namespace: str, http_status: int, detail: str
) -> Problem | None:
    """The problem of a cluster whose API refused to list ScaledObjects; None if harmless.

    http_status: 404 (KEDA is not installed) or 403 (the operator may not read them; a real
    API server answers 403 before it looks for the API, so also where KEDA is missing).
    Without lanes in keda mode a 404 is harmless (there is nothing of KEDA to clean up).
    """
    lanes = [lane.name for lane in pool.lanes if lane.autoscaling.mode == "keda"]
    if lanes:
        effect = f"lanes in keda mode ({', '.join(lanes)}) keep their current replicas"
    elif http_status == 404:
        return None
    else:
        effect = "ScaledObjects of lanes that left keda mode cannot be removed"
    if http_status == 404:
        return Problem("KedaUnavailable",
                       f"KEDA is not installed (no API scaledobjects.keda.sh/v1alpha1): {effect}")
    return Problem(
        "KedaUnavailable",
        f"the operator may not list KEDA ScaledObjects in namespace {namespace!r} ({detail}): "
        f"{effect}; grant its ServiceAccount {KEDA_RULE}",
    )


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
    for key in ("readyJobs", "readyJobsShown", "runningJobs", "lastScaleTime", "lastScaleReason",
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
        entry["readyJobsShown"] = f"≥ {jobs.ready:,}" if jobs.capped else f"{jobs.ready:,}"
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


def schedule_status(pool: PoolSpec, runs: Sequence[Mapping[str, Any]] | None,
                    previous: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """`status.schedules`: each declared schedule with its last and next run from `runs`
    (`schedule_runs` rows read for the pool's owner, `core.schedules.schedule_owner`; None
    when they could not be read: the previous entries carry over). A schedule no worker of
    the pool declared yet has neither (also one still under the pool's former owner name,
    which its workers take over when they start); one another pool declared has `declaredBy`,
    that pool's owner, and never that pool's runs."""
    owner = schedule_owner(pool.name, pool.namespace)
    former = former_owners(pool.name, pool.namespace)
    old = {str(e.get("name")): e for e in (previous or {}).get("schedules") or ()
           if isinstance(e, Mapping)}
    found = {str(row["name"]): row for row in runs or ()}
    entries: list[dict[str, Any]] = []
    for schedule in pool.schedules:
        entry: dict[str, Any] = {"name": schedule.name, "kind": schedule.kind,
                                 "expression": schedule.expression}
        row = found.get(schedule.name)
        if row is not None and row["owner"] != owner:
            if row["owner"] not in former:
                entry["declaredBy"] = str(row["owner"])
        elif row is not None:
            entry.update(
                lastRunTime=timestamp(row["last_run_at"]) if row["last_run_at"] else None,
                nextRunTime=timestamp(row["next_run_at"]),
                missedTicks=int(row["missed_total"]), lastError=row["last_error"])
        elif runs is None and schedule.name in old:
            entry = {**old[schedule.name], **entry}
        entries.append(entry)
    return entries


def pool_status(
    lanes: Sequence[Mapping[str, Any]],
    conditions: Sequence[Mapping[str, Any]],
    generation: int | None,
    counted_at: datetime | None,
    previous: Mapping[str, Any] | None = None,
    schedules: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The whole `.status`: lanes, totals for the printer columns, conditions, and the
    schedules (`schedule_status`; left out when the pool has none)."""
    status: dict[str, Any] = {
        "lanes": [dict(lane) for lane in lanes],
        "laneCount": len(lanes),
        "replicas": sum(int(lane.get("desiredReplicas") or 0) for lane in lanes),
        "readyReplicas": sum(int(lane.get("readyReplicas") or 0) for lane in lanes),
        "readyJobs": sum(int(lane.get("readyJobs") or 0) for lane in lanes),
        "runningJobs": sum(int(lane.get("runningJobs") or 0) for lane in lanes),
        "conditions": [dict(condition) for condition in conditions],
    }
    if schedules or (previous or {}).get("schedules"):
        status["schedules"] = [dict(entry) for entry in schedules]
    if generation is not None:
        status["observedGeneration"] = generation
    elif previous and previous.get("observedGeneration") is not None:
        status["observedGeneration"] = previous["observedGeneration"]
    if counted_at is not None:
        status["lastCountTime"] = timestamp(counted_at)
    return status


def status_changed(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> bool:
    """Whether writing `status` over `previous` changes anything but `lastCountTime`.

    The time of the last count moves on every count; alone it is no reason to write (an idle
    pool would cost a write, and a watch event for every client, each interval). So
    `lastCountTime` is the time of the count behind the figures shown.
    """
    def without_time(value: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (value or {}).items() if k != "lastCountTime"}

    return without_time(previous) != without_time({**(previous or {}), **status})


def previous_lanes(status: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    """The lane entries of an existing status, by lane name."""
    lanes = (status or {}).get("lanes") or []
    return {
        str(lane["name"]): lane for lane in lanes if isinstance(lane, Mapping) and "name" in lane
    }
