"""The chart's life on a real control plane: `helm upgrade` with a changed CRD changes it
on the server; `helm uninstall` keeps the CRD (crds.keep) and with it every pool."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helm_binary import CHART

from jobpool.core.crd import CRD_FILE, CRD_NAME

from .conftest import Tools, crd_established, restricted_namespace
from .helpers import OPERATOR_NAMESPACE, POOL, RELEASE, example_pool, pool_object, pools_path

pytestmark = pytest.mark.controlplane

CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
CRD_FILE = Path("files") / "crds" / CRD_FILE


def printer_columns(release: Tools) -> list[str]:
    crd = release.plane.admin.get(CRD)
    return [c["name"] for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", [])]


def upgrade(release: Tools, chart: Path) -> None:
    release.helm("upgrade", RELEASE, str(chart), "--namespace", OPERATOR_NAMESPACE,
                 "--reuse-values", "--wait=false")


def test_helm_upgrade_with_a_changed_crd_changes_it(release: Tools, tmp_path: Path) -> None:
    changed = tmp_path / "jobpool"
    shutil.copytree(CHART, changed)
    text = (changed / CRD_FILE).read_text()
    column = ("      additionalPrinterColumns:\n"
              "        - name: Upgraded\n          type: string\n          jsonPath: .spec.image\n")
    assert "      additionalPrinterColumns:\n" in text
    (changed / CRD_FILE).write_text(text.replace("      additionalPrinterColumns:\n", column, 1))
    assert "Upgraded" not in printer_columns(release)
    upgrade(release, changed)
    try:
        assert "Upgraded" in printer_columns(release)
    finally:
        upgrade(release, CHART)
    assert "Upgraded" not in printer_columns(release)


def test_helm_uninstall_keeps_the_crd_and_the_pools(release: Tools, dsn: str) -> None:
    plane = release.plane
    namespace = restricted_namespace(plane, dsn)
    plane.admin.create(pools_path(namespace), example_pool())
    release.helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait")
    try:
        assert crd_established(plane)  # helm.sh/resource-policy: keep
        assert pool_object(plane, namespace, POOL) is not None
        assert plane.admin.get(
            f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts/jp-jobpool") is None
    finally:  # the release the other tests run under
        release.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
                     "--set", "rbac.keda=true", "--wait=false")
    assert crd_established(plane)
