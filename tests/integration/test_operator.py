"""The operator (kopf) against a fake Kubernetes API over real HTTP, and real PostgreSQL:
only what the control-plane tier (tests/controlplane) cannot do, see docs/operator.md,
"Control-plane tests".

The operator runs in a thread of the test's own process, as the chart's ServiceAccount under
RBAC the test generates: the fake answers 403 for every request not granted and records each
refusal, reads and watches included. Scenario: a full life of a pool under RBAC of exactly
tests/operator_rbac.py's list.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock
import pytest
import yaml
from k8s_emulator import (
    KubernetesApi,
    RawClient,
    User,
    declare,
    service_account,
    write_kubeconfig,
)
from operator_rbac import KEDA_NEEDS, OPERATOR_NEEDS, rbac_objects

from jobpool.k8s.handlers import OperatorConfig, run_operator
from jobpool.k8s.lease import LeaseTiming

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "mdm"
POOLS = f"/apis/jobs.mdm.io/v1alpha1/namespaces/{NAMESPACE}/jobworkerpools"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
ADMIN_TOKEN, OPERATOR_TOKEN = "admin-token", "operator-token"
MERGE = "application/merge-patch+json"
WAIT = 30.0
"""Seconds a scenario may take before it counts as failed (generous; not a timing check)."""
OPERATOR_NAMESPACE = "jobpool-system"
QUICK_LEASE = LeaseTiming(duration=3.0, renew_every=1.0, renew_deadline=2.0, retry_every=0.2)
"""A short Lease, so that a test's operator leads at once (the first one creates it)."""

T = TypeVar("T")


@dataclass
class Cluster:
    """The fake API server and an admin client for it (the operator runs as its own user)."""

    server: KubernetesApi
    api: RawClient
    url: str


def operator_account(objects: Sequence[dict[str, Any]]) -> User:
    """The ServiceAccount in `objects` with what their RBAC objects grant it."""
    (account,) = [obj for obj in objects if obj["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    return service_account(objects, meta["namespace"], meta["name"])


@asynccontextmanager
async def fake_cluster(
    dsn: str, operator: User, *, keda: bool = False
) -> AsyncIterator[Cluster]:
    """A fake API server (with KEDA's API if `keda`) whose OPERATOR_TOKEN is `operator`, and
    the DSN Secret in namespace mdm."""
    server = KubernetesApi(tokens={ADMIN_TOKEN: User("admin"), OPERATOR_TOKEN: operator})
    async with server, kmock.Server(server) as http:
        declare(server, keda=keda)
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
    cluster: Cluster, kubeconfig: Path
) -> AsyncIterator[None]:
    """The operator running against `cluster` as OPERATOR_TOKEN, as in a process of its own,
    once kopf runs."""
    write_kubeconfig(kubeconfig, cluster.url, OPERATOR_TOKEN)
    # kopf gets a thread and event loop of its own, as in a real process: on stopping it
    # cancels every task its loop started after it, which must not be the test's.
    stop, ready = threading.Event(), threading.Event()
    config = OperatorConfig(scale_interval=0.5, kubeconfig=str(kubeconfig),
                            lease_namespace=OPERATOR_NAMESPACE, lease=QUICK_LEASE)
    thread = threading.Thread(
        target=asyncio.run,
        args=(run_operator(config, stop_flag=stop, ready_flag=ready),),
        name="operator", daemon=True,
    )
    thread.start()
    try:
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


def image_of(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


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


async def test_a_schedule_another_pool_owns_is_named_in_the_status_without_its_runs(
    tmp_path: Path, dsn: str
) -> None:
    """Pool mdm/mdm-jobs declares `nightly`, which the pool of the same name in namespace
    imports declared first (on the same database): the status names that pool, shows none of
    its runs, and the pool is Degraded."""
    import psycopg

    from jobpool.core.schedules import parse_schedule
    from jobpool.worker.scheduler import Declarations
    from jobpool.worker.scheduler import declare as declare_schedules

    nightly = {"name": "nightly", "kind": "reindex", "cron": "30 2 * * *"}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await declare_schedules(conn, Declarations(
            "imports/mdm-jobs", (parse_schedule(nightly, "s"),), retire=True))
        await conn.execute("UPDATE mdm.aa_schedule SET last_run_at = now() - interval '1 day'")
    operator = operator_account(rbac_objects(OPERATOR_NEEDS, OPERATOR_NAMESPACE, "jp-jobpool"))
    async with running_operator(tmp_path, dsn, operator) as cluster:
        document = example_pool()
        document["spec"]["schedules"] = [nightly]
        await cluster.api.request("POST", POOLS, body=document)
        conditions = await condition_reason(cluster, "Degraded", "ScheduleDeclaredElsewhere")
        [entry] = (await pool_object(cluster))["status"]["schedules"]
    assert entry == {"name": "nightly", "kind": "reindex", "expression": "30 2 * * *",
                     "declaredBy": "imports/mdm-jobs"}
    assert "declared by pool 'imports/mdm-jobs'" in conditions["Degraded"]["message"]


# -- a deleted pool's schedules ----------------------------------------------------------------

NIGHTLY = {"name": "nightly", "kind": "reindex", "cron": "30 2 * * *"}


async def declared_by(dsn: str, owner: str) -> list[str]:
    """The names of the schedules `owner` declared."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT name FROM mdm.aa_schedule WHERE owner = %s ORDER BY name", (owner,))
        return [row[0] for row in await cur.fetchall()]


async def declare_nightly(dsn: str, owner: str, name: str = "nightly") -> None:
    """Declare NIGHTLY (named `name`) for `owner`, as the pool's workers do when they start
    (the fake cluster runs no pods)."""
    import psycopg

    from jobpool.core.schedules import parse_schedule
    from jobpool.worker.scheduler import Declarations
    from jobpool.worker.scheduler import declare as declare_schedules

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await declare_schedules(conn, Declarations(
            owner, (parse_schedule({**NIGHTLY, "name": name}, "s"),), retire=True))


async def delete_deployments(cluster: Cluster, pool: str = "mdm-jobs") -> None:
    """Delete `pool`'s Deployments (the ones the garbage collector left: orphaned)."""
    for name in await deployments(cluster):
        if name.startswith(f"{pool}-"):
            await cluster.api.request("DELETE", f"{DEPLOYMENTS}/{name}")


async def delete_orphaning(cluster: Cluster, pool: str = "mdm-jobs") -> None:
    """Delete the pool as `kubectl delete --cascade=orphan` does: its Deployments are left,
    without their ownerReference, pods and all."""
    await cluster.api.request("DELETE", f"{POOLS}/{pool}",
                              query={"propagationPolicy": "Orphan"})


async def full_rounds(cluster: Cluster, pool: str) -> None:
    """Until the operator has run two full rounds: `pool`'s Deployments deleted and restored
    twice (a round restores them before it looks at the pools that are gone)."""
    for _ in range(2):
        await delete_deployments(cluster, pool)
        await eventually(lambda: _has(cluster, f"{pool}-default"), f"{pool}-default restored")

def nightly_pool() -> dict[str, Any]:
    """The example pool with NIGHTLY in its spec."""
    document = example_pool()
    document["spec"]["schedules"] = [NIGHTLY]
    return document


@asynccontextmanager
async def pool_declaring_nightly(tmp_path: Path, dsn: str, *, in_spec: bool = True,
                                 marker: bool = False) -> AsyncIterator[Cluster]:
    """The operator running with pool mdm-jobs reconciled (`nightly_pool` if `in_spec`, else
    the example pool) and, if `marker`, pool marker (see `full_rounds`); NIGHTLY declared for
    mdm/mdm-jobs, as its workers do when they start (the fake cluster runs no pods)."""
    operator = operator_account(rbac_objects(OPERATOR_NEEDS, OPERATOR_NAMESPACE, "jp-jobpool"))
    async with running_operator(tmp_path, dsn, operator) as cluster:
        await cluster.api.request("POST", POOLS,
                                  body=nightly_pool() if in_spec else example_pool())
        if marker:
            other = example_pool()
            other["metadata"]["name"] = "marker"
            await cluster.api.request("POST", POOLS, body=other)
        await condition_reason(cluster, "Reconciled", "ChildrenMatchSpec")
        await declare_nightly(dsn, "mdm/mdm-jobs")
        yield cluster


async def retired(dsn: str) -> bool:
    """Whether mdm/mdm-jobs declares no schedule any more."""
    return await declared_by(dsn, "mdm/mdm-jobs") == []


async def test_a_deleted_pools_schedules_are_retired_once_its_deployments_are_gone(
    tmp_path: Path, dsn: str
) -> None:
    import psycopg

    await declare_nightly(dsn, "imports/mdm-jobs", "imports-nightly")  # a namesake's
    async with pool_declaring_nightly(tmp_path, dsn, marker=True) as cluster:
        await delete_orphaning(cluster)
        await full_rounds(cluster, "marker")
        # a Deployment of it is left, whose pods may run its schedules, and which a pool
        # created again would take over, pods and all: not retired
        assert await declared_by(dsn, "mdm/mdm-jobs") == ["nightly"]
        await delete_deployments(cluster)
        await eventually(lambda: retired(dsn), "the deleted pool's schedules retired")
        assert cluster.server.refusals == []
    assert await declared_by(dsn, "imports/mdm-jobs") == ["imports-nightly"]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT actor_principal_id, payload FROM mdm.aa_audit_log "
            "WHERE action = 'schedules_retired' AND payload->>'owner' = 'mdm/mdm-jobs'")
        [(actor, payload)] = await cur.fetchall()
    assert actor == "jobpool-operator"
    assert list(payload["schedules"]) == ["nightly"]


async def test_a_pool_deleted_and_created_again_keeps_its_schedules(
    tmp_path: Path, dsn: str
) -> None:
    """An orphaning delete, then the pool created again: it takes over the Deployments left,
    whose pods declared the schedules before and will not again, so nothing may retire
    them."""
    async with pool_declaring_nightly(tmp_path, dsn, marker=True) as cluster:
        await delete_orphaning(cluster)
        await cluster.api.request("POST", POOLS, body=nightly_pool())
        uid = (await pool_object(cluster))["metadata"]["uid"]

        async def taken_over() -> bool:
            found = await deployments(cluster)
            return all(d["metadata"].get("ownerReferences", [{}])[0].get("uid") == uid
                       for n, d in found.items() if n.startswith("mdm-jobs-"))

        await eventually(taken_over, "the Deployments left taken over by the pool")
        await full_rounds(cluster, "marker")
        assert await declared_by(dsn, "mdm/mdm-jobs") == ["nightly"]


async def test_a_deleted_pool_whose_secret_went_with_it_is_retired_at_its_last_database(
    tmp_path: Path, dsn: str
) -> None:
    # its namespace deleted, or one app holding the pool and its Secret
    async with pool_declaring_nightly(tmp_path, dsn) as cluster:
        await cluster.api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/secrets/jobpool-db")
        await cluster.api.request("DELETE", f"{POOLS}/mdm-jobs")
        await eventually(lambda: retired(dsn), "the deleted pool's schedules retired")


async def test_a_deleted_pools_unreachable_database_holds_up_no_other_pool(
    tmp_path: Path, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with pool_declaring_nightly(tmp_path, dsn, marker=True) as cluster:
        unreachable = "postgresql://jobpool@127.0.0.1:1/jobpool?connect_timeout=2"
        await cluster.api.request(
            "PATCH", f"/api/v1/namespaces/{NAMESPACE}/secrets/jobpool-db", content_type=MERGE,
            body={"data": {"dsn": base64.b64encode(unreachable.encode()).decode()}})
        await cluster.api.request("DELETE", f"{POOLS}/mdm-jobs")

        async def warned() -> str | None:
            return next((r.getMessage() for r in caplog.records if r.levelname == "WARNING"
                         and "retiring the schedules of deleted" in r.getMessage()), None)

        message = await eventually(warned, "the failed retirement logged")
        await full_rounds(cluster, "marker")  # the other pool's children still repaired
    assert "JobWorkerPool mdm/mdm-jobs failed (1 tries in a row" in message
    assert await declared_by(dsn, "mdm/mdm-jobs") == ["nightly"]


async def test_a_deleted_pool_loses_schedules_its_last_spec_had_dropped(
    tmp_path: Path, dsn: str
) -> None:
    # the schedule left the spec, and the pool was deleted before its workers, started
    # again, retired it
    async with pool_declaring_nightly(tmp_path, dsn, in_spec=False) as cluster:
        await cluster.api.request("DELETE", f"{POOLS}/mdm-jobs")
        await eventually(lambda: retired(dsn), "the schedule the spec had dropped retired")
