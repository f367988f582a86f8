"""The operator (kopf) against a fake Kubernetes API over real HTTP, and real PostgreSQL.

Scenarios of issue 4: apply the example pool and see its Deployments; enqueue jobs and
see a lane scale up; change the image and keep the replicas; remove a lane and lose its
Deployment; delete the pool and lose its children.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock
import psycopg
import pytest
import yaml
from k8s_emulator import KubernetesApi, declare, write_kubeconfig

from jobpool.k8s.client import KubeApi, load_configuration
from jobpool.k8s.handlers import OperatorConfig, run_operator

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "mdm"
POOLS = f"/apis/jobs.mdm.io/v1alpha1/namespaces/{NAMESPACE}/jobworkerpools"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
WAIT = 30.0
"""Seconds a scenario may take before it counts as failed (generous; not a timing check)."""

T = TypeVar("T")
Conn = psycopg.AsyncConnection[dict[str, Any]]


@dataclass
class Cluster:
    """The fake API server, a client for it, and its kubeconfig."""

    server: KubernetesApi
    api: KubeApi
    kubeconfig: Path


@pytest.fixture
async def cluster(tmp_path: Path, dsn: str) -> AsyncIterator[Cluster]:
    """A fake API server with the DSN Secret in namespace mdm, and a running operator."""
    async with KubernetesApi() as server, kmock.Server(server) as http:
        declare(server)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://{http.host}:{http.port}")
        api = KubeApi(load_configuration(str(kubeconfig)))
        await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body={
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "jobpool-db", "namespace": NAMESPACE},
            "data": {"dsn": base64.b64encode(dsn.encode()).decode()},
        })
        # kopf gets a thread and event loop of its own, as in a real process: on stopping it
        # cancels every task its loop started after it, which must not be the test's.
        stop, ready = threading.Event(), threading.Event()
        config = OperatorConfig(scale_interval=0.5, kubeconfig=str(kubeconfig))
        thread = threading.Thread(
            target=asyncio.run, args=(run_operator(config, stop_flag=stop, ready_flag=ready),),
            name="operator", daemon=True,
        )
        thread.start()
        try:
            assert await asyncio.to_thread(ready.wait, WAIT), "the operator did not start"
            yield Cluster(server, api, kubeconfig)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, WAIT)
            api.close()
        assert not thread.is_alive(), "the operator did not stop"


async def eventually(check: Callable[[], Awaitable[T | None]], what: str) -> T:
    """Poll `check` until it returns something truthy; fail after WAIT seconds."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        await asyncio.sleep(0.2)


def example_pool() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    document["metadata"]["namespace"] = NAMESPACE
    return document


async def deployments(cluster: Cluster) -> dict[str, dict[str, Any]]:
    answer = await cluster.api.request("GET", DEPLOYMENTS)
    return {item["metadata"]["name"]: item for item in answer["items"]}


async def pool_object(cluster: Cluster, name: str = "mdm-jobs") -> dict[str, Any]:
    result: dict[str, Any] = await cluster.api.request("GET", f"{POOLS}/{name}")
    return result


async def apply_example(cluster: Cluster) -> dict[str, Any]:
    await cluster.api.request("POST", POOLS, body=example_pool())
    expected = {"mdm-jobs-default", "mdm-jobs-bulk", "mdm-jobs-acme", "mdm-jobs-heavy"}

    async def created() -> dict[str, dict[str, Any]] | None:
        found = await deployments(cluster)
        return found if set(found) == expected else None

    return await eventually(created, f"Deployments {sorted(expected)}")


async def event_with_reason(cluster: Cluster, reason: str) -> dict[str, Any] | None:
    answer = await cluster.api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")
    found = [item for item in answer["items"] if item.get("reason") == reason]
    return found[0] if found else None


async def replicas_of(cluster: Cluster, name: str) -> int:
    return int((await deployments(cluster))[name]["spec"]["replicas"])


async def add_jobs(conn: Conn, tenant: uuid.UUID, kind: str, count: int, status: str) -> None:
    await conn.execute(
        "INSERT INTO mdm.aa_job_kind (name) VALUES (%s) ON CONFLICT DO NOTHING", (kind,))
    running = status == "running"
    await conn.execute(
        """
        INSERT INTO mdm.aa_job (tenant_id, job_kind, status, max_attempts, claimed_by, claimed_at)
        SELECT %(tenant)s, %(kind)s, %(status)s::mdm.job_status, 3,
               CASE WHEN %(running)s THEN 'w/1/x' END, CASE WHEN %(running)s THEN now() END
          FROM generate_series(1, %(count)s)
        """,
        {"tenant": tenant, "kind": kind, "status": status, "running": running, "count": count},
    )


async def test_example_pool_becomes_one_owned_deployment_per_lane(cluster: Cluster) -> None:
    found = await apply_example(cluster)
    pool = await pool_object(cluster)
    uid = pool["metadata"]["uid"]
    for name, deployment in found.items():
        owners = deployment["metadata"]["ownerReferences"]
        assert owners == [{"apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
                           "name": "mdm-jobs", "uid": uid, "controller": True,
                           "blockOwnerDeletion": True}], name
        labels = deployment["metadata"]["labels"]
        assert labels["jobs.mdm.io/pool"] == "mdm-jobs"
        assert f"mdm-jobs-{labels['jobs.mdm.io/lane']}" == name
        assert not any(key.startswith("kopf.") for key in deployment["metadata"].get(
            "annotations", {})), "kopf bookkeeping leaked onto a child"
        assert "finalizers" not in deployment["metadata"]
    container = found["mdm-jobs-heavy"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["run", "--slots", "1", "--grace", "30", "--kinds",
                                 "gin_backfill,index_sync"]
    env = {item["name"]: item for item in container["env"]}
    assert env["JOBPOOL_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "jobpool-db", "key": "dsn"}
    assert found["mdm-jobs-default"]["spec"]["replicas"] == 1  # minReplicas

    async def status_written() -> dict[str, Any] | None:
        status = (await pool_object(cluster)).get("status") or {}
        return status if status.get("observedGeneration") == 1 and status.get("lanes") else None

    status = await status_written_or_fail(status_written)
    assert [lane["name"] for lane in status["lanes"]] == ["default", "bulk", "acme", "heavy"]
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Degraded", "ScalingActive"}


async def status_written_or_fail(
    check: Callable[[], Awaitable[dict[str, Any] | None]]
) -> dict[str, Any]:
    return await eventually(check, "the pool's status")


async def test_enqueued_jobs_scale_the_lanes_that_serve_them(
    cluster: Cluster, conn: Conn, tenant: uuid.UUID
) -> None:
    await apply_example(cluster)
    # acme's outbox jobs: served by "default" (all tenants) and "acme"; not by "bulk"
    await add_jobs(conn, tenant, "outbox_dispatch", 17, "pending")
    await add_jobs(conn, tenant, "outbox_dispatch", 3, "running")

    async def scaled() -> bool:
        found = await deployments(cluster)
        return (found["mdm-jobs-default"]["spec"]["replicas"] == 5
                and found["mdm-jobs-acme"]["spec"]["replicas"] == 4)

    await eventually(scaled, "default at 5 replicas (20 jobs / 4 slots), acme at its max 4")
    assert await replicas_of(cluster, "mdm-jobs-bulk") == 0
    assert await replicas_of(cluster, "mdm-jobs-heavy") == 0

    async def reported() -> dict[str, Any] | None:
        status = (await pool_object(cluster)).get("status") or {}
        lanes = {lane["name"]: lane for lane in status.get("lanes") or []}
        default = lanes.get("default") or {}
        return lanes if default.get("lastScaleReason") == "ScaledUp" else None

    lanes = await eventually(reported, "the scale-up in the status")
    assert (lanes["default"]["readyJobs"], lanes["default"]["runningJobs"]) == (17, 3)
    assert lanes["default"]["desiredReplicas"] == 5
    assert lanes["bulk"]["readyJobs"] == 0
    await eventually(lambda: event_with_reason(cluster, "ScaledUp"), "a ScaledUp event")


async def test_new_image_keeps_the_scaled_replicas(
    cluster: Cluster, conn: Conn, tenant: uuid.UUID
) -> None:
    await apply_example(cluster)
    await add_jobs(conn, tenant, "bulk_import", 8, "pending")

    async def bulk_scaled() -> bool:
        return await replicas_of(cluster, "mdm-jobs-bulk") == 4

    await eventually(bulk_scaled, "bulk at 4 replicas (8 jobs / 2 slots)")
    await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs",
                              body={"spec": {"image": "jobpool:0.2.0"}},
                              content_type="application/merge-patch+json")

    async def rolled() -> dict[str, dict[str, Any]] | None:
        found = await deployments(cluster)
        images = {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in found.values()}
        return found if images == {"jobpool:0.2.0"} else None

    found = await eventually(rolled, "every lane on the new image")
    assert found["mdm-jobs-bulk"]["spec"]["replicas"] == 4
    assert found["mdm-jobs-default"]["spec"]["replicas"] == 1

    async def observed() -> bool:
        status = (await pool_object(cluster)).get("status") or {}
        return status.get("observedGeneration") == 2

    await eventually(observed, "observedGeneration 2")


async def test_removed_lane_loses_its_deployment(cluster: Cluster) -> None:
    await apply_example(cluster)
    document = example_pool()
    lanes = [lane for lane in document["spec"]["lanes"] if lane["name"] != "bulk"]
    await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs", body={"spec": {"lanes": lanes}},
                              content_type="application/merge-patch+json")

    async def removed() -> dict[str, dict[str, Any]] | None:
        found = await deployments(cluster)
        return found if "mdm-jobs-bulk" not in found else None

    found = await eventually(removed, "mdm-jobs-bulk deleted")
    assert set(found) == {"mdm-jobs-default", "mdm-jobs-acme", "mdm-jobs-heavy"}
    args = found["mdm-jobs-default"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--exclude-kinds") + 1] == "gin_backfill,index_sync"


async def test_deleted_pool_takes_its_children(cluster: Cluster) -> None:
    await apply_example(cluster)
    await cluster.api.request("DELETE", f"{POOLS}/mdm-jobs")

    async def gone() -> bool:
        return not await deployments(cluster)

    await eventually(gone, "every Deployment of the pool deleted")


async def test_invalid_spec_is_reported_not_applied(cluster: Cluster) -> None:
    document = example_pool()
    document["spec"]["lanes"].append({"name": "mail", "kinds": ["email_send"]})
    document["spec"]["lanes"].append({"name": "mail2", "kinds": ["email_send"]})
    await cluster.api.request("POST", POOLS, body=document)

    async def degraded() -> dict[str, Any] | None:
        status = (await pool_object(cluster)).get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        return conditions if conditions.get("Degraded", {}).get("reason") == "InvalidSpec" else None

    conditions = await eventually(degraded, "Degraded/InvalidSpec")
    assert "email_send claimed by lanes 'mail' and 'mail2'" in conditions["Degraded"]["message"]
    assert conditions["Ready"]["status"] == "False"
    assert await deployments(cluster) == {}
    event = await eventually(lambda: event_with_reason(cluster, "InvalidSpec"),
                             "an InvalidSpec event")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "mdm-jobs"


async def test_missing_secret_degrades_scaling(cluster: Cluster) -> None:
    document = example_pool()
    document["spec"]["database"]["secretName"] = "no-such-secret"
    await cluster.api.request("POST", POOLS, body=document)
    await eventually(lambda: _has_deployments(cluster), "Deployments despite the bad Secret")

    async def degraded() -> dict[str, Any] | None:
        status = (await pool_object(cluster)).get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        return conditions if conditions.get("Degraded", {}).get("reason") == "CountFailed" else None

    conditions = await eventually(degraded, "Degraded/CountFailed")
    assert "'no-such-secret'" in conditions["Degraded"]["message"]
    assert conditions["ScalingActive"]["status"] == "False"


async def _has_deployments(cluster: Cluster) -> bool:
    return bool(await deployments(cluster))
