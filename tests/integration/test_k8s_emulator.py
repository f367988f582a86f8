"""The fake API server does what a real one does: it refuses unknown callers, ungranted
requests (before it looks at the path), a taken name, values the CRD's schema refuses and
stale writes; it fills in defaults, bumps generation only for the spec, keeps status to its
subresource, lets finalizers hold a deletion, tracks field managers of server-side apply,
and serves a Deployment's scale subresource."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock
import pytest
from helm_binary import render_chart, require_helm
from k8s_emulator import (
    DISCOVERY,
    Failure,
    Grant,
    KubernetesApi,
    RawClient,
    Rule,
    User,
    declare,
    service_account,
    write_kubeconfig,
)

from jobpool.core.crd import API_VERSION, PLURAL
from jobpool.k8s.client import ApiError, KubeApi, load_config

OPERATOR = 'User "system:serviceaccount:jobpool-system:jp-jobpool"'
Connect = Callable[[str], RawClient]


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


@pytest.fixture
async def connect(helm: str) -> AsyncIterator[Connect]:
    """Clients of a fake API server (no KEDA) whose operator token has the chart's RBAC with
    operator.watchNamespaces={mdm}; tokens: "admin", "operator", anything else unknown."""
    objects = render_chart(helm, "--set", "operator.watchNamespaces={mdm}")
    operator = service_account(objects, "jobpool-system", "jp-jobpool")
    patcher = User("patcher", (DISCOVERY, Grant(Rule(
        verbs=("get", "patch"), api_groups=("apps",), resources=("deployments",)))))
    creator = User("creator", (DISCOVERY, Grant(Rule(
        verbs=("create",), api_groups=("apps",), resources=("deployments",)))))
    server = KubernetesApi(tokens={"admin": User("admin"), "operator": operator,
                                   "patcher": patcher, "creator": creator})
    clients: list[RawClient] = []
    async with server, kmock.Server(server) as http:
        declare(server)

        def client(token: str) -> RawClient:
            clients.append(RawClient(f"http://{http.host}:{http.port}", token))
            return clients[-1]

        yield client
        for api in clients:
            await api.close()


async def refusal(api: RawClient, method: str, path: str) -> Failure:
    with pytest.raises(Failure) as caught:
        await api.request(method, path, body={} if method != "GET" else None)
    return caught.value


async def test_unknown_callers_are_unauthorized(connect: Connect) -> None:
    error = await refusal(connect("stolen"), "GET", "/api")
    assert (error.status, error.reason) == (401, "Unauthorized")


async def test_discovery_is_open_to_every_authenticated_user(connect: Connect) -> None:
    assert (await connect("operator").request("GET", "/apis"))["kind"] == "APIGroupList"


@pytest.mark.parametrize(("path", "message"), [
    ("/apis/keda.sh/v1alpha1/namespaces/mdm/scaledobjects",
     f'scaledobjects.keda.sh is forbidden: {OPERATOR} cannot list resource "scaledobjects" in '
     'API group "keda.sh" in the namespace "mdm"'),
    ("/apis/nothing.example/v1/widgets/w",
     f'widgets.nothing.example "w" is forbidden: {OPERATOR} cannot get resource "widgets" in '
     'API group "nothing.example" at the cluster scope'),
])
async def test_ungranted_request_is_forbidden_even_for_an_api_that_does_not_exist(
    connect: Connect, path: str, message: str
) -> None:
    error = await refusal(connect("operator"), "GET", path)
    assert (error.status, error.reason, error.message) == (403, "Forbidden", message)
    assert (await refusal(connect("admin"), "GET", path)).status == 404


async def test_a_role_binding_grants_only_its_namespace(connect: Connect) -> None:
    operator = connect("operator")
    assert (await operator.request("GET", "/apis/apps/v1/namespaces/mdm/deployments"))[
        "items"] == []
    for path in ("/apis/apps/v1/namespaces/billing/deployments", "/apis/apps/v1/deployments"):
        assert (await refusal(operator, "GET", path)).status == 403


async def test_subresources_are_granted_by_name(connect: Connect) -> None:
    operator = connect("operator")
    pool = f"/apis/{API_VERSION}/namespaces/mdm/{PLURAL}/p"
    assert (await refusal(operator, "PATCH", f"{pool}/status")).status == 404  # granted
    assert (await refusal(operator, "PATCH",
                          "/apis/apps/v1/namespaces/mdm/deployments/d/scale")).status == 404
    error = await refusal(operator, "PATCH", "/apis/apps/v1/namespaces/mdm/deployments/d/status")
    assert error.status == 403
    assert 'cannot patch resource "deployments/status"' in error.message


async def test_create_of_a_taken_name_is_already_exists(connect: Connect) -> None:
    admin = connect("admin")
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "s", "namespace": "mdm"}, "data": {}}
    created = await admin.request("POST", "/api/v1/namespaces/mdm/secrets", body=secret)
    with pytest.raises(Failure) as caught:
        await admin.request("POST", "/api/v1/namespaces/mdm/secrets", body=secret)
    assert (caught.value.status, caught.value.reason) == (409, "AlreadyExists")
    assert caught.value.message == 'secrets "s" already exists'
    kept = await admin.request("GET", "/api/v1/namespaces/mdm/secrets/s")
    assert kept["metadata"]["uid"] == created["metadata"]["uid"]


# -- writes as a real API server makes them ----------------------------------------------------

POOLS = f"/apis/{API_VERSION}/namespaces/mdm/{PLURAL}"
DEPLOYMENTS = "/apis/apps/v1/namespaces/mdm/deployments"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"


def a_pool(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "JobWorkerPool",
            "metadata": {"name": "p", "namespace": "mdm"},
            "spec": {"image": "jobpool:1", "database": {"secretName": "db"},
                     "lanes": [{"name": "default"}], **spec}}


def a_deployment(image: str = "jobpool:1") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "mdm"},
            "spec": {"selector": {"matchLabels": {"app": "d"}},
                     "template": {"metadata": {"labels": {"app": "d"}},
                                  "spec": {"containers": [{"name": "w", "image": image}]}}}}


async def test_custom_resources_get_their_schemas_defaults(connect: Connect) -> None:
    created = await connect("admin").request("POST", POOLS, body=a_pool(unknown="pruned"))
    lane = created["spec"]["lanes"][0]
    assert (lane["workersPerPod"], lane["autoscaling"]["mode"]) == (4, "operator")
    assert created["spec"]["database"]["key"] == "dsn"
    assert "unknown" not in created["spec"]


async def test_values_the_schema_refuses_are_invalid(connect: Connect) -> None:
    bad = a_pool(lanes=[{"name": "default", "workersPerPod": 0}])
    error = await refusal_of(connect("admin").request("POST", POOLS, body=bad))
    assert (error.status, error.reason) == (422, "Invalid")
    assert 'JobWorkerPool.jobs.mdm.io "p" is invalid: spec.lanes.0.workersPerPod' in error.message


async def refusal_of(call: Any) -> Failure:
    with pytest.raises(Failure) as caught:
        await call
    return caught.value


async def test_generation_moves_with_the_spec_and_status_only_through_its_subresource(
    connect: Connect,
) -> None:
    admin = connect("admin")
    created = await admin.request("POST", POOLS, body={**a_pool(), "status": {"laneCount": 9}})
    assert created["metadata"]["generation"] == 1 and "status" not in created
    labelled = await admin.request("PATCH", f"{POOLS}/p", content_type=MERGE, body={
        "metadata": {"labels": {"a": "b"}}, "status": {"laneCount": 9}})
    assert labelled["metadata"]["generation"] == 1 and "status" not in labelled
    status = await admin.request("PATCH", f"{POOLS}/p/status", content_type=MERGE, body={
        "spec": {"image": "ignored"}, "status": {"laneCount": 1}})
    assert status["status"] == {"laneCount": 1} and status["spec"]["image"] == "jobpool:1"
    assert status["metadata"]["generation"] == 1
    changed = await admin.request("PATCH", f"{POOLS}/p", content_type=MERGE,
                                  body={"spec": {"image": "jobpool:2"}})
    assert changed["metadata"]["generation"] == 2
    assert changed["status"] == {"laneCount": 1}


async def test_a_merge_patch_stores_no_null_field_of_a_list_it_replaces(
    connect: Connect,
) -> None:
    # as the API server applies a merge patch (tests/controlplane: a schedule's status entry
    # written with lastRunTime null is read back without it)
    admin = connect("admin")
    await admin.request("POST", POOLS, body=a_pool())
    entry = {"name": "nightly", "kind": "reindex", "expression": "30 2 * * *",
             "lastRunTime": None, "missedTicks": 0}
    patched = await admin.request("PATCH", f"{POOLS}/p/status", content_type=MERGE,
                                  body={"status": {"schedules": [entry]}})
    assert patched["status"]["schedules"] == [
        {"name": "nightly", "kind": "reindex", "expression": "30 2 * * *", "missedTicks": 0}]


async def test_a_stale_resource_version_is_a_conflict(connect: Connect) -> None:
    admin = connect("admin")
    created = await admin.request("POST", POOLS, body=a_pool())
    await admin.request("PATCH", f"{POOLS}/p", content_type=MERGE,
                        body={"spec": {"image": "jobpool:2"}})
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
             "spec": {"image": "jobpool:3"}}
    for method in ("PATCH", "PUT"):
        body = stale if method == "PATCH" else {**created, **stale, "spec": {
            **created["spec"], "image": "jobpool:3"}}
        error = await refusal_of(admin.request(method, f"{POOLS}/p", body=body,
                                               content_type=MERGE if method == "PATCH"
                                               else "application/json"))
        assert (error.status, error.reason) == (409, "Conflict")
    assert (await admin.request("GET", f"{POOLS}/p"))["spec"]["image"] == "jobpool:2"


async def test_finalizers_hold_a_deletion_until_they_are_removed(connect: Connect) -> None:
    admin = connect("admin")
    pool = a_pool()
    pool["metadata"]["finalizers"] = ["example.com/cleanup"]
    await admin.request("POST", POOLS, body=pool)
    await admin.request("DELETE", f"{POOLS}/p")
    held = await admin.request("GET", f"{POOLS}/p")
    assert held["metadata"]["deletionTimestamp"]
    await admin.request("PATCH", f"{POOLS}/p", content_type=MERGE,
                        body={"metadata": {"finalizers": None}})
    assert (await refusal_of(admin.request("GET", f"{POOLS}/p"))).status == 404


async def test_a_deletion_takes_what_the_object_owns_or_orphans_it(connect: Connect) -> None:
    admin = connect("admin")
    for name in ("a", "b"):
        pool = await admin.request("POST", POOLS, body={
            **a_pool(), "metadata": {"name": name, "namespace": "mdm"}})
        owned = a_deployment()
        owned["metadata"].update(name=f"{name}-d", ownerReferences=[{
            "apiVersion": API_VERSION, "kind": "JobWorkerPool", "name": name,
            "uid": pool["metadata"]["uid"], "controller": True}])
        await admin.request("POST", DEPLOYMENTS, body=owned)
    await admin.request("DELETE", f"{POOLS}/a")
    await admin.request("DELETE", f"{POOLS}/b", query={"propagationPolicy": "Orphan"})
    left = (await admin.request("GET", DEPLOYMENTS))["items"]
    assert [d["metadata"]["name"] for d in left] == ["b-d"]
    assert "ownerReferences" not in left[0]["metadata"]


async def test_server_side_apply_tracks_field_managers(connect: Connect) -> None:
    admin = connect("admin")
    applied = await admin.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment(),
                                  content_type=APPLY, query={"fieldManager": "op"})
    assert applied["spec"]["replicas"] == 1  # the server's default; nobody applied it
    assert applied["status"]["readyReplicas"] == 1
    (entry,) = applied["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("op", "Apply")
    assert "f:replicas" not in entry["fieldsV1"]["f:spec"]

    # another manager changes a field the first one owns: the next apply conflicts ...
    await admin.request("PATCH", f"{DEPLOYMENTS}/d", content_type=MERGE,
                        query={"fieldManager": "editor"},
                        body={"spec": {"template": {"spec": {"containers": [
                            {"name": "w", "image": "other:1"}]}}}})
    error = await refusal_of(admin.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment(),
                                           content_type=APPLY, query={"fieldManager": "op"}))
    assert (error.status, error.reason) == (409, "Conflict")
    assert 'conflict with "editor": .spec.template.spec.containers' in error.message
    # ... unless forced, which takes the field back
    forced = await admin.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment(),
                                 content_type=APPLY,
                                 query={"fieldManager": "op", "force": "true"})
    assert forced["spec"]["template"]["spec"]["containers"][0]["image"] == "jobpool:1"
    assert "editor" not in {e["manager"] for e in forced["metadata"]["managedFields"]}

    # a field the manager stops applying goes
    labelled = a_deployment()
    labelled["metadata"]["labels"] = {"tier": "jobs"}
    await admin.request("PATCH", f"{DEPLOYMENTS}/d", body=labelled, content_type=APPLY,
                        query={"fieldManager": "op"})
    dropped = await admin.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment(),
                                  content_type=APPLY, query={"fieldManager": "op"})
    assert "tier" not in (dropped["metadata"].get("labels") or {})


async def test_the_scale_subresource_writes_replicas_alone(connect: Connect) -> None:
    admin = connect("admin")
    await admin.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment(), content_type=APPLY,
                        query={"fieldManager": "op"})
    scale = await admin.request("PATCH", f"{DEPLOYMENTS}/d/scale", content_type=MERGE,
                                query={"fieldManager": "scaler"}, body={"spec": {"replicas": 3}})
    assert (scale["kind"], scale["spec"]["replicas"]) == ("Scale", 3)
    deployment = await admin.request("GET", f"{DEPLOYMENTS}/d")
    assert (deployment["spec"]["replicas"], deployment["status"]["readyReplicas"]) == (3, 3)
    managers = {(e["manager"], e.get("subresource", "")): e["fieldsV1"]
                for e in deployment["metadata"]["managedFields"]}
    assert managers[("scaler", "scale")] == {"f:spec": {"f:replicas": {}}}
    # the applier's next apply (without replicas) leaves them as the scaler set them
    again = await admin.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment("jobpool:2"),
                                content_type=APPLY, query={"fieldManager": "op"})
    assert again["spec"]["replicas"] == 3


async def test_an_apply_that_creates_needs_create(connect: Connect) -> None:
    patcher = connect("patcher")  # may get and patch Deployments, not create them
    error = await refusal_of(patcher.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment(),
                                             content_type=APPLY, query={"fieldManager": "op"}))
    assert error.status == 403
    assert 'cannot create resource "deployments"' in error.message
    await connect("admin").request("POST", DEPLOYMENTS, body=a_deployment())
    applied = await patcher.request("PATCH", f"{DEPLOYMENTS}/d", body=a_deployment("jobpool:2"),
                                    content_type=APPLY,
                                    query={"fieldManager": "op", "force": "true"})
    assert applied["spec"]["template"]["spec"]["containers"][0]["image"] == "jobpool:2"


async def test_a_list_selects_by_name_and_refuses_other_fields(connect: Connect) -> None:
    admin = connect("admin")
    for name in ("p", "q"):
        await admin.request("POST", POOLS, body={**a_pool(), "metadata": {"name": name}})
    found = await admin.request("GET", POOLS, query={"fieldSelector": "metadata.name=q"})
    assert [item["metadata"]["name"] for item in found["items"]] == ["q"]
    others = await admin.request("GET", POOLS, query={"fieldSelector": "metadata.name!=q"})
    assert [item["metadata"]["name"] for item in others["items"]] == ["p"]
    with pytest.raises(Failure) as caught:
        await admin.request("GET", POOLS, query={"fieldSelector": "spec.image=jobpool:1"})
    assert (caught.value.status, caught.value.reason) == (400, "BadRequest")


@asynccontextmanager
async def operators_client(tmp_path: Path) -> AsyncIterator[tuple[KubernetesApi, KubeApi, str]]:
    """A fake API server (no KEDA, token "admin" only), the operator's client of it as admin,
    and its URL."""
    server = KubernetesApi(tokens={"admin": User("admin")})
    async with server, kmock.Server(server) as http:
        declare(server)
        url = f"http://{http.host}:{http.port}"
        api = KubeApi(load_config(str(write_kubeconfig(tmp_path / "k", url, "admin"))))
        try:
            yield server, api, url
        finally:
            await api.close()


async def test_the_operators_client_reads_one_pool_by_name(tmp_path: Path) -> None:
    async with operators_client(tmp_path) as (_, api, url):
        admin = RawClient(url, "admin")
        try:
            created = await admin.request("POST", POOLS, body=a_pool())
            await admin.request("POST", POOLS, body={**a_pool(), "metadata": {"name": "pq"}})
            found = await api.read_pool("mdm", "p")
            assert found is not None
            assert found["metadata"]["uid"] == created["metadata"]["uid"]
            assert await api.read_pool("mdm", "gone") is None
        finally:
            await admin.close()


async def test_the_operators_client_retries_throttled_writes(tmp_path: Path) -> None:
    async with operators_client(tmp_path) as (server, api, _):
        server.throttle = 3
        applied = await api.apply_child("Deployment", "mdm", a_deployment())
        assert applied["metadata"]["name"] == "d" and server.throttle == 0
        server.throttle = 10  # more than a few quick retries: the caller hears of it
        with pytest.raises(ApiError) as caught:
            await api.scale_deployment("mdm", "d", 2)
        assert caught.value.status == 429


async def test_an_owner_reference_that_blocks_deletion_needs_the_owners_finalizers(
    connect: Connect,
) -> None:
    owned = a_deployment()
    owned["metadata"]["ownerReferences"] = [{
        "apiVersion": API_VERSION, "kind": "JobWorkerPool", "name": "p",
        "uid": "u", "controller": True, "blockOwnerDeletion": True}]
    error = await refusal_of(connect("creator").request("POST", DEPLOYMENTS, body=owned))
    assert error.status == 403
    assert 'cannot update resource "jobworkerpools/finalizers"' in error.message
    del owned["metadata"]["ownerReferences"][0]["blockOwnerDeletion"]
    created = await connect("creator").request("POST", DEPLOYMENTS, body=owned)
    assert created["metadata"]["ownerReferences"][0]["name"] == "p"
