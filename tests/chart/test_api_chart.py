"""The chart's admin API and console: Deployment, Service, Ingress, NetworkPolicy."""

from __future__ import annotations

import subprocess
from typing import Any

from chart.test_chart import CHART, OPTIONS, by_kind, component, selects, template


def api_objects(helm: str, *values: str) -> dict[str, dict[str, Any]]:
    objects = template(helm, *values)
    found = {}
    for kind in ("Deployment", "Service", "Ingress", "NetworkPolicy"):
        matching = component(objects, kind, "api")
        assert len(matching) <= 1, kind
        if matching:
            found[kind] = matching[0]
    return found


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_the_api_is_off_by_default(helm: str) -> None:
    assert api_objects(helm) == {}


def test_the_api_runs_jobpool_api_with_its_secrets_by_reference(helm: str) -> None:
    objects = api_objects(helm, *OPTIONS["api"])
    assert set(objects) == {"Deployment", "Service"}
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["api"]
    env = env_of(container)
    assert env["JOBPOOL_DSN"] == {"secretKeyRef": {"name": "jobpool-db", "key": "dsn"}}
    assert env["JOBPOOL_API_JWT_SECRET"] == {
        "secretKeyRef": {"name": "jobpool-api-jwt", "key": "secret"}}
    assert "JOBPOOL_API_JWT_PUBLIC_KEY" not in env
    assert (env["JOBPOOL_API_PORT"], env["JOBPOOL_API_JWT_AUDIENCE"]) == ("8080",
                                                                          "jobpool-admin")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pod["automountServiceAccountToken"] is False  # it calls no Kubernetes API


def test_the_api_pod_meets_the_restricted_pod_security_standard(helm: str) -> None:
    """The checks of Pod Security's `restricted` profile, on the pod and its container."""
    pod = api_objects(helm, *OPTIONS["api"])["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))
    assert all(set(volume) & {"emptyDir", "secret", "configMap"} for volume in pod["volumes"])
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert not context.get("capabilities", {}).get("add")
        assert context.get("privileged") is not True
        assert context["readOnlyRootFilesystem"] is True
        assert context.get("runAsUser") != 0
        assert all("hostPort" not in port for port in container["ports"])


def test_a_public_key_is_mounted_from_its_secret_and_the_pool_from_its_config_map(
    helm: str,
) -> None:
    pod = api_objects(helm, *OPTIONS["api-public-key"])["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert env_of(container)["JOBPOOL_API_JWT_PUBLIC_KEY"] == "/etc/jobpool/jwt/jwks.json"
    assert "JOBPOOL_API_JWT_SECRET" not in env_of(container)
    assert container["args"] == ["api", "--pool=/etc/jobpool/pool/pool.yaml"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["jwt"]["secret"] == {"secretName": "idp",
                                        "items": [{"key": "jwks.json", "path": "jwks.json"}]}
    assert volumes["pool"]["configMap"]["name"] == "mdm-jobs-pool"
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert (mounts["jwt"], mounts["pool"]) == ("/etc/jobpool/jwt", "/etc/jobpool/pool")


def test_the_service_and_ingress_reach_the_api_pods(helm: str) -> None:
    objects = api_objects(helm, *OPTIONS["api-ingress"])
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = objects["Service"]
    assert service["spec"]["type"] == "ClusterIP"
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http",
                                         "protocol": "TCP"}]
    ingress = objects["Ingress"]["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["tls"] == [{"hosts": ["jobs.example.com"], "secretName": "jobs-tls"}]
    (rule,) = ingress["rules"]
    assert rule["host"] == "jobs.example.com"
    assert rule["http"]["paths"][0]["backend"] == {
        "service": {"name": service["metadata"]["name"], "port": {"name": "http"}}}


def test_the_network_policy_admits_the_port_from_the_allowed_peers_and_reaches_the_database(
    helm: str,
) -> None:
    allowed = ["--set", "api.allowFrom[0].namespaceSelector.matchLabels.name=ingress-nginx"]
    objects = template(helm, *OPTIONS["api"], *OPTIONS["network-policy"], *allowed)
    (policy,) = component(objects, "NetworkPolicy", "api")
    (deployment,) = component(objects, "Deployment", "api")
    assert selects(policy["spec"]["podSelector"],
                   deployment["spec"]["template"]["metadata"]["labels"])
    (operator_policy,) = component(objects, "NetworkPolicy", "operator")
    assert not selects(operator_policy["spec"]["podSelector"],
                       deployment["spec"]["template"]["metadata"]["labels"])
    assert policy["spec"]["ingress"] == [{
        "ports": [{"port": "http", "protocol": "TCP"}],
        "from": [{"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}]}]
    egress = {(p["port"], p["protocol"]) for rule in policy["spec"]["egress"]
              for p in rule.get("ports", [])}
    assert egress == {(53, "UDP"), (53, "TCP"), (5432, "TCP")}  # no Kubernetes API
    assert len(by_kind(template(helm, *OPTIONS["api"]), "NetworkPolicy")) == 0


def test_the_api_refuses_to_render_without_what_it_needs(helm: str) -> None:
    cases = {
        ("--set", "api.enabled=true", "--set", "api.jwt.secretName=j",
         "--set", "api.jwt.secretKey=k"): "api.enabled needs database.secretName",
        ("--set", "api.enabled=true", "--set", "database.secretName=db"):
            "api.enabled needs api.jwt.secretName",
        ("--set", "api.enabled=true", "--set", "database.secretName=db",
         "--set", "api.jwt.secretName=j"): "give exactly one of secretKey",
        ("--set", "api.enabled=true", "--set", "database.secretName=db",
         "--set", "api.jwt.secretName=j", "--set", "api.jwt.secretKey=k",
         "--set", "api.jwt.publicKeyKey=p"): "give exactly one of secretKey",
    }
    for values, message in cases.items():
        result = subprocess.run([helm, "template", "r", str(CHART), *values],
                                capture_output=True, text=True, check=False)
        assert result.returncode != 0 and message in result.stderr, (values, result.stderr)


def test_the_notes_say_how_to_open_the_console(helm: str) -> None:
    result = subprocess.run([helm, "install", "jp", str(CHART), "--dry-run=client",
                             "-n", "jobs", *OPTIONS["api"]], capture_output=True, text=True,
                            check=True)
    assert "kubectl port-forward -n jobs svc/jp-jobpool-api 8080" in result.stdout
    assert "http://localhost:8080/console/" in result.stdout
