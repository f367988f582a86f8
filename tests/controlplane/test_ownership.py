"""Who owns a lane's Deployment's fields, on a real API server: the operator's apply owns
what it applies, the scaler only the replicas, so that a field dropped from the pool leaves
the pods (server-side apply removes a field only when no other manager owns it), also on a
Deployment created by an earlier version, and a lane that leaves keda mode stops calling
KEDA's API."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from jobpool.k8s.ownership import REPLICAS, SCALER

from .conftest import Operator, Tools
from .helpers import (
    POOL,
    condition,
    deployments,
    deployments_path,
    described,
    eventually,
    every_deployment,
    example_pool,
    operator_writes,
    pool_object,
    pools_path,
    reason_of,
    role_without,
    with_lane_mode,
)

pytestmark = pytest.mark.controlplane

DEFAULT = f"{POOL}-default"


def env_of(deployment: dict[str, Any]) -> dict[str, str | None]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value") for item in container.get("env") or ()}


def scaler_fields(deployment: dict[str, Any]) -> list[Any]:
    return [entry["fieldsV1"] for entry in deployment["metadata"]["managedFields"]
            if entry["manager"] == SCALER and not entry.get("subresource")]


def reconciled_at(release: Tools, namespace: str, generation: int, operator: Operator) -> None:
    def check() -> bool:
        pool = pool_object(release.plane, namespace) or {}
        return (condition(pool, "Reconciled").get("status") == "True"
                and (pool.get("status") or {}).get("observedGeneration", 0) >= generation)

    eventually(check, f"the pool reconciled at generation {generation}", logs=operator)


def replace_spec(release: Tools, namespace: str, spec: dict[str, Any]) -> int:
    path = f"{pools_path(namespace)}/{POOL}"
    pool = release.plane.admin.get(path)
    pool["spec"] = spec
    return int(release.plane.admin.request("PUT", path, pool)["metadata"]["generation"])


def test_a_field_dropped_from_the_pool_leaves_its_deployments(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    document = example_pool()
    document["spec"]["worker"]["env"] = [{"name": "FEATURE_X", "value": "on"}]
    document["spec"]["worker"]["nodeSelector"] = {"disk": "ssd"}
    assert document["spec"]["lanes"][0]["name"] == "default"
    assert document["spec"]["lanes"][0]["rateLimits"]
    plane.admin.create(pools_path(namespace), document)
    every_deployment(plane, namespace, logs=operator)
    reconciled_at(release, namespace, 1, operator)
    created = deployments(plane, namespace)[DEFAULT]
    assert {"FEATURE_X", "JOBPOOL_RATE_LIMITS"} <= set(env_of(created))
    assert scaler_fields(created) == [REPLICAS]
    # the hand-over's second apply changed no pod: one rollout since the creation
    assert created["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    replicas = created["spec"]["replicas"]

    spec = copy.deepcopy(document["spec"])
    del spec["worker"]["env"], spec["worker"]["nodeSelector"], spec["lanes"][0]["rateLimits"]
    reconciled_at(release, namespace, replace_spec(release, namespace, spec), operator)
    changed = deployments(plane, namespace)[DEFAULT]
    assert not {"FEATURE_X", "JOBPOOL_RATE_LIMITS"} & set(env_of(changed)), env_of(changed)
    assert "nodeSelector" not in changed["spec"]["template"]["spec"]
    assert changed["spec"]["replicas"] == replicas


def test_a_deployment_an_earlier_version_created_is_handed_over_once(
    release: Tools, namespace: str, operator: Operator
) -> None:
    """Earlier versions left the scaler owning the whole Deployment; a variable the scaler
    owns alone stands for what such a Deployment kept of a pool's earlier spec."""
    plane = release.plane
    plane.admin.create(pools_path(namespace), example_pool())
    every_deployment(plane, namespace, logs=operator)
    reconciled_at(release, namespace, 1, operator)
    container = {"name": "worker", "env": [{"name": "STALE", "value": "1"}]}
    plane.admin.patch(f"{deployments_path(namespace)}/{DEFAULT}",
                      {"spec": {"template": {"spec": {"containers": [container]}}}},
                      kind="strategic", params={"fieldManager": SCALER})
    assert "STALE" in env_of(deployments(plane, namespace)[DEFAULT])
    eventually(lambda: "STALE" not in env_of(deployments(plane, namespace)[DEFAULT]),
               "the variable only the scaler owned removed", logs=operator)
    assert scaler_fields(deployments(plane, namespace)[DEFAULT]) == [REPLICAS]
    time.sleep(3)  # the sync that removed it ends
    before = len(operator_writes(plane, namespace))
    time.sleep(10)  # ten syncs: once handed over, the Deployment is left alone
    new = [w for w in operator_writes(plane, namespace)[before:]
           if w.get("objectRef", {}).get("resource") == "deployments"]
    assert new == [], described(new)


def test_a_lane_that_left_keda_mode_stops_calling_keda_without_its_rbac(
    release: Tools, namespace: str, operator: Operator
) -> None:
    """The annotation that marks a keda lane's Deployment goes with the mode, so the
    operator no longer needs KEDA's API for the pool (the chart's default RBAC has none)."""
    plane = release.plane
    with role_without(plane, "keda.sh", {"scaledobjects", "triggerauthentications"}):
        document = with_lane_mode(example_pool(), "bulk", "keda")
        plane.admin.create(pools_path(namespace), document)
        every_deployment(plane, namespace, logs=operator)
        reason_of(plane, namespace, "Reconciled", "KedaUnavailable", operator)
        spec = with_lane_mode(document, "bulk", "operator")["spec"]
        reconciled_at(release, namespace, replace_spec(release, namespace, spec), operator)
        annotations = deployments(plane, namespace)[f"{POOL}-bulk"]["metadata"]["annotations"]
        assert "jobs.mdm.io/scaled-by" not in annotations
