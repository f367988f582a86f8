"""A real Kubernetes control plane on 127.0.0.1 for the tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (a fake node whose pods become ready).

The binaries come from tests/controlplane/build.sh (pinned modules, a cache folder outside
the repository). The API server runs with real authentication (a static admin token and
ServiceAccount tokens signed by a key of its own), `--authorization-mode=Node,RBAC`, the
default admission chain (PodSecurity among it) plus OwnerReferencesPermissionEnforcement,
and an audit log of every write, from which the tests count what the operator wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import trustme
import urllib3
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from ports import free_port

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
ADMIN_TOKEN = "controlplane-admin"
NODE = "kwok-node-0"
START_WAIT = 120.0
"""Seconds the control plane may take to answer (etcd, then the API server's post-start
hooks; generous on a loaded 2-core machine: this is no timing check)."""


class ControlPlaneError(Exception):
    """A process of the control plane did not start or answer."""


def _pins() -> dict[str, str]:
    """The versions build.sh pins (KUBERNETES_VERSION=..., KEDA_VERSION=...)."""
    pins = {}
    for line in BUILD.read_text().splitlines():
        name, sign, value = line.partition("=")
        if sign and name.endswith("_VERSION") and name.isupper():
            pins[name] = value.strip()
    return pins


def _cache() -> Path:
    return Path(os.environ.get("JOBPOOL_CONTROLPLANE_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jobpool" / "controlplane")


def binaries_folder() -> Path | None:
    """The folder build.sh fills (None when it has not been built: build.sh would build it).

    Asks build.sh itself for the folder only through its cache layout: the versions are in
    the folder name, so a changed pin is a missing build, never a stale one.
    """
    explicit = os.environ.get("JOBPOOL_CONTROLPLANE_BIN")
    if explicit:
        folder = Path(explicit)
        return folder if all((folder / name).is_file() for name in BINARIES) else None
    versions = _pins()
    folder = _cache() / (f"kubernetes-{versions['KUBERNETES_VERSION']}-etcd-"
                         f"{versions['ETCD_VERSION']}-kwok-{versions['KWOK_VERSION']}") / "bin"
    complete = (folder / ".complete").is_file() and (folder / "kwok-stages.yaml").is_file()
    return folder if complete else None


def keda_crd_files() -> list[Path] | None:
    """KEDA's ScaledObject and TriggerAuthentication CRDs (YAML files) that build.sh fetched
    from KEDA's module, or None when it has not fetched them."""
    folder = _cache() / f"keda-{_pins()['KEDA_VERSION']}" / "crds"
    if not (folder / ".complete").is_file():
        return None
    return sorted(folder.glob("*.yaml"))


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # every write, with who wrote what; reads and watches are not logged
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete",
                                        "deletecollection"]},
        {"level": "None"},
    ],
}


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.popen is None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=20)
        self.popen = None

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise ControlPlaneError(f"{self.name} exited with {self.popen.returncode}:\n{tail}")


@dataclass
class ControlPlane:
    """The running control plane: its URL, CA, admin client and audit log."""

    bin: Path
    workdir: Path
    url: str = ""
    ca_file: Path = field(default_factory=Path)
    audit_log: Path = field(default_factory=Path)
    processes: dict[str, Process] = field(default_factory=dict)
    admin: Api = field(init=False)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost", "kubernetes.default.svc")
        self.ca_file = self.workdir / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        server.cert_chain_pems[0].write_to_path(str(self.workdir / "apiserver.pem"))
        server.private_key_pem.write_to_path(str(self.workdir / "apiserver-key.pem"))
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.workdir / "sa.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption()))
        (self.workdir / "sa.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        (self.workdir / "tokens.csv").write_text(
            f"{ADMIN_TOKEN},controlplane-admin,controlplane-admin-uid,system:masters\n")
        (self.workdir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log = self.workdir / "audit.log"

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{api_port}"
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.processes["etcd"] = Process("etcd", [
            str(self.bin / "etcd"), "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--unsafe-no-fsync",
            "--log-level", "warn",
        ], self.workdir / "etcd.log")
        self.processes["kube-apiserver"] = Process("kube-apiserver", [
            str(self.bin / "kube-apiserver"),
            "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(api_port),
            "--tls-cert-file", str(self.workdir / "apiserver.pem"),
            "--tls-private-key-file", str(self.workdir / "apiserver-key.pem"),
            "--client-ca-file", str(self.ca_file),
            "--token-auth-file", str(self.workdir / "tokens.csv"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(self.workdir / "sa.pub"),
            "--service-account-signing-key-file", str(self.workdir / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/24",
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "OwnerReferencesPermissionEnforcement",
            "--audit-policy-file", str(self.workdir / "audit-policy.yaml"),
            "--audit-log-path", str(self.audit_log), "--audit-log-format", "json",
            "--audit-log-mode", "blocking",
        ], self.workdir / "kube-apiserver.log")
        kubeconfig = self.write_kubeconfig(self.workdir / "admin.kubeconfig", ADMIN_TOKEN)
        self.processes["kube-controller-manager"] = Process("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), "--kubeconfig", str(kubeconfig),
            "--controllers", "deployment-controller,replicaset-controller,"
            "garbage-collector-controller,serviceaccount-controller,"
            "serviceaccount-token-controller,job-controller,namespace-controller",
            "--service-account-private-key-file", str(self.workdir / "sa.key"),
            "--root-ca-file", str(self.ca_file), "--leader-elect=false",
            "--secure-port", "0", "--concurrent-gc-syncs", "5",
        ], self.workdir / "kube-controller-manager.log")
        self.processes["kube-scheduler"] = Process("kube-scheduler", [
            str(self.bin / "kube-scheduler"), "--kubeconfig", str(kubeconfig),
            "--leader-elect=false", "--secure-port", "0",
        ], self.workdir / "kube-scheduler.log")
        self.processes["kwok"] = Process("kwok", [
            str(self.bin / "kwok"), "--kubeconfig", str(kubeconfig),
            "--config", str(self.bin / "kwok-stages.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds", "0",
        ], self.workdir / "kwok.log")

        self.admin = Api(self.url, ADMIN_TOKEN, self.ca_file)
        self.processes["etcd"].start()
        self.start_apiserver()
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self.processes[name].start()
        self.admin.create("/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": NODE, "type": "kwok"}},
        })
        self.wait_for(self.node_ready, "the kwok node to be Ready")
        # The API server taints a new Node not-ready; the node lifecycle controller, which
        # is not run here (there is no kubelet heartbeat to judge), would lift it.
        self.admin.patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}})
        self.wait_for(lambda: self.admin.get(
            "/api/v1/namespaces/default/serviceaccounts/default"), "the default ServiceAccount")

    def start_apiserver(self) -> None:
        """Start (or start again) the API server, and wait until it is ready."""
        self.processes["kube-apiserver"].start()
        self.wait_for(self.ready, "kube-apiserver /readyz")

    def stop_apiserver(self) -> None:
        """Stop the API server (every watch and connection ends); etcd keeps the data."""
        self.processes["kube-apiserver"].stop()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()

    def ready(self) -> bool:
        try:
            return self.admin.session.get(f"{self.url}/readyz", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def node_ready(self) -> bool:
        node = self.admin.get(f"/api/v1/nodes/{NODE}") or {}
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (node.get("status") or {}).get("conditions") or [])

    def wait_for(self, check: Any, what: str, wait: float = START_WAIT) -> Any:
        deadline = time.monotonic() + wait
        while True:
            for process in self.processes.values():
                process.check_alive()
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"gave up waiting for {what} (logs in {self.workdir})")
            time.sleep(0.5)

    def write_kubeconfig(self, path: Path, token: str, server: str | None = None) -> Path:
        """A kubeconfig for this API server (its CA; at `server`, e.g. a proxy's URL, if
        given) with a bearer `token`."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "controlplane",
            "clusters": [{"name": "controlplane", "cluster": {
                "server": server or self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "controlplane",
                          "context": {"cluster": "controlplane", "user": "user"}}],
        }))
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for ServiceAccount `name` from the TokenRequest API."""
        answer = self.admin.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}})
        return str(answer["status"]["token"])

    def audit_events(self) -> list[dict[str, Any]]:
        """Every write the API server logged so far (audit.k8s.io/v1 Events, stage
        ResponseComplete)."""
        events = []
        for line in self.audit_log.read_text().splitlines():
            if line.strip():
                event = json.loads(line)
                if event.get("stage") == "ResponseComplete":
                    events.append(event)
        return events


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status


class Api:
    """A small JSON client for the tests' own (admin) calls."""

    def __init__(self, url: str, token: str, ca_file: Path) -> None:
        self.url = url
        self.session = requests.Session()
        # REQUESTS_CA_BUNDLE would replace our CA, and a proxy would catch the loopback
        self.session.trust_env = False
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.verify = str(ca_file)

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json",
                params: Mapping[str, str] | None = None) -> Any:
        answer = self.session.request(
            method, f"{self.url}{path}", params=params, timeout=30,
            data=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type})
        if answer.status_code >= 400:
            raise ApiError(answer.status_code, answer.text)
        return answer.json() if answer.content else None

    def get(self, path: str) -> Any:
        """The object at `path`, or None (404)."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any, *, kind: str = "merge",
              params: Mapping[str, str] | None = None) -> Any:
        types = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "apply": "application/apply-patch+yaml"}
        return self.request("PATCH", path, body, content_type=types[kind], params=params)

    def delete(self, path: str, **params: str) -> Any:
        try:
            return self.request("DELETE", path, params=params)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, path: str, **params: str) -> list[dict[str, Any]]:
        return list(self.request("GET", path, params=params)["items"])


def run(args: Sequence[str], *, env: Mapping[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (helm, kubectl); fail with its output when `check` and it fails."""
    result = subprocess.run(list(args), capture_output=True, text=True, check=False,
                            env={**os.environ, **(env or {})}, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def started(bin_folder: Path, workdir: Path) -> Iterator[ControlPlane]:
    """A started control plane, stopped on exit."""
    urllib3.disable_warnings()
    plane = ControlPlane(bin_folder, workdir)
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
