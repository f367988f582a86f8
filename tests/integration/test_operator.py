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
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock
import psycopg
import pytest
import yaml
from helm_binary import render_chart, require_helm
from k8s_emulator import (
    KubernetesApi,
    RawClient,
    User,
    declare,
    service_account,
    write_kubeconfig,
)
from operator_rbac import with_operator_access

from jobpool.k8s.handlers import OperatorConfig, run_operator
from jobpool.k8s.lease import LeaseTiming

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "mdm"
POOLS = f"/apis/jobs.mdm.io/v1alpha1/namespaces/{NAMESPACE}/jobworkerpools"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
SCALED_OBJECTS = f"/apis/keda.sh/v1alpha1/namespaces/{NAMESPACE}/scaledobjects"
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
    keda = "rbac.keda=true" in values
    return tuple(with_operator_access(render_chart(helm, *values), keda))


def operator_account(objects: Sequence[dict[str, Any]]) -> User:
    """The chart's ServiceAccount with what the chart's RBAC objects grant it."""
    (account,) = [obj for obj in objects if obj["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    return service_account(objects, meta["namespace"], meta["name"])


@pytest.fixture(scope="session")
def helm() -> str:
    return require_helm()


@asynccontextmanager
async def running_operator(
    tmp_path: Path, dsn: str, operator: User, *, keda: bool = False
) -> AsyncIterator[Cluster]:
    """A fake API server (with KEDA's API if `keda`), the DSN Secret in namespace mdm, and
    the operator running as `operator`."""
    server = KubernetesApi(tokens={ADMIN_TOKEN: User("admin"), OPERATOR_TOKEN: operator})
    async with server, kmock.Server(server) as http:
        declare(server, keda=keda)
        url = f"http://{http.host}:{http.port}"
        kubeconfig = write_kubeconfig(tmp_path / "operator.kubeconfig", url, OPERATOR_TOKEN)
        api = RawClient(url, ADMIN_TOKEN)
        await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body={
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "jobpool-db", "namespace": NAMESPACE},
            "data": {"dsn": base64.b64encode(dsn.encode()).decode()},
        })
        # kopf gets a thread and event loop of its own, as in a real process: on stopping it
        # cancels every task its loop started after it, which must not be the test's.
        stop, ready = threading.Event(), threading.Event()
        config = OperatorConfig(scale_interval=0.5, kubeconfig=str(kubeconfig),
                                lease_namespace=OPERATOR_NAMESPACE, lease=QUICK_LEASE)
        thread = threading.Thread(
            target=asyncio.run, args=(run_operator(config, stop_flag=stop, ready_flag=ready),),
            name="operator", daemon=True,
        )
        thread.start()
        try:
            assert await asyncio.to_thread(ready.wait, WAIT), "the operator did not start"
            yield Cluster(server, api, url)
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, WAIT)
            await api.close()
        assert not thread.is_alive(), "the operator did not stop"


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
    ((), True, 'grant its ServiceAccount get, list, create, update and delete on scaledobjects '
               'in API group keda.sh (chart value rbac.keda=true)'),
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
        conditions = await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        assert conditions["Degraded"]["status"] == "False"
        lanes = example_pool()["spec"]["lanes"]
        await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs", body={"spec": {"lanes": lanes}},
                                  content_type=MERGE)

        async def gone() -> bool:
            return not await scaled_objects()

        await eventually(gone, "the ScaledObject of the lane that left keda mode deleted")
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

        # once the other pool is gone, the retried reconcile makes the lane's own children; the
        # retry delay doubles with each failure, so on a slow machine the next one may be due
        # only after as long again as the failures so far took
        await cluster.api.request("DELETE", f"{POOLS}/mdm")
        conditions = await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec",
                                            wait=4 * WAIT)
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
            without_verb(objects, "deployments", "update"))
        await cluster.api.request("PATCH", f"{POOLS}/mdm-jobs",
                                  body={"spec": {"image": "jobpool:0.2.0"}}, content_type=MERGE)
        conditions = await condition_reason(cluster, "Ready", "ReconcileFailed")
        message = conditions["Reconciled"]["message"]
        assert "replace Deployment 'mdm-jobs-default' failed: 403 Forbidden" in message
        assert 'cannot update resource "deployments" in API group "apps"' in message
        assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == (
            "True", "ReconcileFailed")

        # the scale timer rewrites the status every interval: it must keep saying so
        counted = ((await pool_object(cluster)).get("status") or {}).get("lastCountTime")

        async def counted_again() -> dict[str, Any] | None:
            status = (await pool_object(cluster)).get("status") or {}
            return status if status.get("lastCountTime") != counted else None

        status = await eventually(counted_again, "another job count")
        after = {c["type"]: c for c in status["conditions"]}
        assert (after["Ready"]["status"], after["Degraded"]["status"]) == ("False", "True")
        assert after["Reconciled"]["reason"] == "ReconcileFailed"

        # the next retry may be due only after as long again as the failures so far took
        cluster.server.tokens[OPERATOR_TOKEN] = operator_account(objects)
        await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec", wait=4 * WAIT)
        images = {d["spec"]["template"]["spec"]["containers"][0]["image"]
                  for d in (await deployments(cluster)).values()}
        assert images == {"jobpool:0.2.0"}
        await condition_reason(cluster, "Ready", "AllLanesReady")
