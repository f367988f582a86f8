"""The reconcile plan: which children of a pool to create, replace or delete (pure).

Replicas belong to the scaler: a replaced Deployment keeps the live replica count, so a
new image or any other template change never resets a lane's scale.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobpool.core.poolspec import PoolSpec
from jobpool.k8s.manifests import (
    LANE_LABEL,
    MANAGED_BY,
    POOL_LABEL,
    TEMPLATE_HASH,
    build_scaled_object,
    build_worker_deployment,
    deployment_name,
)

Verb = Literal["create", "replace", "delete"]
ChildKind = Literal["Deployment", "ScaledObject"]


@dataclass(frozen=True)
class Action:
    """One API call: `verb` the child `kind` called `name`; `body` for create and replace."""

    verb: Verb
    kind: ChildKind
    name: str
    body: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ReconcilePlan:
    """The calls that bring a pool's children to its spec, in a safe order.

    unchanged: names of children already as desired.
    """

    actions: tuple[Action, ...] = ()
    unchanged: tuple[str, ...] = field(default=())

    def of(self, verb: Verb, kind: ChildKind) -> list[str]:
        """Names of the children this plan calls `verb` on."""
        return [a.name for a in self.actions if a.verb == verb and a.kind == kind]


def desired_deployments(pool: PoolSpec, owner: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The Deployment of every lane, by name, with replicas for a first creation."""
    return {
        deployment_name(pool.name, lane.name): build_worker_deployment(
            pool, lane, owner, replicas=lane.min_replicas
        )
        for lane in pool.lanes
    }


def desired_scaled_objects(
    pool: PoolSpec, owner: Mapping[str, Any], count_query: str
) -> dict[str, dict[str, Any]]:
    """The KEDA ScaledObject of every lane with `autoscaling.mode: keda`, by name."""
    return {
        deployment_name(pool.name, lane.name): build_scaled_object(pool, lane, owner, count_query)
        for lane in pool.lanes
        if lane.autoscaling.mode == "keda"
    }


def is_child_of(obj: Mapping[str, Any], pool: str) -> bool:
    """Whether the operator made `obj` for `pool` (by its labels)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(POOL_LABEL) == pool
        and labels.get("app.kubernetes.io/managed-by") == MANAGED_BY
        and LANE_LABEL in labels
    )


def plan_children(
    kind: ChildKind,
    pool: str,
    desired: Mapping[str, Mapping[str, Any]],
    live: Sequence[Mapping[str, Any]],
) -> ReconcilePlan:
    """Plan one kind of child: create the missing, replace the changed, delete the extra.

    live: the objects found (a list call); those not labelled as this pool's are ignored.
    A replace body carries the live resourceVersion (optimistic concurrency) and, for a
    Deployment, the live replicas.
    """
    current = {
        obj["metadata"]["name"]: obj for obj in live if is_child_of(obj, pool)
    }
    actions: list[Action] = []
    unchanged: list[str] = []
    for name, body in sorted(desired.items()):
        found = current.get(name)
        if found is None:
            actions.append(Action("create", kind, name, body))
        elif _hash_of(found) == _hash_of(body):
            unchanged.append(name)
        else:
            actions.append(Action("replace", kind, name, replacement(body, found)))
    actions += [
        Action("delete", kind, name) for name in sorted(current) if name not in desired
    ]
    return ReconcilePlan(tuple(actions), tuple(unchanged))


def plan_reconcile(
    pool: PoolSpec,
    owner: Mapping[str, Any],
    live_deployments: Sequence[Mapping[str, Any]],
    live_scaled_objects: Sequence[Mapping[str, Any]] | None,
    count_query: str,
) -> ReconcilePlan:
    """The whole plan for a pool: Deployments first, then ScaledObjects.

    live_scaled_objects: None when the cluster has no KEDA; then no ScaledObject is
    planned (lanes in keda mode keep their Deployment at its replicas).
    """
    deployments = plan_children("Deployment", pool.name, desired_deployments(pool, owner),
                                live_deployments)
    if live_scaled_objects is None:
        return deployments
    scaled = plan_children("ScaledObject", pool.name,
                           desired_scaled_objects(pool, owner, count_query), live_scaled_objects)
    return ReconcilePlan(
        deployments.actions + scaled.actions, deployments.unchanged + scaled.unchanged
    )


def replacement(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` made ready to replace `live`: live resourceVersion and live replicas kept."""
    body = copy.deepcopy(dict(desired))
    live_meta = live.get("metadata") or {}
    if live_meta.get("resourceVersion"):
        body["metadata"]["resourceVersion"] = live_meta["resourceVersion"]
    if body.get("kind") == "Deployment":
        live_replicas = (live.get("spec") or {}).get("replicas")
        if live_replicas is not None:
            body["spec"]["replicas"] = live_replicas
    return body


def _hash_of(obj: Mapping[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(TEMPLATE_HASH)
    return value if isinstance(value, str) else None
