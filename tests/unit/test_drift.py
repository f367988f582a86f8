"""Drift as a real API server shows it: a converged pool plans nothing, whatever the server
canonicalised and whatever other field managers added; a change to the operator's own
fields is still repaired."""

from __future__ import annotations

import copy
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from jobpool.core.crd import API_VERSION
from jobpool.core.poolspec import PoolSpec, load_pool
from jobpool.db.queries import Many
from jobpool.k8s import drift, manifests, reconcile

COUNT_LANE_JOBS = Many("count_lane_jobs")

ROOT = Path(__file__).resolve().parents[2]
OWNER = manifests.build_owner_reference({
    "apiVersion": API_VERSION, "kind": "JobWorkerPool",
    "metadata": {"name": "mdm-jobs", "namespace": "mdm", "uid": "5b1e-uid"},
})
COUNT = COUNT_LANE_JOBS.text
K8S_SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
K8S_VERSION = "1.33.0"
Live = dict[str, Any]


def example(**changes: Any) -> PoolSpec:
    document = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    document["metadata"]["namespace"] = "mdm"
    document["spec"].update(changes)
    return load_pool(document)


def non_canonical() -> PoolSpec:
    """The example with quantities written as a pool file may hold them."""
    document = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    lanes = document["spec"]["lanes"]
    lanes[0]["resources"] = {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                             "limits": {"cpu": 2, "memory": "0.5Gi"}}
    lanes[2]["resources"] = {"requests": {"cpu": "0.5"}}
    worker = {**document["spec"]["worker"], "nodeSelector": {"pool": "jobs"}}
    return example(lanes=lanes, imagePullSecrets=[{"name": "registry"}], worker=worker)


CANONICAL = {"0.5": "500m", "1024Mi": "1Gi", 2: "2", "0.5Gi": "512Mi"}


def stored(body: dict[str, Any], version: str = "7") -> Live:
    """`body` as the API server returns it: quantities canonical, defaults filled in,
    replicas and status of its own."""
    live = copy.deepcopy(body)
    live["metadata"].update(resourceVersion=version, uid="d-uid", generation=1)
    live["spec"]["replicas"] = 1
    live["spec"]["progressDeadlineSeconds"] = 600
    pod = live["spec"]["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler")
    for container in pod["containers"]:
        container["terminationMessagePath"] = "/dev/termination-log"
        for part in (container.get("resources") or {}).values():
            for name, value in part.items():
                part[name] = CANONICAL.get(value, str(value))
        for probe in ("livenessProbe", "readinessProbe"):
            container[probe]["successThreshold"] = 1
    live["status"] = {"replicas": 1, "readyReplicas": 1}
    return live


def plan(
    pool: PoolSpec, change: Callable[[Live], None] = lambda _: None
) -> reconcile.ReconcilePlan:
    live = []
    for body in reconcile.desired_deployments(pool, OWNER).values():
        obj = stored(body)
        change(obj)
        live.append(obj)
    return reconcile.plan_reconcile(pool, OWNER, live, None, COUNT)


def worker(obj: Live) -> dict[str, Any]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == manifests.CONTAINER)


# -- converged: nothing to apply -------------------------------------------------------------


def test_quantities_the_server_canonicalised_are_no_drift() -> None:
    pool = non_canonical()
    converged = plan(pool)
    assert converged.actions == () and len(converged.unchanged) == 4
    default = stored(reconcile.desired_deployments(pool, OWNER)["mdm-jobs-default"])
    assert worker(default)["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                            "limits": {"cpu": "2", "memory": "512Mi"}}


def set_env(obj: Live) -> None:  # kubectl set env deployment/... TZ=Europe/Berlin
    worker(obj)["env"].append({"name": "TZ", "value": "Europe/Berlin"})


def label_by_hand(obj: Live) -> None:  # kubectl label deployment/... and on the template
    obj["metadata"]["labels"]["team"] = "mdm"
    obj["spec"]["template"]["metadata"]["labels"]["cost-centre"] = "42"


def mutating_policy(obj: Live) -> None:  # a sidecar, its volume, an env var and a mount
    pod = obj["spec"]["template"]["spec"]
    pod["containers"].insert(0, {"name": "mesh-proxy", "image": "mesh/proxy:1",
                                 "ports": [{"containerPort": 15090, "protocol": "TCP"}]})
    pod["volumes"].append({"name": "mesh-certs", "emptyDir": {}})
    container = worker(obj)
    container["env"].insert(0, {"name": "MESH_ENABLED", "value": "1"})
    container["volumeMounts"].append({"name": "mesh-certs", "mountPath": "/etc/mesh"})
    container["ports"].append({"name": "mesh", "containerPort": 15001, "protocol": "TCP"})
    obj["spec"]["template"]["metadata"]["annotations"]["policy.example/mutated"] = "true"


def other_owner(obj: Live) -> None:  # a backup tool adds an ownerReference of its own
    obj["metadata"]["ownerReferences"].insert(0, {
        "apiVersion": "backup.example/v1", "kind": "Backup", "name": "nightly", "uid": "b-uid"})


def reordered(obj: Live) -> None:  # keyed lists in another order
    worker(obj)["env"].reverse()


@pytest.mark.parametrize("change", [set_env, label_by_hand, mutating_policy, other_owner,
                                    reordered])
def test_what_other_managers_add_is_no_drift(change: Callable[[Live], None]) -> None:
    converged = plan(non_canonical(), change)
    assert converged.actions == ()
    assert len(converged.unchanged) == 4


# -- drift of the operator's own fields: applied again ----------------------------------------


def env_value_changed(obj: Live) -> None:
    next(e for e in worker(obj)["env"] if e["name"] == "JOBPOOL_METRICS_PORT")["value"] = "1"


def env_removed(obj: Live) -> None:  # kubectl set env ... JOBPOOL_METRICS_PORT-
    worker(obj)["env"] = [e for e in worker(obj)["env"] if e["name"] != "JOBPOOL_METRICS_PORT"]


def cpu_changed(obj: Live) -> None:
    worker(obj)["resources"]["requests"]["cpu"] = "600m"


def argument_added(obj: Live) -> None:  # args are one atomic list
    worker(obj)["args"].append("--slots=99")


def port_changed(obj: Live) -> None:
    worker(obj)["ports"][0]["containerPort"] = 9999


def owner_reference_gone(obj: Live) -> None:  # an orphan: adopted again
    obj["metadata"]["ownerReferences"] = []


def privilege_escalation_allowed(obj: Live) -> None:
    del worker(obj)["securityContext"]["allowPrivilegeEscalation"]


@pytest.mark.parametrize("change", [env_value_changed, env_removed, cpu_changed, argument_added,
                                    port_changed, owner_reference_gone,
                                    privilege_escalation_allowed])
def test_a_change_to_the_operators_own_fields_is_applied_again(
    change: Callable[[Live], None],
) -> None:
    drifted = plan(non_canonical(), change)
    assert [(a.verb, a.seen) for a in drifted.actions] == [("apply", "7")] * 4
    assert drifted.unchanged == ()


def test_an_apply_remembers_the_version_it_was_planned_against() -> None:
    # a changed spec: the apply that follows is compared with the version it answers
    live = [stored(b, "41") for b in reconcile.desired_deployments(example(), OWNER).values()]
    applied = reconcile.plan_reconcile(example(image="jobpool:0.2.0"), OWNER, live, None, COUNT)
    assert {a.seen for a in applied.actions} == {"41"}
    created = reconcile.plan_reconcile(example(), OWNER, [], None, COUNT)
    assert {(a.creates, a.seen) for a in created.actions} == {(True, None)}


# -- the rules themselves ------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("500m", Fraction(1, 2)), ("0.5", Fraction(1, 2)), (0.5, Fraction(1, 2)), (2, Fraction(2)),
    ("1Gi", Fraction(2**30)), ("1024Mi", Fraction(2**30)), ("1e3", Fraction(1000)),
    ("1k", Fraction(1000)), ("+.5", Fraction(1, 2)), ("100n", Fraction(1, 10**7)),
    ("-1", Fraction(-1)), ("1E-3", Fraction(1, 1000)),
])
def test_quantities_have_their_exact_value(text: object, value: Fraction) -> None:
    assert drift.quantity_value(text) == value


@pytest.mark.parametrize("text", ["", "1 Gi", "1gi", "Gi", "1.2.3", "1Gim", True, None, [1]])
def test_what_is_no_quantity_has_no_value(text: object) -> None:
    assert drift.quantity_value(text) is None


def test_a_quantity_counts_by_value_only_where_the_schema_has_one() -> None:
    # an env value "0.5" is a string the server keeps as written: "500m" is another value
    desired = {"kind": "Deployment", "spec": {"template": {"spec": {"containers": [
        {"name": "worker", "env": [{"name": "RATIO", "value": "0.5"}]}]}}}}
    live = copy.deepcopy(desired)
    live["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "500m"
    assert not drift.in_sync(live, desired)


def test_an_empty_map_or_list_matches_a_field_the_server_left_out() -> None:
    desired = {"kind": "Deployment", "metadata": {"annotations": {}},
               "spec": {"template": {"spec": {"volumes": [], "tolerations": []}}}}
    assert drift.in_sync({"metadata": {}, "spec": {"template": {"spec": {}}}}, desired)
    others = {"metadata": {"annotations": {"a": "b"}}, "spec": {"template": {"spec": {
        "volumes": [{"name": "theirs", "emptyDir": {}}], "tolerations": []}}}}
    assert drift.in_sync(others, desired)
    # an atomic list is one field: items in it are not another manager's
    others["spec"]["template"]["spec"]["tolerations"] = [{"key": "x", "operator": "Exists"}]
    assert not drift.in_sync(others, desired)


def test_keda_objects_merge_only_their_owner_references_by_key() -> None:
    pool = example(lanes=[{"name": "default", "autoscaling": {"mode": "keda"}}])
    (scaled,) = reconcile.desired_scaled_objects(pool, OWNER, COUNT).values()
    live = copy.deepcopy(scaled)
    live["metadata"]["ownerReferences"].append({"apiVersion": "v1", "kind": "X", "name": "x",
                                                "uid": "x-uid"})
    live["metadata"]["finalizers"] = ["finalizer.keda.sh"]
    del live["apiVersion"], live["kind"]  # a list's items may come without their type
    live["spec"]["triggers"][0]["metadata"]["extra"] = "defaulted"
    assert drift.in_sync(live, scaled)
    live["spec"]["triggers"].append({"type": "cpu", "metadata": {"value": "50"}})
    assert not drift.in_sync(live, scaled)  # triggers: an atomic list, changed by hand


# -- the tables follow the Kubernetes schema ------------------------------------------------------


def _definitions() -> dict[str, Any]:
    import json

    path = K8S_SCHEMAS / f"v{K8S_VERSION}-local" / "_definitions.json"
    found: dict[str, Any] = json.loads(path.read_text())["$defs"]
    return found


def _schema_facts(
    value: Any, schema: dict[str, Any], definitions: dict[str, Any], path: drift.Path,
    lists: dict[drift.Path, tuple[str, ...]], quantities: set[drift.Path],
) -> None:
    """Walk `value` (a body the operator builds) along its schema: the keyed lists and the
    quantities in it."""
    while "$ref" in schema or "allOf" in schema:
        ref = schema["$ref"] if "$ref" in schema else schema["allOf"][0]["$ref"]
        schema = definitions[ref.rsplit("/", 1)[-1]]
        if ref.endswith("io.k8s.apimachinery.pkg.api.resource.Quantity"):
            quantities.add(path)
            return
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key, item in value.items():
            below = properties.get(key) or schema.get("additionalProperties") or {}
            step = drift.ANY if key not in properties and "additionalProperties" in schema \
                else key
            _schema_facts(item, below, definitions, (*path, step), lists, quantities)
    elif isinstance(value, list):
        if schema.get("x-kubernetes-list-type") == "map":
            lists[path] = tuple(schema["x-kubernetes-list-map-keys"])
        for item in value:
            _schema_facts(item, schema.get("items") or {}, definitions, (*path, drift.ITEM),
                          lists, quantities)


def test_keyed_lists_and_quantities_are_those_of_the_deployment_schema() -> None:
    definitions = _definitions()
    lists: dict[drift.Path, tuple[str, ...]] = {}
    quantities: set[drift.Path] = set()
    pool = non_canonical()
    for body in reconcile.desired_deployments(pool, OWNER).values():
        _schema_facts(body, definitions["io.k8s.api.apps.v1.Deployment"], definitions, (),
                      lists, quantities)
    assert lists and quantities
    table = drift.MAP_LISTS["Deployment"]
    assert {path: table.get(path) for path in lists} == lists
    patterns = drift.QUANTITIES["Deployment"]
    assert all(any(drift.path_matches(pattern, path) for pattern in patterns)
               for path in quantities), quantities
    # and the tables name nothing the schema has otherwise
    for path, keys in table.items():
        assert _list_keys_at(definitions, path) == keys, path


def _list_keys_at(definitions: dict[str, Any], path: drift.Path) -> tuple[str, ...] | None:
    schema = definitions["io.k8s.api.apps.v1.Deployment"]
    for step in path:
        while "$ref" in schema or "allOf" in schema:
            ref = schema["$ref"] if "$ref" in schema else schema["allOf"][0]["$ref"]
            schema = definitions[ref.rsplit("/", 1)[-1]]
        schema = schema["items"] if step == drift.ITEM else schema["properties"][step]
    keys = schema.get("x-kubernetes-list-map-keys")
    return tuple(keys) if keys else None
