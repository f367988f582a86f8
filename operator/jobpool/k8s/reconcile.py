"""The reconcile plan: which children of a pool to apply or delete (pure).

A child is applied (server-side apply) when it is missing, when the operator's template
hash on it differs from the spec's, or when a field the operator sets has another value
live (changed by hand: drift, as k8s.drift compares it: what other field managers add is
theirs, quantities count by value), or when the scaler still owns more of a Deployment than
its replicas (k8s.ownership). Replicas belong to the scaler and are never in a plan, so a
new image or any other template change never resets a lane's scale.

A child name can be taken by an object the pool does not own (pool `mdm` with lane
`jobs-acme` and pool `mdm-jobs` with lane `acme` both want `mdm-jobs-acme`, or a
Deployment made by hand): the plan leaves such an object alone, never adopting or
overwriting it, and reports a Conflict that names its owner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobpool.core.crd import GROUP, KIND
from jobpool.core.poolspec import PoolSpec
from jobpool.k8s.drift import in_sync
from jobpool.k8s.manifests import (
    LANE_LABEL,
    MANAGED_BY,
    POOL_LABEL,
    SCALED_BY,
    TEMPLATE_HASH,
    build_scaled_object,
    build_trigger_authentication,
    build_worker_deployment,
    deployment_name,
)
from jobpool.k8s.ownership import SCALER, scaler_owns_more

Verb = Literal["apply", "delete"]
ChildKind = Literal["Deployment", "ScaledObject", "TriggerAuthentication"]


@dataclass(frozen=True)
class Action:
    """One API call: `verb` the child `kind` called `name`; `body` to apply.

    creates: the child is missing (a new Deployment then gets its lane's first replicas).
    seen: the resourceVersion of the live child the plan compared (None if it is missing):
    an apply answered with the same one changed nothing on the server.
    """

    verb: Verb
    kind: ChildKind
    name: str
    body: Mapping[str, Any] | None = None
    creates: bool = False
    seen: str | None = None


@dataclass(frozen=True)
class Conflict:
    """A child name of lane `lane` taken by an object that `holder` owns; left alone.

    holder: e.g. "JobWorkerPool 'mdm'", or None for an object nothing owns that the
    operator did not make (a Deployment created by hand).
    """

    kind: ChildKind
    name: str
    lane: str | None
    holder: str | None

    @property
    def message(self) -> str:
        """What happened and what to do, for the pool's status (lane None: the pool's)."""
        owner = (f"belongs to {self.holder}" if self.holder
                 else "exists and was not made by the jobpool operator")
        if self.lane is None:
            return (f"{self.kind} {self.name!r} of the pool {owner}; it is left alone and the "
                    "pool's keda lanes have none here: rename this pool")
        return (f"{self.kind} {self.name!r} of lane {self.lane!r} {owner}; it is left alone "
                "and the lane has no such child here: rename this pool or the lane")


@dataclass(frozen=True)
class ReconcilePlan:
    """The calls that bring a pool's children to its spec, in a safe order.

    unchanged: names of children already as desired. conflicts: child names held by
    objects the pool does not own, for which nothing is planned.
    """

    actions: tuple[Action, ...] = ()
    unchanged: tuple[str, ...] = field(default=())
    conflicts: tuple[Conflict, ...] = field(default=())

    def of(self, verb: Verb, kind: ChildKind) -> list[str]:
        """Names of the children this plan calls `verb` on."""
        return [a.name for a in self.actions if a.verb == verb and a.kind == kind]


def desired_deployments(pool: PoolSpec, owner: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The Deployment of every lane, by name (without replicas)."""
    return {
        deployment_name(pool.name, lane.name): build_worker_deployment(pool, lane, owner)
        for lane in pool.lanes
    }


def desired_trigger_authentications(
    pool: PoolSpec, owner: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """The pool's TriggerAuthentication by name, if a lane is in keda mode."""
    if not any(lane.autoscaling.mode == "keda" for lane in pool.lanes):
        return {}
    body = build_trigger_authentication(pool, owner)
    return {body["metadata"]["name"]: body}


def desired_scaled_objects(
    pool: PoolSpec, owner: Mapping[str, Any], count_query: str
) -> dict[str, dict[str, Any]]:
    """The KEDA ScaledObject of every lane with `autoscaling.mode: keda`, by name."""
    return {
        deployment_name(pool.name, lane.name): build_scaled_object(pool, lane, owner, count_query)
        for lane in pool.lanes
        if lane.autoscaling.mode == "keda"
    }


def holder_of(obj: Mapping[str, Any]) -> str | None:
    """Who owns `obj`: its controller ("JobWorkerPool 'mdm'", "Rollout.argoproj.io 'x'"),
    else the pool its operator labels name (an orphan), else None."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            kind = str(ref.get("kind"))
            group = str(ref.get("apiVersion") or "").rpartition("/")[0]
            if group and (kind, group) != (KIND, GROUP):
                kind = f"{kind}.{group}"
            return f"{kind} {ref.get('name')!r}"
    labels = meta.get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and labels.get(POOL_LABEL):
        return f"{KIND} {labels[POOL_LABEL]!r}"
    return None


def belongs_to(obj: Mapping[str, Any], pool: str) -> bool:
    """Whether `obj` is pool `pool`'s to change: controlled by it, or its orphan.

    An orphan (operator labels naming the pool, no controller, e.g. after a delete with
    --cascade=orphan) is adopted: its replacement carries the pool's ownerReference.
    """
    return holder_of(obj) == f"{KIND} {pool!r}"


def plan_children(
    kind: ChildKind,
    pool: str,
    desired: Mapping[str, Mapping[str, Any]],
    live: Sequence[Mapping[str, Any]],
) -> ReconcilePlan:
    """Plan one kind of child: apply the missing and the changed, delete the extra.

    live: the objects found, the pool's own (a list call) and whatever holds a desired
    name; those that do not belong to the pool are never changed. A child whose template
    hash differs, or whose live fields differ from the desired ones (a hand edit, a missing
    ownerReference), is applied again (so an orphan is adopted and drift is repaired), and
    so is a Deployment whose scaler still owns more than its replicas (`k8s.ownership`:
    created before its ownership was handed over).
    """
    found = {obj["metadata"]["name"]: obj for obj in live}
    actions: list[Action] = []
    unchanged: list[str] = []
    conflicts: list[Conflict] = []
    for name, body in sorted(desired.items()):
        current = found.get(name)
        if current is None:
            actions.append(Action("apply", kind, name, body, creates=True))
        elif not belongs_to(current, pool):
            lane = body["metadata"]["labels"].get(LANE_LABEL)
            conflicts.append(Conflict(kind, name, lane, holder_of(current)))
        elif (_hash_of(current) == _hash_of(body) and in_sync(current, body)
              and not scaler_owns_more(_managed_fields(current), scaler=SCALER)):
            unchanged.append(name)
        else:
            actions.append(Action("apply", kind, name, body, seen=_version_of(current)))
    actions += [
        Action("delete", kind, name) for name, obj in sorted(found.items())
        if name not in desired and belongs_to(obj, pool)
    ]
    return ReconcilePlan(tuple(actions), tuple(unchanged), tuple(conflicts))


def _managed_fields(obj: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return (obj.get("metadata") or {}).get("managedFields") or ()


def touches_keda(pool: PoolSpec, live_deployments: Sequence[Mapping[str, Any]]) -> bool:
    """Whether reconcile must read ScaledObjects: a lane is in keda mode, or a Deployment of
    the pool was made for one (its ScaledObject must go). Others never call KEDA's API,
    which the chart's default RBAC does not grant."""
    return any(lane.autoscaling.mode == "keda" for lane in pool.lanes) or any(
        belongs_to(obj, pool.name)
        and ((obj.get("metadata") or {}).get("annotations") or {}).get(SCALED_BY) == "keda"
        for obj in live_deployments
    )


@dataclass(frozen=True)
class KedaChildren:
    """The live KEDA objects a pool's plan works with."""

    scaled_objects: Sequence[Mapping[str, Any]] = ()
    trigger_authentications: Sequence[Mapping[str, Any]] = ()


def plan_reconcile(
    pool: PoolSpec,
    owner: Mapping[str, Any],
    live_deployments: Sequence[Mapping[str, Any]],
    live_keda: KedaChildren | None,
    count_query: str,
) -> ReconcilePlan:
    """The whole plan for a pool: ScaledObject deletions, Deployments, the
    TriggerAuthentication, ScaledObjects, then a TriggerAuthentication deletion.

    live_keda: None when KEDA is not touched or not available; then nothing of KEDA is
    planned (lanes in keda mode keep their Deployment at its replicas). A lane whose
    Deployment name is taken gets no ScaledObject: it would scale the other owner's
    Deployment.
    """
    deployments = plan_children("Deployment", pool.name, desired_deployments(pool, owner),
                                live_deployments)
    if live_keda is None:
        return deployments
    taken = {conflict.name for conflict in deployments.conflicts}
    desired = {
        name: body for name, body in desired_scaled_objects(pool, owner, count_query).items()
        if name not in taken
    }
    scaled = plan_children("ScaledObject", pool.name, desired, live_keda.scaled_objects)
    auth = plan_children("TriggerAuthentication", pool.name,
                         desired_trigger_authentications(pool, owner),
                         live_keda.trigger_authentications)
    if auth.conflicts:  # without its TriggerAuthentication a ScaledObject cannot count
        scaled = ReconcilePlan(tuple(a for a in scaled.actions if a.verb == "delete"),
                               scaled.unchanged, scaled.conflicts)

    def of(plan: ReconcilePlan, verb: Verb) -> tuple[Action, ...]:
        return tuple(a for a in plan.actions if a.verb == verb)

    return ReconcilePlan(
        of(scaled, "delete") + deployments.actions + of(auth, "apply") + of(scaled, "apply")
        + of(auth, "delete"),
        deployments.unchanged + auth.unchanged + scaled.unchanged,
        deployments.conflicts + auth.conflicts + scaled.conflicts,
    )


def _version_of(obj: Mapping[str, Any]) -> str | None:
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


def _hash_of(obj: Mapping[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(TEMPLATE_HASH)
    return value if isinstance(value, str) else None
