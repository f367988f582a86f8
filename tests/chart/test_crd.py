"""The JobWorkerPool CRD: one source, shipped and upgraded by the chart, admitting only pools
whose children the API server accepts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_binary import render_chart

from jobpool.core.crd import CRD_FILE, CRD_NAME, GROUP, KIND, PLURAL, VERSION

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jobpool"
SOURCE = ROOT / "crds" / CRD_FILE
CRD_COPIES = [
    CHART / "files" / "crds" / CRD_FILE,
    ROOT / "operator" / "jobpool" / "crds" / CRD_FILE,
]
K8S_VERSION = "1.33.0"
HPA_MAX_STABILIZATION_SECONDS = 3600  # the HPA's (and so KEDA's) cap on a stabilization window


def crd() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(SOURCE.read_text())
    return document


def pool_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def example_pool() -> dict[str, Any]:
    pool: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    return pool


def rendered_crds(helm: str, *values: str) -> list[dict[str, Any]]:
    objects = render_chart(helm, *values)
    return [obj for obj in objects if obj["kind"] == "CustomResourceDefinition"]


def test_crd_copies_are_byte_identical() -> None:
    source = SOURCE.read_bytes()
    for copy_ in CRD_COPIES:
        assert copy_.read_bytes() == source, f"{copy_} differs from crds/{CRD_FILE}"


def test_the_chart_has_no_crds_folder() -> None:
    """Helm installs a chart's crds/ but never upgrades it, and the templated copy would clash."""
    assert not (CHART / "crds").exists()


def test_the_chart_installs_the_source_crd_and_keeps_it_on_uninstall(helm: str) -> None:
    (rendered,) = rendered_crds(helm)
    source = crd()
    assert rendered["spec"] == source["spec"]
    assert rendered["metadata"]["name"] == source["metadata"]["name"]
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    kubernetes_validate.validate(rendered, K8S_VERSION, strict=True)


def test_crd_values_turn_off_install_and_keep(helm: str) -> None:
    assert rendered_crds(helm, "--set", "crds.install=false") == []
    (rendered,) = rendered_crds(helm, "--set", "crds.keep=false")
    assert "annotations" not in rendered["metadata"]


def test_crd_is_structural_and_declares_status_and_columns() -> None:
    document = crd()
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    (version,) = document["spec"]["versions"]
    assert document["spec"]["names"]["shortNames"] == ["jwp"]
    assert document["spec"]["scope"] == "Namespaced"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:5] == ["Ready", "Lanes", "Replicas", "Ready-Jobs", "Running"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for field in ("observedGeneration", "lanes", "conditions"):
        assert field in status
    assert _every_node_typed(version["schema"]["openAPIV3Schema"])


def _every_node_typed(schema: Any) -> bool:
    """Structural: every schema node has a type (or is int-or-string / preserves unknowns)."""
    if not isinstance(schema, dict):
        return True
    if "type" not in schema and not schema.get("x-kubernetes-int-or-string") and not schema.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        return False
    children = list((schema.get("properties") or {}).values())
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            children.append(schema[key])
    return all(_every_node_typed(child) for child in children)


def test_example_pool_is_valid_against_the_crd_schema() -> None:
    document = crd()
    example = example_pool()
    jsonschema.Draft4Validator(pool_schema()).validate(example)
    assert example["kind"] == document["spec"]["names"]["kind"]
    assert example["apiVersion"] == (
        f"{document['spec']['group']}/{document['spec']['versions'][0]['name']}")


def _with(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    pool = copy.deepcopy(example_pool())
    node: Any = pool
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return pool


AUTOSCALING = ("spec", "lanes", 0, "autoscaling")


@pytest.mark.parametrize(("path", "accepted", "refused"), [
    # the ScaledObject's and HPA's scaleDown.stabilizationWindowSeconds: 0..3600
    ((*AUTOSCALING, "scaleDownStabilizationSeconds"), [0, HPA_MAX_STABILIZATION_SECONDS],
     [-1, HPA_MAX_STABILIZATION_SECONDS + 1, 86_400]),
    # KEDA hands the HPA workersPerPod x targetUtilization in thousandths: never 0
    ((*AUTOSCALING, "targetUtilization"), [0.01, 1], [0, 0.0005, 0.009, 1.5]),
    # an HPA scale-down policy's value must be positive
    ((*AUTOSCALING, "scaleDownMaxStep"), [1, 1000], [0]),
    # a container port
    (("spec", "worker", "metricsPort"), [1024, 65535], [0, 65536]),
    # node selector values are label values
    (("spec", "worker", "nodeSelector"), [{"disk": "ssd"}, {"zone": ""}],
     [{"disk": "SSD fast"}, {"disk": "x" * 64}]),
    # Secret names of imagePullSecrets are DNS subdomains
    (("spec", "imagePullSecrets"), [[{"name": "registry.example"}]], [[{"name": "Registry"}]]),
    # a container image has no whitespace
    (("spec", "image"), ["registry.example.com/jobpool:1.2.3"], ["jobpool:1 ", "job pool"]),
], ids=["stabilization", "target-utilization", "max-step", "metrics-port", "node-selector",
        "pull-secret", "image"])
def test_crd_ranges_admit_only_values_that_make_valid_children(
    path: tuple[str | int, ...], accepted: list[Any], refused: list[Any]
) -> None:
    validator = jsonschema.Draft4Validator(pool_schema())
    for value in accepted:
        assert not list(validator.iter_errors(_with(path, value))), value
    for value in refused:
        assert list(validator.iter_errors(_with(path, value))), value


def test_the_crd_declares_the_operators_group_version_and_names() -> None:
    document = crd()
    assert document["metadata"]["name"] == CRD_NAME
    assert document["spec"]["group"] == GROUP
    assert document["spec"]["names"]["kind"] == KIND
    assert document["spec"]["names"]["plural"] == PLURAL
    assert [v["name"] for v in document["spec"]["versions"] if v["served"]] == [VERSION]
