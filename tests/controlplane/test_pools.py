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
from .control_plane import ApiError
from .helpers import (
    CHILDREN,
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
    every_deployment,
    example_pool,
    operator_writes,
    pods,
    pool_object,
    pools_path,
)

pytestmark = pytest.mark.controlplane

def apply_example(tools: Tools, namespace: str, operator: Operator) -> dict[str, Any]:
    tools.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "pool.yaml"))
    return every_deployment(tools.plane, namespace, f"Deployments {sorted(CHILDREN)}",
                            logs=operator)


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
        labels = deployment["metadata"]["labels"]
        assert labels["jobs.mdm.io/pool"] == POOL
        assert f"{POOL}-{labels['jobs.mdm.io/lane']}" == name
        assert not any(key.startswith("kopf.") for key in deployment["metadata"].get(
            "annotations", {})), "kopf bookkeeping leaked onto a child"
        assert "finalizers" not in deployment["metadata"]
    container = found[f"{POOL}-heavy"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "jobpool:0.1.0"
    assert container["args"] == ["run", "--slots", "1", "--grace", "30", "--kinds",
                                 "gin_backfill,index_sync"]
    env = {item["name"]: item for item in container["env"]}
    assert env["JOBPOOL_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "jobpool-db", "key": "dsn"}
    assert found[f"{POOL}-default"]["spec"]["replicas"] == 1  # minReplicas

    def default_lane_ready() -> bool:
        status = deployments(plane, namespace)[f"{POOL}-default"].get("status") or {}
        return status.get("readyReplicas") == 1

    eventually(default_lane_ready, "the default lane's pod to be ready", logs=operator)
    # the default lane's pod, and no other: a lane at minReplicas 0 never started one
    (pod,) = pods(plane, namespace)
    started = [e["message"] for e in events(plane, namespace)
               if e.get("reason") == "SuccessfulCreate" and "Created pod" in e.get("message", "")]
    assert all(message.startswith(f"Created pod: {POOL}-default-") for message in started), (
        started)
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
    assert [lane["name"] for lane in status["lanes"]] == list(LANES)
    assert {c["type"] for c in status["conditions"]} == {
        "Ready", "Degraded", "ScalingActive", "Reconciled"}
    assert condition({"status": status}, "Degraded").get("status") != "True", status
    reasons = [e["reason"] for e in events(plane, namespace)
               if e["involvedObject"].get("kind") == "JobWorkerPool"]
    assert "Reconciled" in reasons
    assert all(e["type"] == "Normal" for e in events(plane, namespace)
               if e["involvedObject"].get("kind") == "JobWorkerPool"
               and e["reason"] == "Reconciled")


def add_jobs(dsn: str, tenant: str, kind: str, count: int, status: str) -> None:
    """`count` jobs of `kind` for tenant key `tenant` (made if new), in `status`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES (%s) ON CONFLICT DO NOTHING",
                     (tenant,))
        conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES (%s) ON CONFLICT DO NOTHING",
                     (kind,))
        running = status == "running"
        conn.execute(
            """
            INSERT INTO mdm.aa_job (tenant_id, job_kind, status, max_attempts, claimed_by,
                                    claimed_at)
            SELECT (SELECT id FROM mdm.aa_tenant WHERE key = %(tenant)s), %(kind)s,
                   %(status)s::mdm.job_status, 3,
                   CASE WHEN %(running)s THEN 'w/1/x' END, CASE WHEN %(running)s THEN now() END
              FROM generate_series(1, %(count)s)
            """, {"tenant": tenant, "kind": kind, "status": status, "running": running,
                  "count": count})


def owned_fields(obj: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    return [entry for entry in obj["metadata"].get("managedFields") or ()
            if entry["manager"] == manager]


def test_pending_jobs_scale_the_lanes_that_serve_them_through_the_scale_subresource(
    release: Tools, namespace: str, operator: Operator, dsn: str
) -> None:
    plane = release.plane
    apply_example(release, namespace, operator)
    # acme's outbox jobs: served by "default" (all tenants) and "acme"; reindex by "bulk"
    add_jobs(dsn, "acme", "outbox_dispatch", 17, "pending")
    add_jobs(dsn, "acme", "outbox_dispatch", 3, "running")
    add_jobs(dsn, "scaling", "reindex", 5, "pending")

    def replicas() -> dict[str, int]:
        return {name.removeprefix(f"{POOL}-"): int(d["spec"]["replicas"])
                for name, d in deployments(plane, namespace).items()}

    # default: 20 jobs / 4 slots; acme: its maxReplicas 4; bulk: 5 jobs / 2 slots
    expected = {"default": 5, "acme": 4, "bulk": 3, "heavy": 0}
    eventually(lambda: replicas() == expected, f"replicas {expected}", logs=operator)
    scale_writes = [w for w in operator_writes(plane, namespace)
                    if w["objectRef"].get("subresource") == "scale"]
    assert {w["objectRef"]["name"] for w in scale_writes} >= {
        f"{POOL}-default", f"{POOL}-acme", f"{POOL}-bulk"}, described(scale_writes)
    assert all(w["user"]["username"] == OPERATOR_USER for w in scale_writes)

    # the children are applied without replicas, which the scaler alone writes (a merge
    # patch of /scale on replicas nobody owned gets no managedFields entry on a real
    # server: only the operator's side can be checked)
    bulk = deployments(plane, namespace)[f"{POOL}-bulk"]
    (applied,) = owned_fields(bulk, "jobpool-operator")
    assert applied["operation"] == "Apply"
    assert "f:replicas" not in applied["fieldsV1"]["f:spec"]
    assert "f:template" in applied["fieldsV1"]["f:spec"]

    def reported() -> dict[str, Any] | None:
        lanes = {lane["name"]: lane for lane in
                 ((pool_object(plane, namespace) or {}).get("status") or {}).get("lanes") or []}
        return lanes if (lanes.get("default") or {}).get("lastScaleReason") == "ScaledUp" \
            else None

    lanes = eventually(reported, "the scale-up in the status", logs=operator)
    assert (lanes["default"]["readyJobs"], lanes["default"]["runningJobs"]) == (17, 3)
    assert lanes["default"]["desiredReplicas"] == 5
    assert any(e.get("reason") == "ScaledUp" for e in events(plane, namespace))

    # a new image keeps the scaled replicas and what another manager added
    plane.admin.patch(f"{deployments_path(namespace)}/{POOL}-heavy",
                      {"metadata": {"annotations": {"mesh.example/inject": "true"}}},
                      params={"fieldManager": "mesh-injector"})
    plane.admin.patch(f"{pools_path(namespace)}/{POOL}", {"spec": {"image": "jobpool:0.2.0"}})

    def rolled() -> dict[str, Any] | None:
        found = deployments(plane, namespace)
        images = {d["spec"]["template"]["spec"]["containers"][0]["image"]
                  for d in found.values()}
        return found if images == {"jobpool:0.2.0"} else None

    found = eventually(rolled, "every lane on the new image", logs=operator)
    assert found[f"{POOL}-heavy"]["metadata"]["annotations"]["mesh.example/inject"] == "true"
    assert replicas() == expected
    eventually(lambda: ((pool_object(plane, namespace) or {}).get("status") or {}).get(
        "observedGeneration") == 2, "observedGeneration 2", logs=operator)


def test_a_removed_lane_loses_its_deployment(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    apply_example(release, namespace, operator)
    lanes = [lane for lane in example_pool()["spec"]["lanes"] if lane["name"] != "bulk"]
    plane.admin.patch(f"{pools_path(namespace)}/{POOL}", {"spec": {"lanes": lanes}})
    found = eventually(lambda: (lambda d: d if f"{POOL}-bulk" not in d else None)(
        deployments(plane, namespace)), "mdm-jobs-bulk deleted", logs=operator)
    assert set(found) == CHILDREN - {f"{POOL}-bulk"}
    args = found[f"{POOL}-default"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--exclude-kinds") + 1] == "gin_backfill,index_sync"


def test_the_finalizer_of_older_versions_is_removed(
    release: Tools, namespace: str, operator: Operator
) -> None:
    plane = release.plane
    document = example_pool()
    document["metadata"]["finalizers"] = ["jobs.mdm.io/finalizer"]
    plane.admin.create(pools_path(namespace), document)
    eventually(lambda: not (pool_object(plane, namespace) or {"metadata": {"finalizers": [1]}})[
        "metadata"].get("finalizers"), "the old finalizer removed", logs=operator)
    plane.admin.delete(f"{pools_path(namespace)}/{POOL}")
    eventually(lambda: pool_object(plane, namespace) is None, "the pool deleted")


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


def test_the_server_refuses_a_variable_the_operator_sets_and_pods_wait_for_the_stop_grace(
    release: Tools, namespace: str, operator: Operator
) -> None:
    """The CRD's rule on `spec.worker.env`, as the API server runs it; a stop grace given
    there lengthens the pods' termination grace period, so that the kubelet waits for it."""
    plane = release.plane
    document = example_pool()
    document["spec"].setdefault("worker", {})["env"] = [
        {"name": "JOBPOOL_POOL", "value": "another-pool"}]
    with pytest.raises(ApiError) as refused:
        plane.admin.create(pools_path(namespace), document)
    assert refused.value.status == 422
    assert "JOBPOOL_POOL, " in str(refused.value)
    assert "are set by the operator" in str(refused.value)
    document["spec"]["worker"]["env"] = [{"name": "JOBPOOL_STOP_GRACE", "value": "100"}]
    plane.admin.create(pools_path(namespace), document)
    found = every_deployment(plane, namespace, f"Deployments {sorted(CHILDREN)}", logs=operator)
    grace = document["spec"]["worker"].get("graceSeconds", 30)
    for deployment in found.values():
        period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert period >= grace + 100 + 20, described(deployment)


def test_deleting_a_pool_retires_its_schedules_once_its_children_are_collected(
    release: Tools, namespace: str, operator: Operator, dsn: str
) -> None:
    import asyncio

    from jobpool.core.schedules import parse_schedule
    from jobpool.worker.scheduler import Declarations, declare

    plane = release.plane
    document = example_pool()
    document["spec"]["schedules"] = [{"name": "nightly", "kind": "reindex",
                                      "cron": "30 2 * * *"}]
    plane.admin.create(pools_path(namespace), document)
    every_deployment(plane, namespace, f"Deployments {sorted(CHILDREN)}", logs=operator)
    owner = f"{namespace}/{POOL}"

    async def declared_as_its_workers_do() -> None:  # kwok's pods run no worker
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await declare(conn, Declarations(
                owner, (parse_schedule(document["spec"]["schedules"][0], "s"),), retire=True))

    asyncio.run(declared_as_its_workers_do())

    def owned() -> list[str]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return [row[0] for row in conn.execute(
                "SELECT name FROM mdm.aa_schedule WHERE owner = %s", (owner,))]

    assert owned() == ["nightly"]

    def runs_shown() -> list[dict[str, Any]] | None:
        status = (pool_object(plane, namespace) or {}).get("status") or {}
        entries = status.get("schedules") or []
        return entries if entries and entries[0].get("nextRunTime") else None

    # the status the operator wrote (a schedule that never ran: lastRunTime null, which the
    # server's merge patch drops from the list) does not make the pool invalid when the
    # operator reads it back
    [entry] = eventually(runs_shown, "the schedule's next run in the status", logs=operator)
    assert "lastRunTime" not in entry
    plane.admin.patch(f"{pools_path(namespace)}/{POOL}", {"spec": {"image": "jobpool:0.2.0"}})
    eventually(lambda: ((pool_object(plane, namespace) or {}).get("status") or {}).get(
        "observedGeneration") == 2, "observedGeneration 2", logs=operator)
    assert condition(pool_object(plane, namespace), "Reconciled")["reason"] == \
        "ChildrenMatchSpec"
    plane.admin.delete(f"{pools_path(namespace)}/{POOL}")
    eventually(lambda: not owned(), "the deleted pool's schedules retired", logs=operator)
    # retired after the garbage collector took the pool's Deployments
    assert not plane.admin.items(deployments_path(namespace))
    with psycopg.connect(dsn, autocommit=True) as conn:
        (actor,) = conn.execute(
            "SELECT actor_principal_id FROM mdm.aa_audit_log "
            "WHERE action = 'schedules_retired' AND payload->>'owner' = %s", (owner,)).fetchone()
    assert actor == "jobpool-operator"
