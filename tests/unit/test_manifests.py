"""Pure builders, the reconcile plan and the status: the operator's decisions without a cluster."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from jobpool import event_loop
from jobpool.core.crd import API_VERSION, CRD_FILE
from jobpool.core.poolspec import PoolSpec, Problem, load_pool, load_pool_file
from jobpool.core.scaling import LaneJobs, ScalingPolicy, decide_replicas
from jobpool.db.queries import Many
from jobpool.k8s import manifests, reconcile, status
from jobpool.worker import executor, producer, runtime

COUNT_LANE_JOBS = Many("count_lane_jobs")

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33.0"
OWNER_BODY = {
    "apiVersion": API_VERSION, "kind": "JobWorkerPool",
    "metadata": {"name": "mdm-jobs", "namespace": "mdm", "uid": "5b1e-uid"},
}
OWNER = manifests.build_owner_reference(OWNER_BODY)
COUNT = COUNT_LANE_JOBS.text
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def example(**changes: Any) -> PoolSpec:
    spec = load_pool_file(ROOT / "examples" / "pool.yaml")
    document = {
        "apiVersion": API_VERSION, "kind": "JobWorkerPool",
        "metadata": {"name": spec.name, "namespace": "mdm"},
        "spec": {**_example_spec(), **changes},
    }
    return load_pool(document)


def _example_spec() -> dict[str, Any]:
    import yaml

    document = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    return dict(document["spec"])


def deployment(pool: PoolSpec, lane: str) -> dict[str, Any]:
    return manifests.build_worker_deployment(pool, pool.lane(lane), OWNER)


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
        "apiVersion": API_VERSION, "kind": "JobWorkerPool", "name": "mdm-jobs",
        "uid": "5b1e-uid", "controller": True, "blockOwnerDeletion": True,
    }]
    labels = body["metadata"]["labels"]
    assert labels["jobs.mdm.io/pool"] == "mdm-jobs" and labels["jobs.mdm.io/lane"] == "default"
    assert labels["app.kubernetes.io/name"] == "jobpool"
    assert labels["app.kubernetes.io/managed-by"] == "jobpool-operator"
    assert labels["app.kubernetes.io/version"] == "0.1.0"
    selector = body["spec"]["selector"]["matchLabels"]
    assert selector.items() <= body["spec"]["template"]["metadata"]["labels"].items()
    assert "replicas" not in body["spec"]  # the scaler's: an apply would take them back


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


def test_an_empty_variable_is_written_as_the_server_stores_it() -> None:
    """The server leaves `value: ""` out; written with it, every sync would find the entry
    changed and apply the Deployment again."""
    body = deployment(example(worker={"env": [{"name": "EMPTY", "value": ""},
                                              {"name": "FULL", "value": "x"}]}), "default")
    assert env_of(body)["EMPTY"] == {"name": "EMPTY"}
    assert env_of(body)["FULL"] == {"name": "FULL", "value": "x"}


@pytest.mark.parametrize(("worker", "grace", "stop_grace"), [
    ({}, 30, 10),
    ({"graceSeconds": 120}, 120, 10),
    ({"env": [{"name": "JOBPOOL_STOP_GRACE", "value": "60.5"}]}, 30, 60.5),
])
def test_the_kubelet_waits_for_the_whole_shutdown_of_a_worker(
        worker: dict[str, Any], grace: float, stop_grace: float) -> None:
    """SIGKILL before the worker's own bounds run out would leave its jobs claimed until
    their leases lapse: the period covers the grace, the stop grace of the handlers
    cancelled at its end, and the hand-backs around them."""
    pod = deployment(example(worker=worker), "default")["spec"]["template"]["spec"]
    period = pod["terminationGracePeriodSeconds"]
    assert isinstance(period, int)
    if worker == {}:  # the figure docs/workers-and-pools.md gives for the defaults
        assert period == 66
    # each bounded step of the worker's shutdown, as the worker's modules use them
    assert period >= (grace + stop_grace + producer.BUFFER_HAND_BACK_TIMEOUT
                      + executor.SHUTDOWN_WRITE_TIMEOUT + runtime.SHUTDOWN_SETTLE_TIMEOUT
                      + event_loop.LEFT_TASKS_WAIT)


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
    one = deployment(pool, "default")
    key = manifests.TEMPLATE_HASH
    assert manifests.template_hash(live_copy(one, 5)) == one["metadata"]["annotations"][key]
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
    assert plan.of("apply", "Deployment") == ["mdm-jobs-acme", "mdm-jobs-bulk",
                                             "mdm-jobs-default", "mdm-jobs-heavy"]
    assert all(action.creates for action in plan.actions)
    assert plan.of("delete", "Deployment") == []


def test_plan_leaves_matching_deployments_alone() -> None:
    pool = example()
    live = [live_copy(b, 3) for b in reconcile.desired_deployments(pool, OWNER).values()]
    plan = reconcile.plan_reconcile(pool, OWNER, live, None, COUNT)
    assert plan.actions == ()
    assert len(plan.unchanged) == 4


def test_new_image_is_applied_without_replicas_or_resource_version() -> None:
    live = [live_copy(b, 6, "41") for b in reconcile.desired_deployments(example(), OWNER).values()]
    plan = reconcile.plan_reconcile(example(image="jobpool:0.2.0"), OWNER, live, None, COUNT)
    applied = [a for a in plan.actions if a.verb == "apply"]
    assert len(applied) == 4 and len(plan.actions) == 4
    for action in applied:
        assert action.body is not None and not action.creates
        assert "replicas" not in action.body["spec"]  # the live 6 stay the scaler's
        assert "resourceVersion" not in action.body["metadata"]  # an apply needs none
        assert action.body["spec"]["template"]["spec"]["containers"][0]["image"] == "jobpool:0.2.0"


def test_a_field_changed_by_hand_is_applied_again() -> None:
    # the template hash annotation still matches: only the live fields tell
    pool = example()
    live = [live_copy(b, 2) for b in reconcile.desired_deployments(pool, OWNER).values()]
    live[0]["spec"]["template"]["spec"]["containers"][0]["image"] = "evil/miner:latest"
    plan = reconcile.plan_reconcile(pool, OWNER, live, None, COUNT)
    assert [(a.verb, a.name) for a in plan.actions] == [("apply", live[0]["metadata"]["name"])]


def test_what_the_server_adds_is_no_drift() -> None:
    pool = example()
    live = [live_copy(b, 2) for b in reconcile.desired_deployments(pool, OWNER).values()]
    for obj in live:
        container = obj["spec"]["template"]["spec"]["containers"][0]
        container["terminationMessagePath"] = "/dev/termination-log"
        obj["spec"]["progressDeadlineSeconds"] = 600
        obj["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"
    assert reconcile.plan_reconcile(pool, OWNER, live, None, COUNT).actions == ()


def test_removed_lane_is_deleted_and_foreign_deployments_are_ignored() -> None:
    pool = example()
    live = [live_copy(b, 1) for b in reconcile.desired_deployments(pool, OWNER).values()]
    foreign = copy.deepcopy(live[0])
    foreign["metadata"]["name"] = "someone-else"
    foreign["metadata"]["labels"] = {"app": "other"}
    foreign["metadata"]["ownerReferences"] = []
    lanes = [lane for lane in _example_spec()["lanes"] if lane["name"] != "bulk"]
    smaller = example(lanes=lanes)
    plan = reconcile.plan_reconcile(smaller, OWNER, [*live, foreign], None, COUNT)
    # the catch-all lane now serves bulk_import and reindex too, so its template changes
    assert [(a.verb, a.name) for a in plan.actions] == [
        ("apply", "mdm-jobs-default"), ("delete", "mdm-jobs-bulk"),
    ]
    assert sorted(plan.unchanged) == ["mdm-jobs-acme", "mdm-jobs-heavy"]


def held_by(body: dict[str, Any], holder: dict[str, Any] | None) -> dict[str, Any]:
    """`body` as another owner made it: controlled by `holder` (no owner if None)."""
    live = live_copy(body, 2)
    live["metadata"]["ownerReferences"] = [holder] if holder else []
    if holder is None:
        live["metadata"]["labels"] = {"app": "made-by-hand"}
    return live


def other_pool(name: str) -> dict[str, Any]:
    return manifests.build_owner_reference({**OWNER_BODY, "metadata": {
        "name": name, "namespace": "mdm", "uid": f"{name}-uid"}})


def test_child_name_of_another_pool_is_a_conflict_never_an_action() -> None:
    # pool mdm with lane jobs-acme made Deployment mdm-jobs-acme before this pool
    pool = example()
    theirs = held_by(deployment(pool, "acme"), other_pool("mdm"))
    theirs["metadata"]["labels"]["jobs.mdm.io/pool"] = "mdm"
    plan = reconcile.plan_reconcile(pool, OWNER, [theirs], None, COUNT)
    assert "mdm-jobs-acme" not in [a.name for a in plan.actions]
    assert plan.of("apply", "Deployment") == ["mdm-jobs-bulk", "mdm-jobs-default",
                                             "mdm-jobs-heavy"]
    (conflict,) = plan.conflicts
    assert (conflict.kind, conflict.name, conflict.lane) == ("Deployment", "mdm-jobs-acme", "acme")
    assert conflict.message == (
        "Deployment 'mdm-jobs-acme' of lane 'acme' belongs to JobWorkerPool 'mdm'; it is left "
        "alone and the lane has no such child here: rename this pool or the lane")


@pytest.mark.parametrize(("holder", "named"), [
    (None, "exists and was not made by the jobpool operator"),
    ({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "legacy", "uid": "u",
      "controller": True}, "belongs to Rollout.argoproj.io 'legacy'"),
    ({**OWNER, "uid": "an-older-pool"}, None),  # the pool's own name: its child, adopted
])
def test_whoever_holds_a_child_name_is_named(holder: dict[str, Any] | None,
                                             named: str | None) -> None:
    pool = example()
    plan = reconcile.plan_reconcile(pool, OWNER, [held_by(deployment(pool, "bulk"), holder)],
                                    None, COUNT)
    if named is None:
        assert plan.conflicts == () and "mdm-jobs-bulk" in plan.of("apply", "Deployment")
    else:
        assert [c.name for c in plan.conflicts] == ["mdm-jobs-bulk"]
        assert named in plan.conflicts[0].message
        assert "mdm-jobs-bulk" not in [a.name for a in plan.actions]


def test_orphan_with_the_pools_labels_is_adopted() -> None:
    pool = example()
    orphan = live_copy(deployment(pool, "bulk"), 3)
    del orphan["metadata"]["ownerReferences"]  # e.g. the pool was deleted with --cascade=orphan
    plan = reconcile.plan_reconcile(pool, OWNER, [orphan], None, COUNT)
    (adopt,) = [a for a in plan.actions if a.name == "mdm-jobs-bulk"]
    assert adopt.verb == "apply" and not adopt.creates and adopt.body is not None
    assert adopt.body["metadata"]["ownerReferences"] == [OWNER]


def test_extra_object_of_another_owner_is_never_deleted() -> None:
    pool = example()
    extra = held_by(deployment(pool, "bulk"), other_pool("mdm"))
    extra["metadata"]["name"] = "mdm-jobs-retired"  # carries this pool's labels, not its owner
    plan = reconcile.plan_reconcile(pool, OWNER, [extra], None, COUNT)
    assert plan.of("delete", "Deployment") == []


# -- KEDA --------------------------------------------------------------------------------------


def keda_pool() -> PoolSpec:
    lanes = _example_spec()["lanes"]
    lanes[0] = {**lanes[0], "autoscaling": {"mode": "keda", "targetUtilization": 0.5}}
    return example(lanes=lanes)


def test_keda_lane_gets_a_scaled_object_with_a_postgresql_trigger() -> None:
    pool = keda_pool()
    plan = reconcile.plan_reconcile(pool, OWNER, [], reconcile.KedaChildren(), COUNT)
    assert plan.of("apply", "ScaledObject") == ["mdm-jobs-default"]
    assert plan.of("apply", "TriggerAuthentication") == ["mdm-jobs-dsn"]
    body = next(a.body for a in plan.actions if a.kind == "ScaledObject")
    assert body is not None
    spec = body["spec"]
    assert spec["scaleTargetRef"]["name"] == "mdm-jobs-default"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)
    trigger = spec["triggers"][0]
    assert trigger["type"] == "postgresql"
    assert trigger["authenticationRef"] == {"name": "mdm-jobs-dsn"}
    assert "connectionFromEnv" not in trigger["metadata"]
    assert trigger["metadata"]["targetQueryValue"] == "2"
    assert '"exclude_kinds":["bulk_import","gin_backfill","index_sync","reindex"]' in (
        trigger["metadata"]["query"]
    )
    assert "%(lanes)s" not in trigger["metadata"]["query"]
    assert body["metadata"]["ownerReferences"] == [OWNER]


def test_lane_taken_by_another_owner_gets_no_scaled_object() -> None:
    pool = keda_pool()
    theirs = held_by(deployment(pool, "default"), other_pool("mdm"))
    plan = reconcile.plan_reconcile(pool, OWNER, [theirs], reconcile.KedaChildren(), COUNT)
    assert plan.of("apply", "ScaledObject") == []  # it would scale the other pool's lane
    assert [c.kind for c in plan.conflicts] == ["Deployment"]


def test_scaled_object_name_taken_is_a_conflict() -> None:
    pool = keda_pool()
    theirs = held_by(reconcile.desired_scaled_objects(pool, OWNER, COUNT)["mdm-jobs-default"],
                     None)
    plan = reconcile.plan_reconcile(pool, OWNER, [], reconcile.KedaChildren([theirs]), COUNT)
    assert plan.of("apply", "ScaledObject") == []
    assert [(c.kind, c.name) for c in plan.conflicts] == [("ScaledObject", "mdm-jobs-default")]


def test_keda_is_touched_only_for_lanes_that_are_or_were_in_keda_mode() -> None:
    pool, keda = example(), keda_pool()
    assert not reconcile.touches_keda(pool, [])
    assert reconcile.touches_keda(keda, [])
    made_for_keda = live_copy(deployment(keda, "default"), 1)
    assert made_for_keda["metadata"]["annotations"]["jobs.mdm.io/scaled-by"] == "keda"
    assert "jobs.mdm.io/scaled-by" not in deployment(pool, "default")["metadata"]["annotations"]
    assert reconcile.touches_keda(pool, [made_for_keda])  # its ScaledObject must go
    assert not reconcile.touches_keda(pool, [held_by(made_for_keda, other_pool("mdm"))])


def test_scaled_objects_go_before_the_deployments_change() -> None:
    keda = keda_pool()
    live = [live_copy(b, 1) for b in reconcile.desired_deployments(keda, OWNER).values()]
    scaled = list(reconcile.desired_scaled_objects(keda, OWNER, COUNT).values())
    auth = list(reconcile.desired_trigger_authentications(keda, OWNER).values())
    plan = reconcile.plan_reconcile(example(), OWNER, live,
                                    reconcile.KedaChildren(scaled, auth), COUNT)
    assert [(a.verb, a.kind, a.name) for a in plan.actions] == [
        ("delete", "ScaledObject", "mdm-jobs-default"),
        ("apply", "Deployment", "mdm-jobs-default"),
        ("delete", "TriggerAuthentication", "mdm-jobs-dsn"),
    ]


def test_trigger_authentication_gives_keda_the_dsn_from_the_secret() -> None:
    (body,) = reconcile.desired_trigger_authentications(keda_pool(), OWNER).values()
    assert body["metadata"]["name"] == "mdm-jobs-dsn"
    assert body["metadata"]["ownerReferences"] == [OWNER]
    assert body["spec"] == {"secretTargetRef": [
        {"parameter": "connection", "name": "jobpool-db", "key": "dsn"}]}
    assert reconcile.desired_trigger_authentications(example(), OWNER) == {}


def test_trigger_authentication_name_taken_means_no_scaled_object() -> None:
    pool = keda_pool()
    (auth,) = reconcile.desired_trigger_authentications(pool, OWNER).values()
    theirs = held_by(auth, None)
    plan = reconcile.plan_reconcile(pool, OWNER, [], reconcile.KedaChildren((), [theirs]), COUNT)
    assert plan.of("apply", "ScaledObject") == []
    assert plan.of("apply", "TriggerAuthentication") == []
    (conflict,) = plan.conflicts
    assert conflict.lane is None
    assert conflict.message.startswith(
        "TriggerAuthentication 'mdm-jobs-dsn' of the pool exists and was not made by")


def test_no_keda_in_the_cluster_means_no_scaled_objects_planned() -> None:
    plan = reconcile.plan_reconcile(keda_pool(), OWNER, [], None, COUNT)
    assert plan.of("apply", "ScaledObject") == []


def test_lane_leaving_keda_mode_loses_its_scaled_object() -> None:
    pool = keda_pool()
    scaled = list(reconcile.desired_scaled_objects(pool, OWNER, COUNT).values())
    plan = reconcile.plan_reconcile(example(), OWNER, [], reconcile.KedaChildren(scaled), COUNT)
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


def test_a_capped_count_is_shown_as_at_least() -> None:
    pool = example()
    live = live_copy(deployment(pool, "default"), 1)
    capped = status.lane_status(pool, pool.lane("default"), live=live, previous=None,
                                jobs=LaneJobs(4000, 12, capped=True))
    exact = status.lane_status(pool, pool.lane("default"), live=live, previous=None,
                               jobs=LaneJobs(17, 3))
    assert (capped["readyJobs"], capped["readyJobsShown"]) == (4000, "≥ 4,000")
    assert exact["readyJobsShown"] == "17"


def test_status_fields_are_declared_in_the_crd() -> None:
    import yaml

    crd = yaml.safe_load((ROOT / "crds" / CRD_FILE).read_text())
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
    pool = load_pool({"apiVersion": API_VERSION, "kind": "JobWorkerPool",
                      "metadata": {"name": "p"},
                      "spec": {"image": "i", "database": {"secretName": "s"},
                               "lanes": [{"name": "mail", "kinds": ["email_send"]}]}})
    degraded = status.pool_conditions(pool, [], count_error=None)[1]
    assert (degraded.status, degraded.reason) == ("True", "UnservedKinds")
    assert "cleanup_jobs" in degraded.message


def test_reconcile_problems_make_the_pool_unready_and_degraded() -> None:
    pool = example()
    ready_lanes = [{"name": "default", "currentReplicas": 1, "readyReplicas": 1,
                    "desiredReplicas": 1}]
    healthy = {c.type: c for c in status.pool_conditions(pool, ready_lanes, count_error=None)}
    assert (healthy["Ready"].status, healthy["Degraded"].status) == ("True", "False")
    assert (healthy["Reconciled"].status, healthy["Reconciled"].reason) == (
        "True", "ChildrenMatchSpec")
    problems = [Problem("NameConflict", "Deployment 'x' belongs to JobWorkerPool 'mdm'"),
                Problem("ReconcileFailed", "create Deployment 'y' failed: 500")]
    failed = {c.type: c for c in status.pool_conditions(
        pool, ready_lanes, count_error="db down", problems=problems)}
    for kind, value in (("Ready", "False"), ("Degraded", "True"), ("Reconciled", "False")):
        assert (failed[kind].status, failed[kind].reason) == (value, "NameConflict")
    assert failed["Reconciled"].message == (
        "Deployment 'x' belongs to JobWorkerPool 'mdm'; create Deployment 'y' failed: 500")
    assert failed["Degraded"].message.endswith("failed: 500; db down")
    assert failed["ScalingActive"].reason == "CountFailed"


def test_the_count_error_is_read_back_from_scaling_active() -> None:
    pool = example()
    problem = Problem("KedaUnavailable", "KEDA is not installed")
    written = {"conditions": status.merge_conditions(None, status.pool_conditions(
        pool, [], count_error="db down", problems=[problem]), 1, NOW)}
    assert status.previous_count_error(written) == "db down"  # though Degraded names KEDA
    assert status.previous_count_error({}) is None


def test_a_new_count_time_alone_is_no_change() -> None:
    before = {"lanes": [{"name": "a", "readyJobs": 1}], "lastCountTime": "2026-11-01T12:00:00Z"}
    assert not status.status_changed(before, {**before, "lastCountTime": "2026-11-01T12:05:00Z"})
    assert status.status_changed(before, {"lanes": [{"name": "a", "readyJobs": 2}],
                                          "lastCountTime": "2026-11-01T12:05:00Z"})
    assert status.status_changed({}, {"conditions": []})


@pytest.mark.parametrize(("keda", "http_status", "expected"), [
    (True, 404, "KEDA is not installed (no API scaledobjects.keda.sh/v1alpha1): lanes in keda "
                "mode (default) keep their current replicas"),
    (True, 403, "the operator may not list KEDA ScaledObjects in namespace 'mdm' (forbidden): "
                "lanes in keda mode (default) keep their current replicas; grant its "
                "ServiceAccount get, list, create, patch and delete on scaledobjects and "
                "triggerauthentications in API group keda.sh (chart value rbac.keda=true)"),
    (False, 403, "the operator may not list KEDA ScaledObjects in namespace 'mdm' (forbidden): "
                 "ScaledObjects of lanes that left keda mode cannot be removed; grant"),
    (False, 404, None),
])
def test_keda_unavailable_says_what_to_do(keda: bool, http_status: int,
                                          expected: str | None) -> None:
    pool = keda_pool() if keda else example()
    problem = status.keda_unavailable(pool, "mdm", http_status, "forbidden")
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and problem.reason == "KedaUnavailable"
        assert problem.message.startswith(expected)


# -- schedules -----------------------------------------------------------------------------

NIGHTLY = {"name": "nightly", "kind": "reindex", "cron": "0 3 * * *",
           "timeZone": "Europe/Berlin"}


def test_the_pools_schedules_reach_every_lanes_pods() -> None:
    pool = example(schedules=[NIGHTLY])
    for lane in pool.lanes:
        value = env_of(deployment(pool, lane.name))["JOBPOOL_SCHEDULES"]["value"]
        assert [s["name"] for s in json.loads(value)] == ["nightly"]


def test_the_pool_status_shows_each_schedules_last_and_next_run() -> None:
    pool = example(schedules=[NIGHTLY, {"name": "often", "kind": "reindex", "every": 60}])
    runs = [{"name": "nightly", "owner": "mdm/mdm-jobs", "last_run_at": NOW - timedelta(hours=9),
             "next_run_at": NOW + timedelta(hours=15), "missed_total": 1, "last_error": None}]
    entries = status.schedule_status(pool, runs, None)
    assert entries == [
        {"name": "nightly", "kind": "reindex", "expression": "0 3 * * *",
         "lastRunTime": "2026-11-01T03:00:00Z", "nextRunTime": "2026-11-02T03:00:00Z",
         "missedTicks": 1, "lastError": None},
        {"name": "often", "kind": "reindex", "expression": "every 60s"},  # not declared yet
    ]
    written = status.pool_status([], [], 1, NOW, None, entries)
    assert written["schedules"] == entries
    # a failed read keeps what the status showed; a pool without schedules shows none
    assert status.schedule_status(pool, None, written) == entries
    assert "schedules" not in status.pool_status([], [], 1, NOW, None, [])


def test_the_schedule_status_fields_are_declared_in_the_crd() -> None:
    from jobpool.core import poolspec

    crd = poolspec.crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    declared = crd["properties"]["status"]["properties"]["schedules"]["items"]["properties"]
    pool = example(schedules=[NIGHTLY])
    runs = [{"name": "nightly", "owner": "mdm/mdm-jobs", "last_run_at": None,
             "next_run_at": NOW, "missed_total": 0, "last_error": "x"}]
    [entry] = status.schedule_status(pool, runs, None)
    [elsewhere] = status.schedule_status(pool, [{**runs[0], "owner": "imports/mdm-jobs"}], None)
    assert set(entry) | set(elsewhere) <= set(declared)


def test_a_schedule_another_pool_declared_shows_its_owner_not_its_runs() -> None:
    """Pool mdm/mdm-jobs declares `nightly` and `often`: `nightly` belongs to the pool of the
    same name in namespace imports, `often` still to this pool's former owner name (its
    workers take it over when they start). Neither shows the runs of the row."""
    pool = example(schedules=[NIGHTLY, {"name": "often", "kind": "reindex", "every": 60}])
    theirs = {"last_run_at": None, "next_run_at": None, "missed_total": None,
              "last_error": None}
    runs = [{"name": "nightly", "owner": "imports/mdm-jobs", **theirs},
            {"name": "often", "owner": "mdm-jobs", **theirs}]
    entries = status.schedule_status(pool, runs, None)
    assert entries == [
        {"name": "nightly", "kind": "reindex", "expression": "0 3 * * *",
         "declaredBy": "imports/mdm-jobs"},
        {"name": "often", "kind": "reindex", "expression": "every 60s"}]
    degraded = {c.type: c for c in status.pool_conditions(
        pool, [], count_error=None, schedules=entries)}["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "ScheduleDeclaredElsewhere")
    assert degraded.message.startswith(
        "schedule 'nightly' is declared by pool 'imports/mdm-jobs': ")
