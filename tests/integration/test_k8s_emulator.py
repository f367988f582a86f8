"""The fake API server refuses what a real one refuses: unknown callers, ungranted requests
(before it looks at the path), and a create of a name that is taken."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import kmock
import pytest
from helm_binary import render_chart, require_helm
from k8s_emulator import KubernetesApi, User, declare, service_account, write_kubeconfig

from jobpool.k8s.client import ApiError, KubeApi, load_configuration

OPERATOR = 'User "system:serviceaccount:jobpool-system:jp-jobpool"'
Connect = Callable[[str], KubeApi]


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


@pytest.fixture
async def connect(tmp_path: Path, helm: str) -> AsyncIterator[Connect]:
    """Clients of a fake API server (no KEDA) whose operator token has the chart's RBAC with
    operator.watchNamespaces={mdm}; tokens: "admin", "operator", anything else unknown."""
    objects = render_chart(helm, "--set", "operator.watchNamespaces={mdm}")
    operator = service_account(objects, "jobpool-system", "jp-jobpool")
    server = KubernetesApi(tokens={"admin": User("admin"), "operator": operator})
    clients: list[KubeApi] = []
    async with server, kmock.Server(server) as http:
        declare(server)

        def client(token: str) -> KubeApi:
            config = write_kubeconfig(tmp_path / f"{token}.kubeconfig",
                                      f"http://{http.host}:{http.port}", token)
            clients.append(KubeApi(load_configuration(str(config))))
            return clients[-1]

        yield client
        for api in clients:
            api.close()


async def refusal(api: KubeApi, method: str, path: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
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
    pool = "/apis/jobs.mdm.io/v1alpha1/namespaces/mdm/jobworkerpools/p"
    assert (await refusal(operator, "PATCH", f"{pool}/status")).status == 404  # granted
    error = await refusal(operator, "PATCH", "/apis/apps/v1/namespaces/mdm/deployments/d/scale")
    assert error.status == 403
    assert 'cannot patch resource "deployments/scale"' in error.message


async def test_create_of_a_taken_name_is_already_exists(connect: Connect) -> None:
    admin = connect("admin")
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "s", "namespace": "mdm"}, "data": {}}
    created = await admin.request("POST", "/api/v1/namespaces/mdm/secrets", body=secret)
    with pytest.raises(ApiError) as caught:
        await admin.request("POST", "/api/v1/namespaces/mdm/secrets", body=secret)
    assert (caught.value.status, caught.value.reason) == (409, "AlreadyExists")
    assert caught.value.message == 'secrets "s" already exists'
    kept = await admin.request("GET", "/api/v1/namespaces/mdm/secrets/s")
    assert kept["metadata"]["uid"] == created["metadata"]["uid"]
