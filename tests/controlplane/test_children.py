"""What a pool's children go through on a real control plane, and what the operator says
about it: an invalid spec reported and not applied, a child name that another pool or a
person already took left alone, a reconcile the chart's RBAC refuses reported until it
succeeds, a Deployment deleted or edited by hand made right again, a pool deleted while the
operator is down, and a DSN Secret that is missing."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Operator, Tools
from .helpers import (
    CHILDREN,
    KEDA,
    POOL,
    condition,
    deployments,
    deployments_path,
    events,
    eventually,
    every_deployment,
    example_pool,
    pool_object,
    pools_path,
    reason_of,
    role_without,
    with_lane_mode,
)

pytestmark = pytest.mark.controlplane



def warning(release: Tools, namespace: str, reason: str, operator: Operator) -> dict[str, Any]:
    found = eventually(lambda: [e for e in events(release.plane, namespace)
                                if e.get("reason") == reason], f"a {reason} Event",
                       logs=operator)
    return dict(found[0])


def image_of(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def test_invalid_spec_is_reported_not_applied(
    release: Tools, namespace: str, operator: Operator
) -> None:
    document = example_pool()
    document["spec"]["lanes"].append({"name": "mail", "kinds": ["email_send"]})
    document["spec"]["lanes"].append({"name": "mail2", "kinds": ["email_send"]})
    release.plane.admin.create(pools_path(namespace), document)
    pool = reason_of(release.plane, namespace, "Degraded", "InvalidSpec", operator)
    assert "email_send claimed by lanes 'mail' and 'mail2'" in condition(
        pool, "Degraded")["message"]
    assert condition(pool, "Ready")["status"] == "False"
    assert deployments(release.plane, namespace) == {}
    event = warning(release, namespace, "InvalidSpec", operator)
    assert (event["type"], event["involvedObject"]["name"]) == ("Warning", POOL)


@pytest.mark.parametrize("mode", ["operator", "keda"])
def test_child_name_of_another_pool_is_left_alone_and_reported(
    release: Tools, namespace: str, request: pytest.FixtureRequest, mode: str
) -> None:
    # pool mdm with lane jobs-acme and pool mdm-jobs with lane acme both name their lane's
    # Deployment (and ScaledObject) mdm-jobs-acme
    if mode == "keda":
        request.getfixturevalue("keda")
    operator: Operator = request.getfixturevalue("operator")
    plane = release.plane
    first = with_lane_mode(example_pool(), "acme", mode)
    first["metadata"]["name"] = "mdm"
    for lane in first["spec"]["lanes"]:
        lane["name"] = "jobs-acme" if lane["name"] == "acme" else lane["name"]
    plane.admin.create(pools_path(namespace), first)
    reason_of(release.plane, namespace, "Reconciled", "ChildrenMatchSpec", operator, name="mdm")
    taken = [f"{deployments_path(namespace)}/{POOL}-acme"] + (
        [KEDA.format(namespace=namespace, resource="scaledobjects") + f"/{POOL}-acme"]
        if mode == "keda" else [])
    kept = {path: plane.admin.get(path) for path in taken}

    plane.admin.create(pools_path(namespace), with_lane_mode(example_pool(), "acme", mode))
    pool = reason_of(release.plane, namespace, "Degraded", "NameConflict", operator)
    assert ("Deployment 'mdm-jobs-acme' of lane 'acme' belongs to JobWorkerPool 'mdm'"
            in condition(pool, "Degraded")["message"])
    assert (condition(pool, "Ready")["status"], condition(pool, "Reconciled")["status"]) == (
        "False", "False")
    found = deployments(plane, namespace)
    for lane in ("default", "bulk", "heavy"):
        assert found[f"{POOL}-{lane}"]["metadata"]["ownerReferences"][0]["name"] == POOL
    for path, before in kept.items():  # (its status follows its pods: no check of that)
        after = plane.admin.get(path)
        for field in ("generation", "labels", "annotations", "ownerReferences"):
            assert after["metadata"].get(field) == before["metadata"].get(field), (
                f"{before['kind']} metadata.{field} was changed")
        assert after["spec"] == before["spec"], f"{before['kind']} was changed"
    assert condition(pool_object(plane, namespace, "mdm"), "Reconciled")["status"] == "True"

    # once the other pool and its children are gone, a sync makes the lane's own
    plane.admin.delete(f"{pools_path(namespace)}/mdm", propagationPolicy="Foreground")
    pool = reason_of(release.plane, namespace, "Reconciled", "ChildrenMatchSpec", operator)
    assert condition(pool, "Degraded")["status"] == "False"
    acme = deployments(plane, namespace)[f"{POOL}-acme"]
    assert acme["metadata"]["ownerReferences"][0]["name"] == POOL


def test_deployment_made_by_hand_is_left_alone(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    labels = {"app": "legacy-importer"}
    plane.admin.create(deployments_path(namespace), {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{POOL}-bulk", "labels": labels},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                     {"name": "importer", "image": "legacy/importer:1"}]}}}})
    before = deployments(plane, namespace)[f"{POOL}-bulk"]
    plane.admin.create(pools_path(namespace), example_pool())
    pool = reason_of(release.plane, namespace, "Reconciled", "NameConflict", operator)
    assert ("Deployment 'mdm-jobs-bulk' of lane 'bulk' exists and was not made by the jobpool "
            "operator") in condition(pool, "Reconciled")["message"]
    after = deployments(plane, namespace)[f"{POOL}-bulk"]
    assert after["metadata"]["labels"] == labels
    assert after["spec"] == before["spec"]


def test_failed_reconcile_is_reported_and_never_healthy_until_it_succeeds(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    document = example_pool()
    document["spec"]["lanes"][0]["minReplicas"] = 0  # every lane at 0 replicas: all ready
    plane.admin.create(pools_path(namespace), document)
    reason_of(release.plane, namespace, "Ready", "AllLanesReady", operator)
    with role_without(plane, "apps", {"deployments"}, "patch"):
        plane.admin.patch(f"{pools_path(namespace)}/{POOL}", {"spec": {"image": "jobpool:0.2.0"}})
        pool = reason_of(release.plane, namespace, "Ready", "ReconcileFailed", operator)
        message = condition(pool, "Reconciled")["message"]
        assert f"apply Deployment '{POOL}-default' failed: 403 Forbidden" in message
        assert 'cannot patch resource "deployments" in API group "apps"' in message
        assert (condition(pool, "Degraded")["status"], condition(pool, "Degraded")["reason"]) == (
            "True", "ReconcileFailed")
        refused = [w for w in plane.audit_events()
                   if w.get("objectRef", {}).get("namespace") == namespace
                   and w["verb"] == "patch" and w.get("responseStatus", {}).get("code") == 403]
        # every sync tries again, and the status keeps saying so between the attempts
        eventually(lambda: len([w for w in plane.audit_events()
                                if w.get("objectRef", {}).get("namespace") == namespace
                                and w["verb"] == "patch"
                                and w.get("responseStatus", {}).get("code") == 403])
                   >= len(refused) + 2 * 4, "two more attempts (four lanes each)", logs=operator)
        after = pool_object(plane, namespace)
        assert (condition(after, "Ready")["status"], condition(after, "Degraded")["status"]) == (
            "False", "True")
        assert condition(after, "Reconciled")["reason"] == "ReconcileFailed"
    reason_of(release.plane, namespace, "Reconciled", "ChildrenMatchSpec", operator)
    assert {image_of(d) for d in deployments(plane, namespace).values()} == {"jobpool:0.2.0"}
    reason_of(release.plane, namespace, "Ready", "AllLanesReady", operator)


def test_a_deployment_deleted_by_hand_comes_back(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    plane.admin.create(pools_path(namespace), example_pool())
    found = every_deployment(plane, namespace, logs=operator)
    uid = found[f"{POOL}-bulk"]["metadata"]["uid"]
    plane.admin.delete(f"{deployments_path(namespace)}/{POOL}-bulk")

    def recreated() -> dict[str, Any] | None:
        bulk = deployments(plane, namespace).get(f"{POOL}-bulk")
        return bulk if bulk is not None and bulk["metadata"]["uid"] != uid else None

    eventually(recreated, "mdm-jobs-bulk made again", logs=operator)
    # the lane's minReplicas, not the server's default 1 (which the scaler would keep for
    # the lane's 300 s scale-down window)
    eventually(lambda: deployments(plane, namespace)[f"{POOL}-bulk"]["spec"]["replicas"] == 0,
               "mdm-jobs-bulk at its lane's minReplicas 0", logs=operator)


def test_a_pool_deleted_and_made_again_under_its_name_owns_its_children_alone(
    release: Tools, namespace: str, operator: Operator
) -> None:
    """Deleted and created again at once (a `kubectl replace --force`, a GitOps tool): the
    garbage collector may still be collecting the old pool's Deployments while the new
    pool's sync applies the same names. Each ends owned by the new pool alone, with no
    Deployment of the old one left, and the new pool reports ready."""
    plane = release.plane
    plane.admin.create(pools_path(namespace), example_pool())
    every_deployment(plane, namespace, logs=operator)
    old = (pool_object(plane, namespace) or {})["metadata"]["uid"]
    plane.admin.delete(f"{pools_path(namespace)}/{POOL}")
    eventually(lambda: pool_object(plane, namespace) is None, "the pool deleted")
    plane.admin.create(pools_path(namespace), example_pool())
    new = (pool_object(plane, namespace) or {})["metadata"]["uid"]
    assert new != old

    def owned_by_the_new_pool() -> dict[str, dict[str, Any]] | None:
        current = deployments(plane, namespace)
        owners = {name: [ref["uid"] for ref in d["metadata"].get("ownerReferences") or []]
                  for name, d in current.items()}
        return current if set(current) == CHILDREN and all(
            uids == [new] for uids in owners.values()) else None

    eventually(owned_by_the_new_pool, "every Deployment owned by the new pool alone",
               logs=operator)
    reason_of(plane, namespace, "Ready", "AllLanesReady", operator)
    assert set(deployments(plane, namespace)) == CHILDREN  # none collected after the fact


def test_an_image_changed_by_hand_is_restored(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    plane.admin.create(pools_path(namespace), example_pool())
    eventually(lambda: f"{POOL}-acme" in deployments(plane, namespace), "mdm-jobs-acme",
               logs=operator)
    release.kubectl("set", "image", "-n", namespace, f"deployment/{POOL}-acme",
                    "worker=evil/miner:latest")
    assert image_of(deployments(plane, namespace)[f"{POOL}-acme"]) == "evil/miner:latest"
    eventually(lambda: image_of(deployments(plane, namespace)[f"{POOL}-acme"])
               == "jobpool:0.1.0", "the pool's image back on mdm-jobs-acme", logs=operator)


def test_a_pool_deleted_while_the_operator_is_down_takes_its_children(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    plane.admin.create(pools_path(namespace), example_pool())
    reason_of(release.plane, namespace, "Reconciled", "ChildrenMatchSpec", operator)
    operator.stop()
    pool = pool_object(plane, namespace)
    assert pool is not None and "finalizers" not in pool["metadata"]
    plane.admin.delete(f"{pools_path(namespace)}/{POOL}")
    assert pool_object(plane, namespace) is None  # no finalizer waits for the operator
    eventually(lambda: not deployments(plane, namespace),
               "the garbage collector to take the Deployments")


def test_missing_secret_degrades_scaling(
    release: Tools, namespace: str, operator: Operator
) -> None:
    document = example_pool()
    document["spec"]["database"]["secretName"] = "no-such-secret"
    release.plane.admin.create(pools_path(namespace), document)
    every_deployment(release.plane, namespace, "the Deployments despite the missing Secret",
                     logs=operator)
    pool = reason_of(release.plane, namespace, "Degraded", "CountFailed", operator)
    assert "'no-such-secret'" in condition(pool, "Degraded")["message"]
    assert condition(pool, "ScalingActive")["status"] == "False"


