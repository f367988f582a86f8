"""The Helm chart renders valid Kubernetes objects; the CRD copies stay identical."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_binary import render_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jobpool"
CRD_NAME = "jobworkerpools.jobs.mdm.io.yaml"
CRD_COPIES = [
    ROOT / "crds" / CRD_NAME,
    CHART / "crds" / CRD_NAME,
    ROOT / "operator" / "jobpool" / "crds" / CRD_NAME,
]
K8S_VERSION = "1.33.0"
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}  # not in kubernetes-validate's schemas

NON_DEFAULT = [
    "--set", "operator.watchNamespaces={mdm,billing}",
    "--set", "operator.peering=jobpool",
    "--set", "operator.logLevel=debug",
    "--set", "migrations.enabled=true",
    "--set", "database.secretName=jobpool-db",
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "alerts.enabled=true",
    "--set", "rbac.keda=true",
    "--set", "serviceAccount.name=jp-operator",
    "--set", "image.repository=registry.example.com/jobpool",
    "--set", "image.tag=9.9.9",
    "--set", "operator.nodeSelector.disk=ssd",
]


def template(helm: str, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    return render_chart(helm, "--include-crds", *args, chart=chart)


def by_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def test_helm_lint(helm: str) -> None:
    for values in ([], NON_DEFAULT):
        result = subprocess.run([helm, "lint", "--strict", str(CHART), *values],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", [[], NON_DEFAULT], ids=["default", "non-default"])
def test_every_rendered_object_is_valid_kubernetes(helm: str, values: list[str]) -> None:
    objects = template(helm, *values)
    assert objects
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_default_render(helm: str) -> None:
    objects = template(helm)
    kinds = sorted(obj["kind"] for obj in objects if obj["kind"] != "ConfigMap")
    assert kinds == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
                     "CustomResourceDefinition", "Deployment", "ServiceAccount"]
    dashboards = sorted(CHART.glob("files/grafana/*.json"))
    assert len(by_kind(objects, "ConfigMap")) == len(dashboards)  # dashboards ship by default
    assert by_kind(objects, "PrometheusRule") == []  # alerts are opt-in
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "jobpool:0.1.0"
    assert container["args"][0] == "operator"
    assert "--scale-interval=15" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    labels = deployment["metadata"]["labels"]
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/version", "app.kubernetes.io/managed-by"):
        assert key in labels
    roles = {role["metadata"]["name"]: role for role in by_kind(objects, "ClusterRole")}
    assert set(roles) == {"jp-jobpool-framework", "jp-jobpool-application"}
    app_rules = roles["jp-jobpool-application"]["rules"]
    assert {"apiGroups": ["jobs.mdm.io"], "resources": ["jobworkerpools/status"],
            "verbs": ["get", "patch", "update"]} in app_rules
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]} in app_rules
    assert not any("keda.sh" in rule["apiGroups"] for rule in app_rules)
    framework = roles["jp-jobpool-framework"]["rules"]
    assert not any("kopf.dev" in rule["apiGroups"] for rule in framework)


def test_non_default_render(helm: str) -> None:
    objects = template(helm, *NON_DEFAULT)
    roles = by_kind(objects, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["billing", "mdm"]
    assert any("keda.sh" in rule["apiGroups"] for rule in roles[0]["rules"])
    bindings = by_kind(objects, "RoleBinding")
    assert all(b["subjects"][0]["name"] == "jp-operator" for b in bindings)
    (framework,) = by_kind(objects, "ClusterRole")
    assert any("kopf.dev" in rule["apiGroups"] for rule in framework["rules"])
    deployment = next(d for d in by_kind(objects, "Deployment"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/jobpool:9.9.9"
    assert {"--namespace=mdm", "--namespace=billing", "--peering=jobpool"} <= set(
        container["args"])
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "ssd"}
    (job,) = by_kind(objects, "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    migrate = job["spec"]["template"]["spec"]["containers"][0]
    assert migrate["args"] == ["migrate"]
    assert migrate["env"] == [{"name": "JOBPOOL_DSN", "valueFrom": {
        "secretKeyRef": {"name": "jobpool-db", "key": "dsn"}}}]
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (service,) = by_kind(objects, "Service")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "worker"
    (account,) = by_kind(objects, "ServiceAccount")  # create stays true: made under that name
    assert account["metadata"]["name"] == "jp-operator"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "jp-operator"


def test_rbac_toggle_removes_every_role(helm: str) -> None:
    objects = template(helm, "--set", "rbac.create=false")
    assert not [o for o in objects if o["kind"].endswith(("Role", "RoleBinding"))]


def test_migrations_need_a_secret(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "jp", str(CHART), "--set", "migrations.enabled=true"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode != 0
    assert "database.secretName is required" in result.stderr


def test_dashboards_and_alert_files_ship_when_present(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "jobpool"
    shutil.copytree(CHART, chart)
    (chart / "files" / "grafana" / "jobs.json").write_text(json.dumps({"title": "Jobs"}))
    (chart / "files" / "prometheus" / "jobs.yaml").write_text(
        "groups:\n  - name: jobs\n    rules:\n      - alert: JobsInDlq\n"
        "        expr: sum(mdm_jobs_dlq) > 0\n")
    (chart / "files" / "prometheus" / "jobs.test.yaml").write_text("rule_files: [jobs.yaml]\n")
    objects = template(helm, "--set", "alerts.enabled=true", chart=chart)
    dashboards = {d["metadata"]["name"]: d for d in by_kind(objects, "ConfigMap")}
    dashboard = dashboards["jp-jobpool-dashboard-jobs"]
    assert json.loads(dashboard["data"]["jobs.json"]) == {"title": "Jobs"}
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    rules = {r["metadata"]["name"]: r for r in by_kind(objects, "PrometheusRule")}
    assert rules["jp-jobpool-jobs"]["spec"]["groups"][0]["rules"][0]["alert"] == "JobsInDlq"
    assert not any("test" in name for name in rules)


def test_monitoring_files_in_deploy_are_copied_into_the_chart() -> None:
    for folder, pattern in (("grafana", "*.json"), ("prometheus", "*.yaml")):
        for source in sorted((ROOT / "deploy" / folder).glob(pattern)):
            if source.name.endswith(".test.yaml"):
                continue  # promtool tests, not rules
            copy = CHART / "files" / folder / source.name
            assert copy.is_file() and filecmp.cmp(source, copy, shallow=False), (
                f"copy {source.relative_to(ROOT)} to {copy.relative_to(ROOT)} so the chart ships it"
            )


def test_crd_copies_are_byte_identical() -> None:
    source = CRD_COPIES[0].read_bytes()
    for copy in CRD_COPIES[1:]:
        assert copy.read_bytes() == source, f"{copy} differs from crds/{CRD_NAME}"


def test_crd_is_structural_and_declares_status_and_columns() -> None:
    crd = yaml.safe_load(CRD_COPIES[0].read_text())
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)
    (version,) = crd["spec"]["versions"]
    assert crd["spec"]["names"]["shortNames"] == ["jwp"]
    assert crd["spec"]["scope"] == "Namespaced"
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
    crd = yaml.safe_load(CRD_COPIES[0].read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    example = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    jsonschema.Draft4Validator(schema).validate(example)
    assert example["kind"] == crd["spec"]["names"]["kind"]
    assert example["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
