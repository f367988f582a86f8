"""KEDA mode on a real control plane: with KEDA's own CRDs installed, a keda lane's
ScaledObject and the pool's TriggerAuthentication pass the API server's schema validation
and go when the lane leaves keda mode; without KEDA (not installed, or not granted to the
chart's ServiceAccount), every lane still gets its Deployment and the status says why."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from .conftest import Operator, Tools
from .helpers import (
    CHILDREN,
    KEDA,
    POOL,
    condition,
    deployments,
    described,
    events,
    eventually,
    every_deployment,
    example_pool,
    pools_path,
    reason_of,
    refused_writes,
    role_without,
    with_lane_mode,
)

pytestmark = pytest.mark.controlplane

def keda_objects(release: Tools, namespace: str, resource: str) -> dict[str, dict[str, Any]]:
    path = KEDA.format(namespace=namespace, resource=resource)
    return {item["metadata"]["name"]: item for item in release.plane.admin.items(path)}


def test_keda_lane_gets_a_scaled_object_the_server_accepts_and_loses_it_when_it_leaves(
    release: Tools, namespace: str, keda: None, operator: Operator
) -> None:
    plane = release.plane
    plane.admin.create(pools_path(namespace), with_lane_mode(example_pool(), "acme", "keda"))
    found = eventually(lambda: keda_objects(release, namespace, "scaledobjects"),
                       "a ScaledObject", logs=operator)
    assert set(found) == {f"{POOL}-acme"}
    scaled = found[f"{POOL}-acme"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == f"{POOL}-acme"
    (trigger,) = scaled["spec"]["triggers"]
    assert (trigger["type"], trigger["authenticationRef"]) == (
        "postgresql", {"name": f"{POOL}-dsn"})
    auths = keda_objects(release, namespace, "triggerauthentications")
    assert auths[f"{POOL}-dsn"]["spec"]["secretTargetRef"] == [
        {"parameter": "connection", "name": "jobpool-db", "key": "dsn"}]
    pool = reason_of(plane, namespace, "Reconciled", "ChildrenMatchSpec", operator)
    assert condition(pool, "Degraded")["status"] == "False"
    refused = refused_writes(plane, namespace)
    assert refused == [], described(refused)  # KEDA's schema took both as they were

    plane.admin.patch(f"{pools_path(namespace)}/{POOL}",
                      {"spec": {"lanes": example_pool()["spec"]["lanes"]}})
    eventually(lambda: not keda_objects(release, namespace, "scaledobjects"),
               "the ScaledObject of the lane that left keda mode deleted", logs=operator)
    eventually(lambda: not keda_objects(release, namespace, "triggerauthentications"),
               "the TriggerAuthentication of a pool without keda lanes deleted", logs=operator)
    assert set(deployments(plane, namespace)) == CHILDREN


@pytest.mark.parametrize(("granted", "expected"), [
    (False, "grant its ServiceAccount get, list, create, patch and delete on scaledobjects "
            "and triggerauthentications in API group keda.sh (chart value rbac.keda=true)"),
    (True, "KEDA is not installed"),
], ids=["keda-not-granted", "keda-not-installed"])
def test_keda_lane_without_keda_still_gets_every_deployment_and_says_why(
    release: Tools, namespace: str, request: pytest.FixtureRequest, granted: bool,
    expected: str
) -> None:
    plane = release.plane
    if not granted:  # installed, but the chart's RBAC without rbac.keda
        request.getfixturevalue("keda")
    ungranted = role_without(plane, "keda.sh", {"scaledobjects", "triggerauthentications"})
    with contextlib.nullcontext() if granted else ungranted:
        operator: Operator = request.getfixturevalue("operator")
        plane.admin.create(pools_path(namespace), with_lane_mode(example_pool(), "acme", "keda"))
        every_deployment(plane, namespace, "every lane's Deployment", logs=operator)
        pool = reason_of(plane, namespace, "Reconciled", "KedaUnavailable", operator)
        message = condition(pool, "Reconciled")["message"]
        assert "lanes in keda mode (acme) keep their current replicas" in message
        assert expected in message
        assert condition(pool, "Reconciled")["status"] == "False"
        assert (condition(pool, "Ready")["status"], condition(pool, "Ready")["reason"]) == (
            "False", "KedaUnavailable")
        assert (condition(pool, "Degraded")["status"],
                condition(pool, "Degraded")["reason"]) == ("True", "KedaUnavailable")
        warned = eventually(lambda: [e for e in events(plane, namespace)
                                     if e.get("reason") == "KedaUnavailable"],
                            "a KedaUnavailable Event", logs=operator)
        assert {e["type"] for e in warned} == {"Warning"}
