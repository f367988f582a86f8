"""The control plane (once per session), the chart installed on it, and the operator run
out-of-cluster as the chart's ServiceAccount.

Skips the tier when tests/controlplane/build.sh has not built the binaries, unless
JOBPOOL_CONTROLPLANE_REQUIRED is set (CI sets it after building them): then it fails.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helm_binary import CHART, require_helm
from ports import free_port

from jobpool.core.crd import CRD_NAME

from .control_plane import (
    ADMIN_TOKEN,
    ApiError,
    ControlPlane,
    binaries_folder,
    keda_crd_files,
    run,
    started,
)
from .helpers import OPERATOR_NAMESPACE, RELEASE, SERVICE_ACCOUNT

_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    folder = binaries_folder()
    if folder is None or keda_crd_files() is None:
        reason = "control plane not built: run tests/controlplane/build.sh"
        if os.environ.get("JOBPOOL_CONTROLPLANE_REQUIRED"):
            pytest.fail(f"{reason}; JOBPOOL_CONTROLPLANE_REQUIRED is set", pytrace=False)
        pytest.skip(reason)
    yield from started(folder, tmp_path_factory.mktemp("controlplane"))


@pytest.fixture(scope="session")
def helm() -> str:
    return require_helm()


@pytest.fixture(scope="session")
def kubectl(helm: str) -> str:
    found = shutil.which("kubectl") or str(Path(helm).with_name("kubectl"))
    if not Path(found).is_file():
        pytest.fail("kubectl not found: .ci/get-helm.sh puts it beside helm", pytrace=False)
    return found


@dataclass
class Tools:
    """helm and kubectl against the control plane, as its admin."""

    plane: ControlPlane
    helm_bin: str
    kubectl_bin: str
    kubeconfig: Path
    home: Path

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.home / "cache"),
                "HELM_CONFIG_HOME": str(self.home / "config"),
                "HELM_DATA_HOME": str(self.home / "data")}

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.helm_bin, *args], env=self.env(), check=check)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.kubectl_bin, *args], env=self.env(), check=check)


@pytest.fixture(scope="session")
def tools(control_plane: ControlPlane, helm: str, kubectl: str,
          tmp_path_factory: pytest.TempPathFactory) -> Tools:
    home = tmp_path_factory.mktemp("helm")
    kubeconfig = control_plane.write_kubeconfig(home / "admin.kubeconfig", ADMIN_TOKEN)
    return Tools(control_plane, helm, kubectl, kubeconfig, home)


def crd_established(plane: ControlPlane) -> bool:
    crd = plane.admin.get(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="session")
def release(tools: Tools) -> Tools:
    """The chart installed as release jp in jobpool-system (KEDA's RBAC on, so that the
    KEDA tests run under the chart's own rules), its CRD established."""
    tools.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
               "--create-namespace", "--set", "rbac.keda=true", "--wait=false")
    tools.plane.wait_for(lambda: crd_established(tools.plane), "the CRD to be Established")
    return tools


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture
def keda(release: Tools) -> Iterator[None]:
    """KEDA's ScaledObject and TriggerAuthentication CRDs (as KEDA ships them) installed and
    established for the test, and deleted after it: the other tests run without KEDA."""
    plane = release.plane
    names = []
    for path in keda_crd_files() or ():
        crd = yaml.safe_load(path.read_text())
        names.append(crd["metadata"]["name"])
        plane.admin.create(CRDS, crd)

    def established() -> bool:
        found = [plane.admin.get(f"{CRDS}/{name}") or {} for name in names]
        return all(any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or [])
                   for crd in found)

    def served() -> bool:  # storage comes up after Established: 429 until then
        try:
            for name in names:
                plural, group = name.split(".", 1)
                plane.admin.items(f"/apis/{group}/v1alpha1/{plural}")
        except ApiError as exc:
            if exc.status == 429:
                return False
            raise
        return True

    try:
        plane.wait_for(established, "KEDA's CRDs to be Established")
        plane.wait_for(served, "KEDA's resources to be served")
        yield
    finally:
        for name in names:
            plane.admin.delete(f"{CRDS}/{name}")
        plane.wait_for(lambda: all(plane.admin.get(f"{CRDS}/{name}") is None for name in names),
                       "KEDA's CRDs to be deleted")


def restricted_namespace(plane: ControlPlane, dsn: str) -> str:
    """A new namespace enforcing the restricted Pod Security level, with the Secret
    jobpool-db (key dsn) holding `dsn`."""
    name = f"pools-{next(_namespaces)}"
    plane.admin.create("/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest"}}})
    plane.admin.create(f"/api/v1/namespaces/{name}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "jobpool-db"},
        "data": {"dsn": base64.b64encode(dsn.encode()).decode()}})
    return name


@pytest.fixture
def namespace(release: Tools, dsn: str) -> str:
    return restricted_namespace(release.plane, dsn)


def credential_id(token: str) -> str:
    """How the audit log names a ServiceAccount token (its JWT id), to tell two operator
    processes of the same account apart."""
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return f"JTI={claims['jti']}"


class Operator:
    """`jobpool operator` in a process of its own, out-of-cluster, with a TokenRequest token
    of the chart's ServiceAccount (so every call goes through the chart's RBAC)."""

    def __init__(self, plane: ControlPlane, folder: Path, name: str = "operator",
                 extra_env: dict[str, str] | None = None,
                 server: str | None = None):
        self.plane, self.name = plane, name
        token = plane.service_account_token(OPERATOR_NAMESPACE, SERVICE_ACCOUNT)
        self.credential = credential_id(token)
        self.kubeconfig = plane.write_kubeconfig(folder / f"{name}.kubeconfig", token, server)
        self.log = folder / f"{name}.log"
        self.health = f"http://127.0.0.1:{free_port()}/healthz"
        self.env = {**os.environ, "JOBPOOL_LOG_LEVEL": "info", **(extra_env or {})}
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        jobpool = str(Path(sys.executable).with_name("jobpool"))
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [jobpool, "operator", "--kubeconfig", str(self.kubeconfig),
                 "--scale-interval", "1", "--lease-namespace", OPERATOR_NAMESPACE,
                 "--liveness", self.health],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        return self

    def signal(self, number: int) -> None:
        assert self.popen is not None
        self.popen.send_signal(number)

    def stop(self) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        self.popen = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def operator(release: Tools, tmp_path: Path) -> Iterator[Operator]:
    started_operator = Operator(release.plane, tmp_path).start()
    try:
        yield started_operator
    finally:
        started_operator.stop()
