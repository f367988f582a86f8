"""The operator (kopf) against a fake Kubernetes API over real HTTP, and real PostgreSQL.

The operator runs as the chart's ServiceAccount under the chart's own rendered RBAC: the
fake API server answers 403 for every request the chart does not grant, as a real one
does. Scenarios: apply the example pool and see its Deployments; enqueue jobs and see a
lane scale up; change the image and keep the replicas; remove a lane and lose its
Deployment; delete the pool and lose its children; KEDA missing or not granted; a child
name taken by another pool; a reconcile that fails.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import kmock
import psycopg
import pytest
import yaml
from helm_binary import render_chart, require_helm
from k8s_emulator import (
    Failure,
    KubernetesApi,
    RawClient,
    User,
    declare,
    install_pool_crd,
    service_account,
    write_kubeconfig,
)
from operator_rbac import KEDA_NEEDS, OPERATOR_NEEDS, rbac_objects

from jobpool.core.crd import API_VERSION, PLURAL
from jobpool.db.lane_counts import count_lane_jobs_at
from jobpool.k8s.handlers import CountJobs, OperatorConfig, run_operator
from jobpool.k8s.lease import LeaseTiming

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "mdm"
POOLS = f"/apis/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
SCALED_OBJECTS = f"/apis/keda.sh/v1alpha1/namespaces/{NAMESPACE}/scaledobjects"
TRIGGER_AUTHS = f"/apis/keda.sh/v1alpha1/namespaces/{NAMESPACE}/triggerauthentications"
ADMIN_TOKEN, OPERATOR_TOKEN = "admin-token", "operator-token"
MERGE = "application/merge-patch+json"
WAIT = 30.0
"""Seconds a scenario may take before it counts as failed (generous; not a timing check)."""
OPERATOR_NAMESPACE = "jobpool-system"
QUICK_LEASE = LeaseTiming(duration=3.0, renew_every=1.0, renew_deadline=2.0, retry_every=0.2)
"""A short Lease, so that a test's operator leads at once (the first one creates it)."""

T = TypeVar("T")
Conn = psycopg.AsyncConnection[dict[str, Any]]


@dataclass
class Cluster:
    """The fake API server and an admin client for it (the operator runs as its own user)."""

    server: KubernetesApi
    api: RawClient
    url: str


@functools.cache
def chart_objects(helm: str, *values: str) -> tuple[dict[str, Any], ...]:
    """The chart rendered with `values` (e.g. "--set", "rbac.keda=true")."""
    return tuple(render_chart(helm, *values))


def operator_account(objects: Sequence[dict[str, Any]]) -> User:
    """The chart's ServiceAccount with what the chart's RBAC objects grant it."""
    (account,) = [obj for obj in objects if obj["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    return service_account(objects, meta["namespace"], meta["name"])


@pytest.fixture(scope="session")
def helm() -> str:
    return require_helm()


@asynccontextmanager
async def fake_cluster(
    dsn: str, operator: User, *, keda: bool = False, crd: bool = True
) -> AsyncIterator[Cluster]:
    """A fake API server (with KEDA's API if `keda`, without the JobWorkerPool CRD unless
    `crd`) whose OPERATOR_TOKEN is `operator`, and the DSN Secret in namespace mdm."""
    server = KubernetesApi(tokens={ADMIN_TOKEN: User("admin"), OPERATOR_TOKEN: operator})
    async with server, kmock.Server(server) as http:
        declare(server, keda=keda, crd=crd)
        api = RawClient(f"http://{http.host}:{http.port}", ADMIN_TOKEN)
        try:
            await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body={
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "jobpool-db", "namespace": NAMESPACE},
                "data": {"dsn": base64.b64encode(dsn.encode()).decode()},
            })
            yield Cluster(server, api, f"http://{http.host}:{http.port}")
        finally:
            await api.close()


@asynccontextmanager
async def operator_process(
    cluster: Cluster, kubeconfig: Path, *, token: str = OPERATOR_TOKEN,
    identity: str | None = None, lease: LeaseTiming = QUICK_LEASE,
    count_jobs: CountJobs | None = None, health: str | None = None, wait: bool = True,
) -> AsyncIterator[None]:
    """The operator running against `cluster` with `token`, as in a process of its own;
    serving its health at `health` (a URL) if given; started once kopf runs if `wait`."""
    write_kubeconfig(kubeconfig, cluster.url, token)
    # kopf gets a thread and event loop of its own, as in a real process: on stopping it
    # cancels every task its loop started after it, which must not be the test's.
    stop, ready = threading.Event(), threading.Event()
    config = OperatorConfig(scale_interval=0.5, kubeconfig=str(kubeconfig),
                            lease_namespace=OPERATOR_NAMESPACE, lease=lease, identity=identity,
                            liveness_endpoint=health)
    extra = {} if count_jobs is None else {"count_jobs": count_jobs}
    thread = threading.Thread(
        target=asyncio.run,
        args=(run_operator(config, stop_flag=stop, ready_flag=ready, **extra),),
        name=f"operator {identity or ''}", daemon=True,
    )
    thread.start()
    try:
        if wait:
            assert await asyncio.to_thread(ready.wait, WAIT), "the operator did not start"
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, WAIT)
    assert not thread.is_alive(), "the operator did not stop"


@asynccontextmanager
async def running_operator(
    tmp_path: Path, dsn: str, operator: User, *, keda: bool = False
) -> AsyncIterator[Cluster]:
    """A fake cluster (see fake_cluster) with the operator running as `operator`."""
    async with fake_cluster(dsn, operator, keda=keda) as cluster, operator_process(
        cluster, tmp_path / "operator.kubeconfig"
    ):
        yield cluster


@pytest.fixture
async def cluster(tmp_path: Path, dsn: str, helm: str) -> AsyncIterator[Cluster]:
    """The operator under the chart's default RBAC, in a cluster without KEDA."""
    async with running_operator(tmp_path, dsn, operator_account(chart_objects(helm))) as found:
        yield found


async def eventually(
    check: Callable[[], Awaitable[T | None]], what: str, wait: float = WAIT
) -> T:
    """Poll `check` until it returns something truthy; fail after `wait` seconds."""
    deadline = asyncio.get_running_loop().time() + wait
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
    # under the chart's default RBAC (no keda.sh rule): a pool without keda lanes never
    # calls KEDA's API, which a real server refuses with 403 whether KEDA exists or not
    found = await apply_example(cluster)
    pool = await pool_object(cluster)
    uid = pool["metadata"]["uid"]
    for name, deployment in found.items():
        owners = deployment["metadata"]["ownerReferences"]
        assert owners == [{"apiVersion": API_VERSION, "kind": "JobWorkerPool",
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
    conditions = {c["type"]: c for c in status["conditions"]}
    assert set(conditions) == {"Ready", "Degraded", "ScalingActive", "Reconciled"}
    assert (conditions["Reconciled"]["status"], conditions["Degraded"]["status"]) == (
        "True", "False")
    assert cluster.server.refusals == [], "the operator asked for what the chart does not grant"


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
                              content_type=MERGE)

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
                              content_type=MERGE)

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


# -- KEDA --------------------------------------------------------------------------------------


def with_lane_mode(document: dict[str, Any], lane: str, mode: str) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    for entry in changed["spec"]["lanes"]:
        if entry["name"] == lane:
            entry["autoscaling"] = {**(entry.get("autoscaling") or {}), "mode": mode}
    return changed


async def conditions_of(cluster: Cluster, name: str = "mdm-jobs") -> dict[str, dict[str, Any]]:
    status = (await pool_object(cluster, name)).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


async def condition_reason(
    cluster: Cluster, kind: str, reason: str, name: str = "mdm-jobs", wait: float = WAIT
) -> dict[str, dict[str, Any]]:
    """Wait until condition `kind` of pool `name` has `reason`; all its conditions."""

    async def check() -> dict[str, dict[str, Any]] | None:
        conditions = await conditions_of(cluster, name)
        return conditions if conditions.get(kind, {}).get("reason") == reason else None

    return await eventually(check, f"{kind}/{reason} on pool {name}", wait)


@pytest.mark.parametrize(("values", "keda", "expected"), [
    ((), True, "grant its ServiceAccount get, list, create, patch and delete on scaledobjects "
               "and triggerauthentications in API group keda.sh (chart value rbac.keda=true)"),
    (("--set", "rbac.keda=true"), False, "KEDA is not installed"),
], ids=["keda-not-granted", "keda-not-installed"])
async def test_keda_lane_without_keda_still_gets_every_deployment_and_says_why(
    tmp_path: Path, dsn: str, helm: str, values: tuple[str, ...], keda: bool, expected: str
) -> None:
    operator = operator_account(chart_objects(helm, *values))
    async with running_operator(tmp_path, dsn, operator, keda=keda) as cluster:
        await cluster.api.request("POST", POOLS,
                                  body=with_lane_mode(example_pool(), "acme", "keda"))
        await eventually(lambda: _has_all_example_deployments(cluster), "every lane's Deployment")
        conditions = await condition_reason(cluster, "Reconciled", "KedaUnavailable")
        message = conditions["Reconciled"]["message"]
        assert "lanes in keda mode (acme) keep their current replicas" in message
        assert expected in message
        assert conditions["Reconciled"]["status"] == "False"
        assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == (
            "False", "KedaUnavailable")
        assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == (
            "True", "KedaUnavailable")
        event = await eventually(lambda: event_with_reason(cluster, "KedaUnavailable"),
                                 "a KedaUnavailable event")
        assert event["type"] == "Warning"


async def test_keda_lane_gets_a_scaled_object_and_loses_it_when_it_leaves_keda_mode(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    operator = operator_account(chart_objects(helm, "--set", "rbac.keda=true"))
    async with running_operator(tmp_path, dsn, operator, keda=True) as cluster:
        await cluster.api.request("POST", POOLS,
                                  body=with_lane_mode(example_pool(), "acme", "keda"))

        async def scaled_objects() -> dict[str, dict[str, Any]]:
            answer = await cluster.api.request("GET", SCALED_OBJECTS)
            return {item["metadata"]["name"]: item for item in answer["items"]}

        found = await eventually(scaled_objects, "a ScaledObject")
        assert set(found) == {"mdm-jobs-acme"}
        (trigger,) = found["mdm-jobs-acme"]["spec"]["triggers"]
        assert trigger["authenticationRef"] == {"name": "mdm-jobs-dsn"}
        auth = await cluster.api.request("GET", f"{TRIGGER_AUTHS}/mdm-jobs-dsn")
        assert auth["spec"]["secretTargetRef"] == [
            {"parameter": "connection", "name": "jobpool-db", "key": "dsn"}]
        conditions = await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        assert conditions["Degraded"]["status"] == "False"
        lanes = example_pool()["spec"]["lanes"]
        await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs", body={"spec": {"lanes": lanes}},
                                  content_type=MERGE)

        async def gone() -> bool:
            return not await scaled_objects()

        await eventually(gone, "the ScaledObject of the lane that left keda mode deleted")

        async def auth_gone() -> bool:
            answer = await cluster.api.request("GET", TRIGGER_AUTHS)
            return not answer["items"]

        await eventually(auth_gone, "the TriggerAuthentication of a pool without keda lanes")
        assert cluster.server.refusals == []


async def _has_all_example_deployments(cluster: Cluster) -> bool:
    return set(await deployments(cluster)) == {
        "mdm-jobs-default", "mdm-jobs-bulk", "mdm-jobs-acme", "mdm-jobs-heavy"}


# -- children whose names are taken -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["operator", "keda"])
async def test_child_name_of_another_pool_is_left_alone_and_reported(
    tmp_path: Path, dsn: str, helm: str, mode: str
) -> None:
    # pool mdm with lane jobs-acme and pool mdm-jobs with lane acme both name their lane's
    # Deployment (and ScaledObject) mdm-jobs-acme
    operator = operator_account(chart_objects(helm, "--set", "rbac.keda=true"))
    async with running_operator(tmp_path, dsn, operator, keda=True) as cluster:
        first = with_lane_mode(example_pool(), "acme", mode)
        first["metadata"]["name"] = "mdm"
        for lane in first["spec"]["lanes"]:
            lane["name"] = "jobs-acme" if lane["name"] == "acme" else lane["name"]
        await cluster.api.request("POST", POOLS, body=first)
        await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec", name="mdm")
        theirs = await cluster.api.request("GET", f"{DEPLOYMENTS}/mdm-jobs-acme")
        kept = [theirs] + ([await cluster.api.request("GET", f"{SCALED_OBJECTS}/mdm-jobs-acme")]
                           if mode == "keda" else [])

        await cluster.api.request("POST", POOLS, body=with_lane_mode(example_pool(), "acme", mode))
        conditions = await condition_reason(cluster, "Degraded", "NameConflict")
        message = conditions["Degraded"]["message"]
        assert "Deployment 'mdm-jobs-acme' of lane 'acme' belongs to JobWorkerPool 'mdm'" in message
        assert (conditions["Ready"]["status"], conditions["Reconciled"]["status"]) == (
            "False", "False")
        found = await deployments(cluster)
        for lane in ("default", "bulk", "heavy"):
            owner = found[f"mdm-jobs-{lane}"]["metadata"]["ownerReferences"][0]["name"]
            assert owner == "mdm-jobs"
        for before in kept:
            path = DEPLOYMENTS if before["kind"] == "Deployment" else SCALED_OBJECTS
            after = await cluster.api.request("GET", f"{path}/mdm-jobs-acme")
            assert after["metadata"] == before["metadata"], f"{before['kind']} was changed"
            assert after["spec"] == before["spec"], f"{before['kind']} was changed"
        assert (await conditions_of(cluster, "mdm"))["Reconciled"]["status"] == "True"

        # once the other pool is gone, the next sync makes the lane's own children
        await cluster.api.request("DELETE", f"{POOLS}/mdm")
        conditions = await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        assert conditions["Degraded"]["status"] == "False"
        acme = (await deployments(cluster))["mdm-jobs-acme"]
        assert acme["metadata"]["ownerReferences"][0]["name"] == "mdm-jobs"


async def test_deployment_made_by_hand_is_left_alone(cluster: Cluster) -> None:
    by_hand = {"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "mdm-jobs-bulk", "namespace": NAMESPACE,
                            "labels": {"app": "legacy-importer"}},
               "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "legacy-importer"}},
                        "template": {"metadata": {"labels": {"app": "legacy-importer"}}}}}
    await cluster.api.request("POST", DEPLOYMENTS, body=by_hand)
    await cluster.api.request("POST", POOLS, body=example_pool())
    conditions = await condition_reason(cluster, "Reconciled", "NameConflict")
    assert ("Deployment 'mdm-jobs-bulk' of lane 'bulk' exists and was not made by the jobpool "
            "operator") in conditions["Reconciled"]["message"]
    found = await deployments(cluster)
    assert found["mdm-jobs-bulk"]["metadata"]["labels"] == {"app": "legacy-importer"}
    assert found["mdm-jobs-bulk"]["spec"]["replicas"] == 2


# -- a reconcile that fails ---------------------------------------------------------------------


def without_verb(
    objects: Sequence[dict[str, Any]], resource: str, verb: str
) -> list[dict[str, Any]]:
    """`objects` with `verb` taken out of every rule on `resource`."""
    changed = copy.deepcopy(list(objects))
    for obj in changed:
        for rule in obj.get("rules") or ():
            if resource in rule.get("resources", ()):
                rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    return changed


async def test_failed_reconcile_is_reported_and_never_healthy_until_it_succeeds(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    objects = chart_objects(helm)
    async with running_operator(tmp_path, dsn, operator_account(objects)) as cluster:
        document = example_pool()
        document["spec"]["lanes"][0]["minReplicas"] = 0  # every lane at 0 replicas: all ready
        await cluster.api.request("POST", POOLS, body=document)
        await condition_reason(cluster, "Ready", "AllLanesReady")

        cluster.server.tokens[OPERATOR_TOKEN] = operator_account(
            without_verb(objects, "deployments", "patch"))
        await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs",
                                  body={"spec": {"image": "jobpool:0.2.0"}}, content_type=MERGE)
        conditions = await condition_reason(cluster, "Ready", "ReconcileFailed")
        message = conditions["Reconciled"]["message"]
        assert "apply Deployment 'mdm-jobs-default' failed: 403 Forbidden" in message
        assert 'cannot patch resource "deployments" in API group "apps"' in message
        assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == (
            "True", "ReconcileFailed")

        # every sync tries again, and the status keeps saying so between the attempts
        refused = len(cluster.server.refusals)

        async def tried_twice_more() -> bool:
            return len(cluster.server.refusals) >= refused + 2 * 4  # four lanes each time

        await eventually(tried_twice_more, "two more attempts")
        after = await conditions_of(cluster)
        assert (after["Ready"]["status"], after["Degraded"]["status"]) == ("False", "True")
        assert after["Reconciled"]["reason"] == "ReconcileFailed"

        cluster.server.tokens[OPERATOR_TOKEN] = operator_account(objects)
        await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        images = {d["spec"]["template"]["spec"]["containers"][0]["image"]
                  for d in (await deployments(cluster)).values()}
        assert images == {"jobpool:0.2.0"}
        await condition_reason(cluster, "Ready", "AllLanesReady")


# -- what a real API server and other controllers do to the children --------------------------


def image_of(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def owned_fields(obj: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    return [entry for entry in obj["metadata"].get("managedFields") or ()
            if entry["manager"] == manager]


async def test_children_are_applied_without_replicas_which_the_scaler_owns(
    cluster: Cluster, conn: Conn, tenant: uuid.UUID
) -> None:
    await apply_example(cluster)
    await add_jobs(conn, tenant, "bulk_import", 8, "pending")

    async def bulk_scaled() -> dict[str, Any] | None:
        found = (await deployments(cluster))["mdm-jobs-bulk"]
        return found if found["spec"]["replicas"] == 4 else None

    bulk = await eventually(bulk_scaled, "bulk at 4 replicas")
    (applied,) = owned_fields(bulk, "jobpool-operator")
    assert applied["operation"] == "Apply"
    assert "f:replicas" not in applied["fieldsV1"]["f:spec"]
    assert "f:template" in applied["fieldsV1"]["f:spec"]
    (scaled,) = owned_fields(bulk, "jobpool-scaler")
    assert (scaled["subresource"], scaled["fieldsV1"]) == ("scale", {"f:spec": {"f:replicas": {}}})


async def test_fields_of_other_managers_survive_a_new_template(cluster: Cluster) -> None:
    # a PUT of the whole Deployment would wipe what other controllers (or people) add
    await apply_example(cluster)
    await cluster.api.request(
        "PATCH", f"{DEPLOYMENTS}/mdm-jobs-heavy", query={"fieldManager": "mesh-injector"},
        body={"metadata": {"annotations": {"mesh.example/inject": "true"}}},
        content_type=MERGE)
    await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs",
                              body={"spec": {"image": "jobpool:0.2.0"}}, content_type=MERGE)

    async def rolled() -> dict[str, Any] | None:
        heavy = (await deployments(cluster))["mdm-jobs-heavy"]
        return heavy if image_of(heavy) == "jobpool:0.2.0" else None

    heavy = await eventually(rolled, "the heavy lane on the new image")
    assert heavy["metadata"]["annotations"]["mesh.example/inject"] == "true"


async def test_a_deployment_deleted_by_hand_comes_back(cluster: Cluster) -> None:
    found = await apply_example(cluster)
    uid = found["mdm-jobs-bulk"]["metadata"]["uid"]
    await cluster.api.request("DELETE", f"{DEPLOYMENTS}/mdm-jobs-bulk")

    async def recreated() -> dict[str, Any] | None:
        bulk = (await deployments(cluster)).get("mdm-jobs-bulk")
        return bulk if bulk is not None and bulk["metadata"]["uid"] != uid else None

    await eventually(recreated, "mdm-jobs-bulk made again")

    async def at_min_replicas() -> bool:  # set right after the create, in a call of its own
        return await replicas_of(cluster, "mdm-jobs-bulk") == 0

    # the lane's minReplicas, not the server's default 1 (which the scaler would keep for
    # the lane's 300 s scale-down window)
    await eventually(at_min_replicas, "mdm-jobs-bulk at its lane's minReplicas 0")


async def test_an_image_changed_by_hand_is_restored(cluster: Cluster) -> None:
    await apply_example(cluster)
    containers = (await deployments(cluster))["mdm-jobs-acme"]["spec"]["template"]["spec"][
        "containers"]
    containers[0]["image"] = "evil/miner:latest"
    await cluster.api.request(
        "PATCH", f"{DEPLOYMENTS}/mdm-jobs-acme", query={"fieldManager": "kubectl-edit"},
        body={"spec": {"template": {"spec": {"containers": containers}}}}, content_type=MERGE)
    assert image_of((await deployments(cluster))["mdm-jobs-acme"]) == "evil/miner:latest"

    async def restored() -> bool:
        return image_of((await deployments(cluster))["mdm-jobs-acme"]) == "jobpool:0.1.0"

    await eventually(restored, "the pool's image back on mdm-jobs-acme")


async def test_an_idle_pool_gets_no_status_writes(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    counts = 0

    async def counting(dsn: str, lanes: Sequence[Any]) -> dict[str, Any]:
        nonlocal counts
        counts += 1
        return await count_lane_jobs_at(dsn, lanes)

    async with fake_cluster(dsn, operator_account(chart_objects(helm))) as cluster, \
            operator_process(cluster, tmp_path / "kubeconfig", count_jobs=counting):
        await apply_example(cluster)
        await condition_reason(cluster, "Ready", "AllLanesReady")

        async def settled() -> dict[str, Any] | None:
            pool = await pool_object(cluster)
            return pool if pool["status"]["readyReplicas"] == 1 else None  # default's one

        before = (await eventually(settled, "one ready replica"))["metadata"][
            "resourceVersion"]
        seen = counts

        async def counted_thrice() -> bool:
            return counts >= seen + 3

        await eventually(counted_thrice, "three more job counts")
        after = await pool_object(cluster)
        assert after["metadata"]["resourceVersion"] == before


async def test_a_pool_is_deleted_while_the_operator_is_down(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    async with fake_cluster(dsn, operator_account(chart_objects(helm))) as cluster:
        async with operator_process(cluster, tmp_path / "kubeconfig"):
            await apply_example(cluster)
            await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        assert "finalizers" not in (await pool_object(cluster))["metadata"]
        await cluster.api.request("DELETE", f"{POOLS}/mdm-jobs")
        with pytest.raises(Failure) as caught:
            await pool_object(cluster)
        assert caught.value.status == 404
        assert await deployments(cluster) == {}  # the owner references took them


async def test_a_pool_deleted_while_the_watch_is_cut_gets_no_children_again(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    # the watch, listed again after the gap, sends no DELETED: only the operator's own list
    # of the pools tells it the pool is gone; pool "other" shows that rounds go on
    counts = 0

    async def counting(dsn: str, lanes: Sequence[Any]) -> dict[str, Any]:
        nonlocal counts
        counts += 1
        return await count_lane_jobs_at(dsn, lanes)

    async with fake_cluster(dsn, operator_account(chart_objects(helm))) as cluster, \
            operator_process(cluster, tmp_path / "kubeconfig", count_jobs=counting):
        await apply_example(cluster)
        second = example_pool()
        second["metadata"]["name"] = "other"
        await cluster.api.request("POST", POOLS, body=second)
        await eventually(lambda: _has(cluster, "other-default"), "pool other's Deployments")
        await cluster.server.delete_in_watch_gap(f"{POOLS}/mdm-jobs")
        assert not [name for name in await deployments(cluster) if name.startswith("mdm-jobs")]
        seen = counts

        async def rounds_went_on() -> bool:
            return counts >= seen + 4  # one count per pool and round: rounds went on

        await eventually(rounds_went_on, "more syncs of pool other")
        assert not [name for name in await deployments(cluster) if name.startswith("mdm-jobs")]


async def test_the_finalizer_of_older_versions_is_removed(cluster: Cluster) -> None:
    document = example_pool()
    document["metadata"]["finalizers"] = ["jobs.mdm.io/finalizer"]
    await cluster.api.request("POST", POOLS, body=document)

    async def released() -> bool:
        return not (await pool_object(cluster))["metadata"].get("finalizers")

    await eventually(released, "the old finalizer removed")
    await cluster.api.request("DELETE", f"{POOLS}/mdm-jobs")
    with pytest.raises(Failure):
        await pool_object(cluster)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def health_of(url: str) -> tuple[int, dict[str, Any]] | None:
    """The status and body of `url`; None while nothing listens there."""
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as answer:
            return answer.status, await answer.json()
    except aiohttp.ClientConnectionError:
        return None


async def test_an_operator_started_before_its_crd_serves_pools_once_it_is_established(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    port = free_port()
    live, ready = f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/readyz"
    async with fake_cluster(dsn, operator_account(chart_objects(helm)), crd=False) as cluster, \
            operator_process(cluster, tmp_path / "kubeconfig", health=live, wait=False):

        async def waiting() -> tuple[int, dict[str, Any]] | None:
            found = await health_of(ready)
            return found if found is not None and "waiting" in found[1] else None

        code, body = await eventually(waiting, "the operator saying what it waits for")
        assert code == 503 and "jobworkerpools.jobs.mdm.io is not established" in body[
            "waiting"]
        assert await health_of(live) == (200, {"alive": True})  # alive: no restart helps
        install_pool_crd(cluster.server)

        async def serving() -> bool:
            return await health_of(ready) == (200, {"ready": True})

        await eventually(serving, "the operator ready")
        await apply_example(cluster)  # served: its Deployments appear


# -- two replicas -------------------------------------------------------------------------------


async def lease_holder(cluster: Cluster) -> str | None:
    try:
        lease = await cluster.api.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/"
                   "jobpool-operator")
    except Failure:
        return None
    holder = lease["spec"].get("holderIdentity")
    return str(holder) if holder else None


async def test_a_standby_replica_takes_over_within_30_seconds(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    # the Lease's real timing: 15 s, renewed every 5 s; the leader loses its API access
    # (as a crashed or cut-off pod would) and never gives the Lease up
    operator = operator_account(chart_objects(helm))
    async with fake_cluster(dsn, operator) as cluster:
        cluster.server.tokens["second-token"] = operator
        timing = LeaseTiming()
        async with operator_process(cluster, tmp_path / "a", identity="replica-a",
                                    lease=timing):
            await apply_example(cluster)
            assert await lease_holder(cluster) == "replica-a"
            async with operator_process(cluster, tmp_path / "b", token="second-token",
                                        identity="replica-b", lease=timing):
                await asyncio.sleep(1.0)  # b is up and sees a's Lease
                assert await lease_holder(cluster) == "replica-a"
                cluster.server.tokens[OPERATOR_TOKEN] = User("cut-off", grants=())

                async def b_leads() -> bool:
                    return await lease_holder(cluster) == "replica-b"

                await eventually(b_leads, "replica-b holding the Lease", wait=30.0)
                await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs",
                                          body={"spec": {"image": "jobpool:0.2.0"}},
                                          content_type=MERGE)

                async def rolled() -> bool:
                    images = {image_of(d) for d in (await deployments(cluster)).values()}
                    return images == {"jobpool:0.2.0"}

                await eventually(rolled, "the new leader rolling out the new image")


async def test_a_leader_that_stops_hands_over_at_once(
    tmp_path: Path, dsn: str, helm: str
) -> None:
    operator = operator_account(chart_objects(helm))
    async with fake_cluster(dsn, operator) as cluster, AsyncExitStack() as b:
        cluster.server.tokens["second-token"] = operator
        timing = LeaseTiming(duration=600.0, renew_every=5.0, renew_deadline=10.0,
                             retry_every=0.5)
        async with operator_process(cluster, tmp_path / "a", identity="replica-a",
                                    lease=timing):
            async def a_leads() -> bool:
                return await lease_holder(cluster) == "replica-a"

            await eventually(a_leads, "replica-a holding the Lease")
            await b.enter_async_context(operator_process(
                cluster, tmp_path / "b", token="second-token", identity="replica-b",
                lease=timing))
            assert await lease_holder(cluster) == "replica-a"

        # a released the Lease on its way out: b need not wait out the 600 s

        async def b_leads() -> bool:
            return await lease_holder(cluster) == "replica-b"

        await eventually(b_leads, "replica-b holding the Lease")


@pytest.mark.parametrize("keda", [False, True], ids=["without-keda", "with-keda"])
async def test_the_operator_needs_no_access_beyond_its_list(
    tmp_path: Path, dsn: str, keda: bool
) -> None:
    # RBAC of exactly tests/operator_rbac.py's list: a full life of a pool sees no 403
    needs = OPERATOR_NEEDS + (KEDA_NEEDS if keda else ())
    operator = operator_account(rbac_objects(needs, OPERATOR_NAMESPACE, "jp-jobpool"))
    async with running_operator(tmp_path, dsn, operator, keda=keda) as cluster:
        document = with_lane_mode(example_pool(), "acme", "keda" if keda else "operator")
        document["metadata"]["finalizers"] = ["jobs.mdm.io/finalizer"]  # of older versions
        await cluster.api.request("POST", POOLS, body=document)
        await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        lanes = [lane for lane in document["spec"]["lanes"] if lane["name"] != "bulk"]
        await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs", content_type=MERGE,
                                  body={"spec": {"lanes": lanes, "image": "jobpool:0.2.0"}})

        async def rolled() -> bool:
            found = await deployments(cluster)
            return "mdm-jobs-bulk" not in found and {
                image_of(d) for d in found.values()} == {"jobpool:0.2.0"}

        await eventually(rolled, "the new image rolled out and the bulk lane gone")
        await cluster.api.request("DELETE", f"{DEPLOYMENTS}/mdm-jobs-heavy")
        await eventually(lambda: _has(cluster, "mdm-jobs-heavy"), "mdm-jobs-heavy back")
        assert not (await pool_object(cluster))["metadata"].get("finalizers")
        assert cluster.server.refusals == []


async def _has(cluster: Cluster, name: str) -> bool:
    return name in await deployments(cluster)
