"""A pool deleted while the operator's connection to the API server is cut (every watch
ends, new connections are refused) is not brought back: once the connection returns, the
operator makes none of its children again, and still serves the pools that exist. Nor does
a sync from a view of a pool that is gone, however it came to be stale."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobpool.k8s.client import KubeApi, load_config
from jobpool.k8s.handlers import PoolController

from .conftest import Operator, Tools, restricted_namespace
from .helpers import (
    POOL,
    deployments,
    deployments_path,
    described,
    eventually,
    example_pool,
    operator_writes,
    pool_object,
    pools_path,
)
from .proxy import CuttableProxy

pytestmark = pytest.mark.controlplane


@pytest.fixture
def proxy(release: Tools) -> Iterator[CuttableProxy]:
    found = CuttableProxy(release.plane.port)
    found.restore()
    try:
        yield found
    finally:
        found.cut()


def test_a_pool_deleted_during_a_watch_gap_stays_deleted(
    release: Tools, proxy: CuttableProxy, dsn: str, tmp_path: Path
) -> None:
    plane = release.plane
    operator = Operator(plane, tmp_path, server=proxy.url).start()
    try:
        gone, later = restricted_namespace(plane, dsn), restricted_namespace(plane, dsn)
        plane.admin.create(pools_path(gone), example_pool())
        eventually(lambda: len(deployments(plane, gone)) == 4, "the pool's Deployments",
                   logs=operator)
        proxy.cut()
        plane.admin.delete(f"{pools_path(gone)}/{POOL}")
        eventually(lambda: not plane.admin.items(deployments_path(gone)),
                   "the garbage collector to delete the children")
        writes_before = len(operator_writes(plane, gone))
        proxy.restore()
        # the operator is back: it serves a pool created after the gap
        plane.admin.create(pools_path(later), example_pool())
        eventually(lambda: len(deployments(plane, later)) == 4,
                   "the Deployments of a pool created after the gap", logs=operator)
        time.sleep(10)  # ten more syncs of every pool it knows
        assert deployments(plane, gone) == {}
        new_writes = operator_writes(plane, gone)[writes_before:]
        assert new_writes == [], described(new_writes)
    finally:
        operator.stop()


def test_a_sync_from_a_deleted_pools_view_creates_nothing(
    release: Tools, dsn: str, tmp_path: Path
) -> None:
    plane = release.plane
    namespace = restricted_namespace(plane, dsn)
    stale = plane.admin.create(pools_path(namespace), example_pool())
    plane.admin.delete(f"{pools_path(namespace)}/{POOL}")
    eventually(lambda: pool_object(plane, namespace) is None, "the pool to be deleted")
    account = Operator(plane, tmp_path)  # not started: the chart's ServiceAccount's kubeconfig

    async def sync(body: dict[str, Any]) -> dict[str, Any] | None:
        api = KubeApi(load_config(str(account.kubeconfig)))
        try:
            return await PoolController(api).sync(body)
        finally:
            await api.close()

    assert asyncio.run(sync(stale)) is None
    assert deployments(plane, namespace) == {}
    writes = operator_writes(plane, namespace, credential=account.credential)
    assert writes == [], described(writes)
