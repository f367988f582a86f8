"""The chart and the operator on a real control plane: helm install, the CRD, the example
pool applied with kubectl, its Deployments rolled out under the restricted Pod Security
level, status and Events, scaling from PostgreSQL, and garbage collection."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import yaml

from jobpool.core.crd import API_VERSION

from .conftest import Operator, Tools, crd_established
from .helpers import (
    LANES,
    OPERATOR_USER,
    POOL,
    ROOT,
    condition,
    deployments,
    deployments_path,
    described,
    events,
    eventually,
    operator_writes,
    pods,
    pool_object,
    pools_path,
)

pytestmark = pytest.mark.controlplane

CHILDREN = {f"{POOL}-{lane}" for lane in LANES}


def apply_example(tools: Tools, namespace: str, operator: Operator) -> dict[str, Any]:
    tools.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "pool.yaml"))

    def created() -> dict[str, Any] | None:
        found = deployments(tools.plane, namespace)
        return found if set(found) == CHILDREN else None

    return dict(eventually(created, f"Deployments {sorted(CHILDREN)}", logs=operator))


def test_chart_installs_the_crd_and_the_operators_account(release: Tools) -> None:
    assert crd_established(release.plane)
    listed = release.helm("list", "-n", "jobpool-system", "-o", "yaml").stdout
    (entry,) = yaml.safe_load(listed)
    assert entry["status"] == "deployed"
    account = release.plane.admin.get(
        "/api/v1/namespaces/jobpool-system/serviceaccounts/jp-jobpool")
    assert account is not None


def test_example_pool_rolls_out_under_restricted_pod_security(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    found = apply_example(release, namespace, operator)
    pool = pool_object(plane, namespace)
    assert pool is not None
    for name, deployment in found.items():
        assert deployment["metadata"]["ownerReferences"] == [{
            "apiVersion": API_VERSION, "kind": "JobWorkerPool", "name": POOL,
            "uid": pool["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
        }], name
    container = found[f"{POOL}-heavy"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "jobpool:0.1.0"
    assert container["args"] == ["run", "--slots", "1", "--grace", "30", "--kinds",
                                 "gin_backfill,index_sync"]
    assert found[f"{POOL}-default"]["spec"]["replicas"] == 1  # minReplicas

    def default_lane_ready() -> bool:
        status = deployments(plane, namespace)[f"{POOL}-default"].get("status") or {}
        return status.get("readyReplicas") == 1

    eventually(default_lane_ready, "the default lane's pod to be ready", logs=operator)
    (pod,) = pods(plane, namespace)
    assert pod["status"]["phase"] == "Running"  # admitted under "restricted", then scheduled
    refused = [e for e in events(plane, namespace) if e.get("reason") == "FailedCreate"]
    assert refused == [], [e["message"] for e in refused]

    def ready() -> dict[str, Any] | None:
        # Ready follows the lane's ready pod at the next sync after it
        found_pool = pool_object(plane, namespace)
        ok = all(condition(found_pool, kind).get("status") == "True"
                 for kind in ("Reconciled", "Ready"))
        return found_pool if ok and (found_pool or {}).get("status", {}).get("lanes") else None

    status = eventually(ready, "a Reconciled and Ready status", logs=operator)["status"]
    assert status["observedGeneration"] == 1
    assert condition({"status": status}, "Degraded").get("status") != "True", status
    reasons = [e["reason"] for e in events(plane, namespace)
               if e["involvedObject"].get("kind") == "JobWorkerPool"]
    assert "Reconciled" in reasons
    assert all(e["type"] == "Normal" for e in events(plane, namespace)
               if e["involvedObject"].get("kind") == "JobWorkerPool"
               and e["reason"] == "Reconciled")


def test_pending_jobs_scale_a_lane_through_the_scale_subresource(
    release: Tools, namespace: str, operator: Operator, dsn: str
) -> None:
    plane = release.plane
    apply_example(release, namespace, operator)
    with psycopg.connect(dsn, autocommit=True) as conn:
        tenant = conn.execute(
            "INSERT INTO mdm.aa_tenant (key) VALUES ('scaling') RETURNING id").fetchone()
        assert tenant is not None
        conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('reindex') "
                     "ON CONFLICT DO NOTHING")
        conn.execute(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, status, max_attempts) "
            "SELECT %s, 'reindex', 'pending', 3 FROM generate_series(1, 5)", (tenant[0],))

    def bulk_scaled() -> int:
        replicas = int(deployments(plane, namespace)[f"{POOL}-bulk"]["spec"]["replicas"])
        return replicas if replicas >= 3 else 0

    # bulk: 2 workers a pod, 5 pending jobs: 3 pods (maxReplicas 4)
    assert eventually(bulk_scaled, "the bulk lane scaled up", logs=operator) == 3
    scale_writes = [w for w in operator_writes(plane, namespace)
                    if w["objectRef"].get("name") == f"{POOL}-bulk"
                    and w["objectRef"].get("subresource") == "scale"]
    assert scale_writes, described(operator_writes(plane, namespace))
    assert all(w["user"]["username"] == OPERATOR_USER for w in scale_writes)


def test_deleting_the_pool_garbage_collects_its_children(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    apply_example(release, namespace, operator)
    eventually(lambda: pods(plane, namespace), "a worker pod", logs=operator)
    plane.admin.delete(f"{pools_path(namespace)}/{POOL}")
    # the garbage collector of kube-controller-manager, asynchronously
    eventually(lambda: not plane.admin.items(deployments_path(namespace)),
               "the Deployments to be collected", logs=operator)
    eventually(lambda: not plane.admin.items(
        f"/apis/apps/v1/namespaces/{namespace}/replicasets"), "the ReplicaSets to be collected")
    eventually(lambda: not pods(plane, namespace), "the pods to be collected")
