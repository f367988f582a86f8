"""The chart's RBAC grants exactly what the operator calls, where it calls it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from helm_binary import render_chart

from jobpool.core.crd import GROUP, PLURAL

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jobpool"
RELEASE_NAMESPACE = "jobpool-system"
ACCOUNT = {"kind": "ServiceAccount", "name": "jp-jobpool", "namespace": RELEASE_NAMESPACE}

Grant = tuple[str, str, str]
"""(apiGroup, resource, verb)."""

LEADER_ELECTION: set[Grant] = {
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
}
APPLICATION: set[Grant] = {
    ("", "events", "create"),
    (GROUP, PLURAL, "list"),
    (GROUP, PLURAL, "watch"),
    (GROUP, PLURAL, "patch"),
    (GROUP, f"{PLURAL}/status", "patch"),
    (GROUP, f"{PLURAL}/finalizers", "update"),
    ("apps", "deployments", "get"),
    ("apps", "deployments", "list"),
    ("apps", "deployments", "create"),
    ("apps", "deployments", "patch"),
    ("apps", "deployments", "delete"),
    ("apps", "deployments/scale", "patch"),
}
KEDA: set[Grant] = {
    ("keda.sh", resource, verb)
    for resource in ("scaledobjects", "triggerauthentications")
    for verb in ("get", "list", "create", "patch", "delete")
}
SECRETS: set[Grant] = {("", "secrets", "get")}


def grants(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def granted(objects: list[dict[str, Any]]) -> dict[str | None, set[Grant]]:
    """What the operator's ServiceAccount may do, by namespace (None: every namespace)."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    by_namespace: dict[str | None, set[Grant]] = {}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        assert binding["subjects"] == [ACCOUNT]
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        by_namespace.setdefault(namespace, set()).update(grants(role["rules"]))
    return by_namespace


def rbac(helm: str, *values: str) -> dict[str | None, set[Grant]]:
    return granted(render_chart(helm, *values, namespace=RELEASE_NAMESPACE))


def test_default_grants_the_application_everywhere_and_the_lease_at_home(helm: str) -> None:
    assert rbac(helm) == {
        None: APPLICATION | SECRETS,
        RELEASE_NAMESPACE: LEADER_ELECTION,
    }


def test_watched_namespaces_get_roles_of_their_own(helm: str) -> None:
    assert rbac(helm, "--set", "operator.watchNamespaces={mdm,billing}") == {
        "mdm": APPLICATION | SECRETS,
        "billing": APPLICATION | SECRETS,
        RELEASE_NAMESPACE: LEADER_ELECTION,
    }


def test_secret_access_can_be_restricted_to_some_namespaces(helm: str) -> None:
    assert rbac(helm, "--set", "rbac.secretNamespaces={mdm}") == {
        None: APPLICATION,
        "mdm": SECRETS,
        RELEASE_NAMESPACE: LEADER_ELECTION,
    }
    assert rbac(helm, "--set", "operator.watchNamespaces={mdm,billing}",
                "--set", "rbac.secretNamespaces={billing}") == {
        "mdm": APPLICATION,
        "billing": APPLICATION | SECRETS,
        RELEASE_NAMESPACE: LEADER_ELECTION,
    }


def test_secret_namespaces_must_be_watched(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "jp", str(CHART), "--set", "operator.watchNamespaces={mdm}",
         "--set", "rbac.secretNamespaces={billing}"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode != 0
    assert "rbac.secretNamespaces: billing is not in operator.watchNamespaces" in result.stderr


@pytest.mark.parametrize("values", [[], ["--set", "operator.watchNamespaces={mdm}"]],
                         ids=["cluster", "namespaced"])
def test_keda_value_adds_scaled_objects_and_trigger_authentications(
    helm: str, values: list[str]
) -> None:
    namespace = "mdm" if values else None
    assert rbac(helm, *values, "--set", "rbac.keda=true")[namespace] == (
        APPLICATION | SECRETS | KEDA)


def test_lease_rules_reach_only_the_release_namespace(helm: str) -> None:
    for namespace, allowed in rbac(helm, "--set", "operator.watchNamespaces={mdm}").items():
        if namespace != RELEASE_NAMESPACE:
            assert not {grant for grant in allowed if grant[1] == "leases"}


def test_rbac_toggle_removes_every_role(helm: str) -> None:
    objects = render_chart(helm, "--set", "rbac.create=false")
    assert not [o for o in objects if o["kind"].endswith(("Role", "RoleBinding"))]
