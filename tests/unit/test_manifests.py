"""Pure builders, the reconcile plan and the status: the operator's decisions without a cluster."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from jobpool.core.poolspec import PoolSpec, load_pool, load_pool_file
from jobpool.core.scaling import LaneJobs, ScalingPolicy, decide_replicas
from jobpool.k8s import manifests, reconcile, status
from jobpool.sql import QUERIES

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"
OWNER_BODY = {
    "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
    "metadata": {"name": "mdm-jobs", "namespace": "mdm", "uid": "5b1e-uid"},
}
OWNER = manifests.build_owner_reference(OWNER_BODY)
COUNT = QUERIES["count_lane_jobs"].text
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def example(**changes: Any) -> PoolSpec:
    spec = load_pool_file(ROOT / "examples" / "pool.yaml")
    document = {
        "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
        "metadata": {"name": spec.name, "namespace": "mdm"},
        "spec": {**_example_spec(), **changes},
    }
    return load_pool(document)


def _example_spec() -> dict[str, Any]:
    import yaml

    document = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    return dict(document["spec"])


def deployment(pool: PoolSpec, lane: str, replicas: int = 1) -> dict[str, Any]:
    return manifests.build_worker_deployment(pool, pool.lane(lane), OWNER, replicas)


def env_of(body: dict[str, Any]) -> dict[str, Any]:
    container = body["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item for item in container["env"]}


# -- the worker Deployment -----------------------------------------------------------------


def test_one_deployment_per_lane_named_pool_dash_lane_owned_by_the_pool() -> None:
    pool = example()
    bodies = reconcile.desired_deployments(pool, OWNER)
    assert sorted(bodies) == ["mdm-jobs-acme", "mdm-jobs-bulk", "mdm-jobs-default",
                              "mdm-jobs-heavy"]
    body = bodies["mdm-jobs-default"]
    assert body["metadata"]["namespace"] == "mdm"
    assert body["metadata"]["ownerReferences"] == [{
        "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool", "name": "mdm-jobs",
        "uid": "5b1e-uid", "controller": True, "blockOwnerDeletion": True,
    }]
    labels = body["metadata"]["labels"]
    assert labels["jobs.mdm.io/pool"] == "mdm-jobs" and labels["jobs.mdm.io/lane"] == "default"
    assert labels["app.kubernetes.io/name"] == "jobpool"
    assert labels["app.kubernetes.io/managed-by"] == "jobpool-operator"
    assert labels["app.kubernetes.io/version"] == "0.1.0"
    selector = body["spec"]["selector"]["matchLabels"]
    assert selector.items() <= body["spec"]["template"]["metadata"]["labels"].items()
    assert body["spec"]["replicas"] == 1  # min, for a first creation


def test_owner_without_uid_is_refused() -> None:
    with pytest.raises(ValueError, match="has no uid"):
        manifests.build_owner_reference({"metadata": {"name": "x"}})


def test_worker_runs_jobpool_run_restricted_to_the_lane() -> None:
    pool = example()
    container = deployment(pool, "acme")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "jobpool:0.1.0"
    assert container["args"] == [
        "run", "--slots", "4", "--grace", "30", "--kinds", "email_send,outbox_dispatch",
        "--tenants", "acme",
    ]
    heavy = deployment(pool, "heavy")["spec"]["template"]["spec"]["containers"][0]
    assert heavy["args"] == ["run", "--slots", "1", "--grace", "30", "--kinds",
                             "gin_backfill,index_sync"]


def test_dsn_comes_from_the_secret_never_inlined() -> None:
    body = deployment(example(), "default")
    assert env_of(body)["JOBPOOL_DSN"] == {
        "name": "JOBPOOL_DSN",
        "valueFrom": {"secretKeyRef": {"name": "jobpool-db", "key": "dsn"}},
    }
    assert "postgresql://" not in json.dumps(body)


def test_probes_metrics_port_and_scrape_annotations() -> None:
    pool = example(worker={"metricsPort": 9200, "graceSeconds": 40})
    body = deployment(pool, "default")
    template = body["spec"]["template"]
    container = template["spec"]["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9200, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert env_of(body)["JOBPOOL_METRICS_PORT"]["value"] == "9200"
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9200"
    assert template["spec"]["terminationGracePeriodSeconds"] > 40


def test_pods_run_restricted() -> None:
    spec = deployment(example(), "default")["spec"]["template"]["spec"]
    container = spec["containers"][0]["securityContext"]
    assert container["runAsNonRoot"] is True
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False


def test_lane_resources_and_rate_limits_reach_the_pod() -> None:
    body = deployment(example(), "default")
    container = body["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"memory": "512Mi"}}
    limits = json.loads(env_of(body)["JOBPOOL_RATE_LIMITS"]["value"])
    assert limits == {"providers": {"smtp": {"rps": 20.0, "burst": 40}},
                      "kinds": {"email_send": "smtp"}}
    assert "JOBPOOL_RATE_LIMITS" not in env_of(deployment(example(), "bulk"))


@pytest.mark.parametrize("lane", ["default", "bulk", "acme", "heavy"])
def test_deployments_are_valid_kubernetes(lane: str) -> None:
    kubernetes_validate.validate(deployment(example(), lane), K8S_VERSION, strict=True)


def test_template_hash_ignores_replicas_and_follows_the_image() -> None:
    pool = example()
    one, five = deployment(pool, "default", 1), deployment(pool, "default", 5)
    key = manifests.TEMPLATE_HASH
    assert one["metadata"]["annotations"][key] == five["metadata"]["annotations"][key]
    other = deployment(example(image="jobpool:0.2.0"), "default")
    assert other["metadata"]["annotations"][key] != one["metadata"]["annotations"][key]


# -- the reconcile plan ----------------------------------------------------------------------


def live_copy(body: dict[str, Any], replicas: int, version: str = "7") -> dict[str, Any]:
    live = copy.deepcopy(body)
    live["spec"]["replicas"] = replicas
    live["metadata"]["resourceVersion"] = version
    live["status"] = {"readyReplicas": replicas}
    return live


def test_plan_creates_missing_lanes() -> None:
    plan = reconcile.plan_reconcile(example(), OWNER, [], None, COUNT)
    assert plan.of("create", "Deployment") == ["mdm-jobs-acme", "mdm-jobs-bulk",
                                              "mdm-jobs-default", "mdm-jobs-heavy"]
    assert plan.of("replace", "Deployment") == plan.of("delete", "Deployment") == []


def test_plan_leaves_matching_deployments_alone() -> None:
    pool = example()
    live = [live_copy(b, 3) for b in reconcile.desired_deployments(pool, OWNER).values()]
    plan = reconcile.plan_reconcile(pool, OWNER, live, None, COUNT)
    assert plan.actions == ()
    assert len(plan.unchanged) == 4


def test_new_image_replaces_the_template_but_keeps_live_replicas() -> None:
    live = [live_copy(b, 6, "41") for b in reconcile.desired_deployments(example(), OWNER).values()]
    plan = reconcile.plan_reconcile(example(image="jobpool:0.2.0"), OWNER, live, None, COUNT)
    replaced = [a for a in plan.actions if a.verb == "replace"]
    assert len(replaced) == 4 and len(plan.actions) == 4
    for action in replaced:
        assert action.body is not None
        assert action.body["spec"]["replicas"] == 6
        assert action.body["metadata"]["resourceVersion"] == "41"
        assert action.body["spec"]["template"]["spec"]["containers"][0]["image"] == "jobpool:0.2.0"


def test_removed_lane_is_deleted_and_foreign_deployments_are_ignored() -> None:
    pool = example()
    live = [live_copy(b, 1) for b in reconcile.desired_deployments(pool, OWNER).values()]
    foreign = copy.deepcopy(live[0])
    foreign["metadata"]["name"] = "someone-else"
    foreign["metadata"]["labels"] = {"app": "other"}
    lanes = [lane for lane in _example_spec()["lanes"] if lane["name"] != "bulk"]
    smaller = example(lanes=lanes)
    plan = reconcile.plan_reconcile(smaller, OWNER, [*live, foreign], None, COUNT)
    # the catch-all lane now serves bulk_import and reindex too, so its template changes
    assert [(a.verb, a.name) for a in plan.actions] == [
        ("replace", "mdm-jobs-default"), ("delete", "mdm-jobs-bulk"),
    ]
    assert sorted(plan.unchanged) == ["mdm-jobs-acme", "mdm-jobs-heavy"]


# -- KEDA --------------------------------------------------------------------------------------


def keda_pool() -> PoolSpec:
    lanes = _example_spec()["lanes"]
    lanes[0] = {**lanes[0], "autoscaling": {"mode": "keda", "targetUtilization": 0.5}}
    return example(lanes=lanes)


def test_keda_lane_gets_a_scaled_object_with_a_postgresql_trigger() -> None:
    pool = keda_pool()
    plan = reconcile.plan_reconcile(pool, OWNER, [], [], COUNT)
    assert plan.of("create", "ScaledObject") == ["mdm-jobs-default"]
    body = next(a.body for a in plan.actions if a.kind == "ScaledObject")
    assert body is not None
    spec = body["spec"]
    assert spec["scaleTargetRef"]["name"] == "mdm-jobs-default"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)
    trigger = spec["triggers"][0]
    assert trigger["type"] == "postgresql"
    assert trigger["metadata"]["connectionFromEnv"] == "JOBPOOL_DSN"
    assert trigger["metadata"]["targetQueryValue"] == "2"
    assert '"exclude_kinds":["bulk_import","gin_backfill","index_sync","reindex"]' in (
        trigger["metadata"]["query"]
    )
    assert "%(lanes)s" not in trigger["metadata"]["query"]
    assert body["metadata"]["ownerReferences"] == [OWNER]


def test_no_keda_in_the_cluster_means_no_scaled_objects_planned() -> None:
    plan = reconcile.plan_reconcile(keda_pool(), OWNER, [], None, COUNT)
    assert plan.of("create", "ScaledObject") == []


def test_lane_leaving_keda_mode_loses_its_scaled_object() -> None:
    pool = keda_pool()
    scaled = list(reconcile.desired_scaled_objects(pool, OWNER, COUNT).values())
    plan = reconcile.plan_reconcile(example(), OWNER, [], scaled, COUNT)
    assert plan.of("delete", "ScaledObject") == ["mdm-jobs-default"]


def test_keda_query_quotes_the_lane_literal() -> None:
    lane = keda_pool().lane("default")
    query = manifests.keda_query("SELECT %(lanes)s::jsonb;", lane)
    assert query.startswith("SELECT coalesce(sum(ready + running), 0) FROM (SELECT '[{")
    assert query.endswith("'::jsonb) AS lane_jobs")


# -- status ------------------------------------------------------------------------------------


def test_lane_status_reports_counts_and_scale_decision() -> None:
    pool = example()
    live = live_copy(deployment(pool, "default"), 1)
    decision = decide_replicas(ScalingPolicy(1, 8, 4), ready=17, running=3, current=1,
                               scale_down_since=None, now=NOW)
    entry = status.lane_status(pool, pool.lane("default"), live=live, previous=None,
                               jobs=LaneJobs(17, 3), decision=decision, now=NOW)
    assert entry["deployment"] == "mdm-jobs-default"
    assert (entry["readyJobs"], entry["runningJobs"]) == (17, 3)
    assert (entry["desiredReplicas"], entry["currentReplicas"]) == (5, 5)
    assert entry["lastScaleReason"] == "ScaledUp"
    assert entry["lastScaleTime"] == "2026-11-01T12:00:00Z"
    assert "scaleDownSince" not in entry


def test_status_fields_are_declared_in_the_crd() -> None:
    import yaml

    crd = yaml.safe_load((ROOT / "crds" / "jobworkerpools.jobs.mdm.io.yaml").read_text())
    declared = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    pool = example()
    live = live_copy(deployment(pool, "default"), 5)
    decision = decide_replicas(ScalingPolicy(1, 8, 4), ready=0, running=0, current=5,
                               scale_down_since=None, now=NOW)
    lane = status.lane_status(pool, pool.lane("default"), live=live, previous=None,
                              jobs=LaneJobs(0, 0), decision=decision, now=NOW)
    conditions = status.merge_conditions(
        None, status.pool_conditions(pool, [lane], count_error=None), 3, NOW)
    whole = status.pool_status([lane], conditions, 3, NOW)
    assert set(whole) <= set(declared["properties"])
    assert set(lane) <= set(declared["properties"]["lanes"]["items"]["properties"])
    assert "scaleDownSince" in lane
    assert set(conditions[0]) <= set(declared["properties"]["conditions"]["items"]["properties"])


def test_condition_transition_time_moves_only_on_a_flip() -> None:
    pool = example()
    ready_lane = [{"name": "default", "currentReplicas": 1, "readyReplicas": 1,
                   "desiredReplicas": 1}]
    first = status.merge_conditions(None, status.pool_conditions(pool, ready_lane,
                                                                 count_error=None), 1, NOW)
    later = NOW + timedelta(minutes=5)
    same = status.merge_conditions(first, status.pool_conditions(pool, ready_lane,
                                                                 count_error=None), 1, later)
    assert same[0]["lastTransitionTime"] == "2026-11-01T12:00:00Z"
    failing = status.merge_conditions(
        same, status.pool_conditions(pool, ready_lane, count_error="db down"), 1, later)
    by_type = {c["type"]: c for c in failing}
    assert by_type["Degraded"]["status"] == "True"
    assert by_type["Degraded"]["reason"] == "CountFailed"
    assert by_type["Degraded"]["lastTransitionTime"] == "2026-11-01T12:05:00Z"
    assert by_type["ScalingActive"]["status"] == "False"
    assert by_type["Ready"]["lastTransitionTime"] == "2026-11-01T12:00:00Z"


def test_missing_or_unready_lanes_make_the_pool_not_ready() -> None:
    pool = example()
    lanes = [{"name": "default", "currentReplicas": 2, "readyReplicas": 1, "desiredReplicas": 2},
             {"name": "bulk"}]
    ready = status.pool_conditions(pool, lanes, count_error=None)[0]
    assert (ready.status, ready.reason) == ("False", "LanesNotReady")
    assert "default, bulk" in ready.message


def test_unserved_kinds_degrade_the_pool() -> None:
    pool = load_pool({"apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
                      "metadata": {"name": "p"},
                      "spec": {"image": "i", "database": {"secretName": "s"},
                               "lanes": [{"name": "mail", "kinds": ["email_send"]}]}})
    degraded = status.pool_conditions(pool, [], count_error=None)[1]
    assert (degraded.status, degraded.reason) == ("True", "UnservedKinds")
    assert "cleanup_jobs" in degraded.message
