"""An operator started before its CRD exists is alive but not ready, says what it waits
for, and serves pools once `helm upgrade` brings the CRD back and it is established."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from helm_binary import CHART

from jobpool.core.crd import CRD_NAME, GROUP, PLURAL

from .conftest import Operator, Tools, crd_established, restricted_namespace
from .helpers import OPERATOR_NAMESPACE, RELEASE, deployments, eventually, example_pool, pools_path

pytestmark = pytest.mark.controlplane

CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"


def answer(url: str) -> tuple[int, str]:
    try:
        found = requests.get(url, timeout=5)
    except requests.RequestException as exc:
        return 0, str(exc)
    return found.status_code, found.text


def naming_the_crd(url: str) -> tuple[int, str] | None:
    """The answer at `url` once it names the CRD (the first may say only "starting")."""
    status, text = answer(url)
    return (status, text) if PLURAL in text.lower() or GROUP in text else None


def test_an_operator_started_before_its_crd_serves_pools_once_it_is_established(
    release: Tools, dsn: str, tmp_path: Path
) -> None:
    plane = release.plane
    plane.admin.delete(CRD)
    eventually(lambda: plane.admin.get(CRD) is None, "the CRD to be deleted")
    operator = Operator(plane, tmp_path).start()
    readyz = operator.health.replace("/healthz", "/readyz")
    try:
        eventually(lambda: answer(operator.health)[0] == 200, "the liveness endpoint",
                   logs=operator)
        status, text = eventually(lambda: naming_the_crd(readyz),
                                  "/readyz naming the missing CRD", logs=operator)
        assert status == 503, text

        release.helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
                     "--reuse-values", "--wait=false")
        eventually(lambda: crd_established(plane), "the CRD to be established again")
        eventually(lambda: answer(readyz)[0] == 200, "the operator to be ready", logs=operator)
        namespace = restricted_namespace(plane, dsn)
        plane.admin.create(pools_path(namespace), example_pool())
        eventually(lambda: len(deployments(plane, namespace)) == 4,
                   "the pool's Deployments", logs=operator)
    finally:
        operator.stop()
        if not crd_established(plane):  # leave the session's release as the others expect
            release.helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
                         "--reuse-values", "--wait=false")
            eventually(lambda: crd_established(plane), "the CRD to be established again")
