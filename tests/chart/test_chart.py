"""The Helm chart renders valid Kubernetes objects for its defaults and for each option."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from helm_binary import render_chart

from jobpool.core.poolspec import load_pool_file
from jobpool.k8s.manifests import build_pod_template
from jobpool.k8s.probes import READINESS_PATH, Health

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jobpool"
RELEASE_NAMESPACE = "jobpool-system"
K8S_VERSION = "1.33.0"
CUSTOM_KINDS = {"PodMonitor", "PrometheusRule"}  # not in kubernetes-validate's schemas

OPTIONS: dict[str, list[str]] = {
    "watch-namespaces": ["--set", "operator.watchNamespaces={mdm,billing}"],
    "secret-namespaces": ["--set", "rbac.secretNamespaces={mdm}"],
    "watched-secret-namespaces": ["--set", "operator.watchNamespaces={mdm,billing}",
                                  "--set", "rbac.secretNamespaces={billing}"],
    "replicas": ["--set", "operator.replicas=2"],
    "keda": ["--set", "rbac.keda=true"],
    "no-rbac": ["--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                "--set", "serviceAccount.name=existing"],
    "migrations": ["--set", "migrations.enabled=true", "--set", "database.secretName=jobpool-db"],
    "pod-monitor": ["--set", "metrics.podMonitor.enabled=true"],
    "watched-pod-monitor": ["--set", "metrics.podMonitor.enabled=true",
                            "--set", "operator.watchNamespaces={mdm,billing}"],
    "pdb": ["--set", "operator.podDisruptionBudget.enabled=true", "--set", "operator.replicas=2"],
    "network-policy": ["--set", "networkPolicy.enabled=true"],
    "security-context": ["--set", "podSecurityContext.runAsUser=2000",
                         "--set", "podSecurityContext.runAsGroup=2000",
                         "--set", "podSecurityContext.fsGroup=null"],
    "no-crds": ["--set", "crds.install=false"],
    "crds-not-kept": ["--set", "crds.keep=false"],
    "alerts": ["--set", "alerts.enabled=true"],
    "no-dashboards": ["--set", "dashboards.enabled=false"],
    "tracing": ["--set", "tracing.env.OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317",
                "--set", "tracing.env.OTEL_TRACES_SAMPLER=parentbased_always_on"],
    "api": ["--set", "api.enabled=true", "--set", "database.secretName=jobpool-db",
            "--set", "api.jwt.secretName=jobpool-api-jwt", "--set", "api.jwt.secretKey=secret"],
    "api-public-key": ["--set", "api.enabled=true", "--set", "database.secretName=jobpool-db",
                       "--set", "api.jwt.secretName=idp", "--set", "api.jwt.publicKeyKey=jwks.json",
                       "--set", "api.poolConfigMap.name=mdm-jobs-pool"],
    "api-ingress": ["--set", "api.enabled=true", "--set", "database.secretName=jobpool-db",
                    "--set", "api.jwt.secretName=jobpool-api-jwt",
                    "--set", "api.jwt.secretKey=secret", "--set", "api.ingress.enabled=true",
                    "--set", "api.ingress.className=nginx",
                    "--set", "api.ingress.host=jobs.example.com",
                    "--set", "api.ingress.tls[0].hosts[0]=jobs.example.com",
                    "--set", "api.ingress.tls[0].secretName=jobs-tls"],
    "pod-settings": ["--set", "operator.nodeSelector.disk=ssd",
                     "--set", "operator.priorityClassName=system-cluster-critical",
                     "--set", "image.repository=registry.example.com/jobpool",
                     "--set", "image.tag=9.9.9", "--set", "operator.logLevel=debug",
                     "--set", "imagePullSecrets[0].name=registry"],
}
EVERY_OPTION = [arg for name, args in OPTIONS.items() if name not in (
    "no-rbac", "watched-secret-namespaces", "watched-pod-monitor", "api-public-key")
    for arg in args]


def template(helm: str, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    return render_chart(helm, *args, chart=chart, namespace=RELEASE_NAMESPACE)


def by_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def component(objects: Iterable[dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    """The objects of `kind` labelled app.kubernetes.io/component `name`."""
    return [obj for obj in by_kind(objects, kind)
            if obj["metadata"]["labels"].get("app.kubernetes.io/component") == name]


def operator_deployment(objects: Iterable[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = component(objects, "Deployment", "operator")
    return deployment


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def test_helm_lint(helm: str) -> None:
    for values in ([], EVERY_OPTION):
        result = subprocess.run([helm, "lint", "--strict", str(CHART), *values],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", [[], *OPTIONS.values(), EVERY_OPTION],
                         ids=["default", *OPTIONS, "every-option"])
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
                     "CustomResourceDefinition", "Deployment", "Role", "RoleBinding",
                     "ServiceAccount"]
    dashboards = sorted(CHART.glob("files/grafana/*.json"))
    assert len(by_kind(objects, "ConfigMap")) == len(dashboards)  # dashboards ship by default
    deployment = operator_deployment(objects)
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "jobpool:0.1.0"
    assert container["args"][0] == "operator"
    assert "--scale-interval=15" in container["args"]
    assert f"--lease-namespace={RELEASE_NAMESPACE}" in container["args"]
    assert not any(arg.startswith(("--peering", "--namespace")) for arg in container["args"])
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    labels = deployment["metadata"]["labels"]
    for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/version", "app.kubernetes.io/managed-by"):
        assert key in labels


def test_probes_ask_the_paths_the_operator_serves(helm: str) -> None:
    container = operator_deployment(template(helm))["spec"]["template"]["spec"]["containers"][0]
    (liveness,) = [arg.split("=", 1)[1] for arg in container["args"]
                   if arg.startswith("--liveness=")]
    health = Health(liveness)
    for probe in ("livenessProbe", "readinessProbe"):
        path = container[probe]["httpGet"]["path"]
        assert container[probe]["httpGet"]["port"] == "health"
        assert health.answer("GET", path)[0] in (200, 503), (probe, path)
    assert container["readinessProbe"]["httpGet"]["path"] == READINESS_PATH
    assert container["livenessProbe"]["httpGet"]["path"] == health.path


def test_replicas_value_runs_a_standby_and_rolls_without_a_gap(helm: str) -> None:
    deployment = operator_deployment(template(helm, *OPTIONS["replicas"]))
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_pod_settings_reach_the_operator_pod(helm: str) -> None:
    pod = operator_deployment(template(helm, *OPTIONS["pod-settings"]))["spec"]["template"]
    spec = pod["spec"]
    assert spec["containers"][0]["image"] == "registry.example.com/jobpool:9.9.9"
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert {"name": "JOBPOOL_LOG_LEVEL", "value": "debug"} in spec["containers"][0]["env"]


def test_tracing_variables_reach_the_operator_which_passes_them_to_workers(helm: str) -> None:
    env = operator_deployment(template(helm, *OPTIONS["tracing"]))["spec"]["template"]["spec"][
        "containers"][0]["env"]
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector:4317"} in env
    assert {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_always_on"} in env
    default = operator_deployment(template(helm))["spec"]["template"]["spec"]["containers"][0]
    assert not [item for item in default["env"] if item["name"].startswith("OTEL_")]


def test_security_context_is_configurable_for_operator_and_migrations(helm: str) -> None:
    objects = template(helm, *OPTIONS["security-context"], *OPTIONS["migrations"])
    (job,) = by_kind(objects, "Job")
    for pod in (operator_deployment(objects)["spec"]["template"]["spec"],
                job["spec"]["template"]["spec"]):
        context = pod["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (2000, 2000)
        assert "fsGroup" not in context  # null drops a default
        assert context["runAsNonRoot"] is True
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_migrations_run_as_a_hook_with_the_secret(helm: str) -> None:
    (job,) = by_kind(template(helm, *OPTIONS["migrations"]), "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    migrate = job["spec"]["template"]["spec"]["containers"][0]
    assert migrate["args"] == ["migrate"]
    assert migrate["env"] == [{"name": "JOBPOOL_DSN", "valueFrom": {
        "secretKeyRef": {"name": "jobpool-db", "key": "dsn"}}}]


def test_migrations_need_a_secret(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "jp", str(CHART), "--set", "migrations.enabled=true"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode != 0
    assert "database.secretName is required" in result.stderr


def test_service_account_name(helm: str) -> None:
    objects = template(helm, "--set", "serviceAccount.name=jp-operator")
    (account,) = by_kind(objects, "ServiceAccount")  # create stays true: made under that name
    assert account["metadata"]["name"] == "jp-operator"
    spec = operator_deployment(objects)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "jp-operator"
    bindings = [o for o in objects if o["kind"].endswith("RoleBinding")]
    assert bindings and all(b["subjects"] == [{"kind": "ServiceAccount", "name": "jp-operator",
                                               "namespace": RELEASE_NAMESPACE}]
                            for b in bindings)


def test_pod_disruption_budget_selects_the_operator_pods(helm: str) -> None:
    assert by_kind(template(helm), "PodDisruptionBudget") == []
    objects = template(helm, *OPTIONS["pdb"])
    (budget,) = by_kind(objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    pod_labels = operator_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert selects(budget["spec"]["selector"], pod_labels)


def test_network_policy_admits_health_checks_and_reaches_api_dns_and_database(
    helm: str,
) -> None:
    assert by_kind(template(helm), "NetworkPolicy") == []
    extra = ["--set", "networkPolicy.extraEgress[0].to[0].ipBlock.cidr=10.9.0.0/16"]
    objects = template(helm, *OPTIONS["network-policy"], *extra)
    (policy,) = by_kind(objects, "NetworkPolicy")
    spec = policy["spec"]
    pod_labels = operator_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert selects(spec["podSelector"], pod_labels)
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"port": "health", "protocol": "TCP"}]}]
    egress_ports = {(p["port"], p["protocol"]) for rule in spec["egress"]
                    for p in rule.get("ports", [])}
    assert egress_ports == {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"),
                            (5432, "TCP")}
    assert spec["egress"][-1] == {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}


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
    assert by_kind(template(helm, *OPTIONS["no-dashboards"]), "ConfigMap") == []


def test_monitoring_files_in_deploy_are_copied_into_the_chart() -> None:
    for folder, pattern in (("grafana", "*.json"), ("prometheus", "*.yaml")):
        for source in sorted((ROOT / "deploy" / folder).glob(pattern)):
            if source.name.endswith(".test.yaml"):
                continue  # promtool tests, not rules
            copy = CHART / "files" / folder / source.name
            assert copy.is_file() and filecmp.cmp(source, copy, shallow=False), (
                f"copy {source.relative_to(ROOT)} to {copy.relative_to(ROOT)} so the chart ships it"
            )


@pytest.mark.parametrize(("values", "namespace_selector"), [
    (OPTIONS["pod-monitor"], {"any": True}),
    (OPTIONS["watched-pod-monitor"], {"matchNames": ["mdm", "billing"]}),
], ids=["every-namespace", "watched-namespaces"])
def test_pod_monitor_finds_workers_where_the_pools_run(
    helm: str, values: list[str], namespace_selector: dict[str, Any]
) -> None:
    assert by_kind(template(helm), "PodMonitor") == []
    objects = template(helm, *values)
    (monitor,) = by_kind(objects, "PodMonitor")
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == namespace_selector
    pool = load_pool_file(ROOT / "examples" / "pool.yaml")
    for lane in pool.lanes:  # every lane's worker pods, as the operator builds them
        worker = build_pod_template(pool, lane)
        assert selects(spec["selector"], worker["metadata"]["labels"])
        (endpoint,) = spec["podMetricsEndpoints"]
        ports = {port["name"] for port in worker["spec"]["containers"][0]["ports"]}
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
    operator_pod = operator_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert not selects(spec["selector"], operator_pod)


def test_the_standby_example_of_the_chart_readme_renders(helm: str, tmp_path: Path) -> None:
    readme = (CHART / "README.md").read_text()
    section = readme.split("## High availability", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    values = tmp_path / "standby.yaml"
    values.write_text(example)
    objects = template(helm, "-f", str(values))
    deployment = operator_deployment(objects)
    assert deployment["spec"]["replicas"] == 2
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert selects(spread["labelSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert len(by_kind(objects, "PodDisruptionBudget")) == 1
    for obj in objects:
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
