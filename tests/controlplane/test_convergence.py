"""A converged pool costs the API server nothing: a minute of the operator's ticks (one a
second) makes no write and posts no Event, also when the pool is written in non-canonical
form or holds an empty variable, another manager added an env var, someone labelled a
Deployment by hand, or a mutating admission policy added a container to the pod template."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .conftest import Operator, Tools, restricted_namespace
from .helpers import (
    POOL,
    condition,
    deployments,
    described,
    events,
    eventually,
    every_deployment,
    example_pool,
    operator_writes,
    pool_object,
    pools_path,
)

pytestmark = pytest.mark.controlplane

QUIET = 60.0
"""Seconds of ticks that must make no write (the operator syncs every second here)."""


def sidecar_policy(namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """A MutatingAdmissionPolicy (and its binding) adding a container to the pod template of
    every Deployment created or updated in `namespace`, as a platform's policy would."""
    name = f"sidecar-{namespace}"
    containers = "Object.spec.template.spec.containers"
    sidecar = (f'{containers}{{name: "policy-sidecar", image: "sidecar:1", '
               f'securityContext: {containers}.securityContext{{'
               'allowPrivilegeEscalation: false, runAsNonRoot: true, '
               f'capabilities: {containers}.securityContext.capabilities{{drop: ["ALL"]}}, '
               f'seccompProfile: {containers}.securityContext.seccompProfile{{'
               'type: "RuntimeDefault"}}}')
    expression = ('[JSONPatch{op: "add", path: "/spec/template/spec/containers/-", '
                  f'value: {sidecar}}}]')
    base = "/apis/admissionregistration.k8s.io/v1"
    return [
        (f"{base}/mutatingadmissionpolicies", {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
                # once: the operator's later applies keep the container it has
                "matchConditions": [{"name": "no-sidecar-yet", "expression":
                    '!object.spec.template.spec.containers.exists('
                    'c, c.name == "policy-sidecar")'}],
                "mutations": [{"patchType": "JSONPatch",
                               "jsonPatch": {"expression": expression}}],
            }}),
        (f"{base}/mutatingadmissionpolicybindings", {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": name},
            "spec": {"policyName": name, "matchResources": {"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}}),
    ]


def noncanonical_pool() -> dict[str, Any]:
    """The example pool with quantities the API server stores in another form."""
    pool = example_pool()
    pool["spec"]["lanes"][0]["resources"] = {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                                             "limits": {"memory": "2048Mi"}}
    return pool


def pool_events(tools: Tools, namespace: str) -> list[str]:
    return [f"{e['reason']}: {e['message']}" for e in events(tools.plane, namespace)
            if e["involvedObject"].get("kind") == "JobWorkerPool"]


def test_a_converged_pool_makes_no_write_and_no_event(
    release: Tools, operator: Operator, dsn: str
) -> None:
    plane = release.plane
    cases = {case: restricted_namespace(plane, dsn) for case in
             ("canonical", "noncanonical", "env-by-another-manager", "label-by-hand",
              "container-by-policy", "empty-env-value")}
    for path, body in sidecar_policy(cases["container-by-policy"]):
        plane.admin.create(path, body)
    time.sleep(2)  # the policy reaches the admission chain asynchronously
    for case, namespace in cases.items():
        body = noncanonical_pool() if case == "noncanonical" else example_pool()
        if case == "empty-env-value":  # the server stores the entry without its value
            body["spec"]["worker"]["env"] = [{"name": "EMPTY_FLAG", "value": ""}]
        plane.admin.create(pools_path(namespace), body)
    for namespace in cases.values():
        every_deployment(plane, namespace, f"the pool's Deployments in {namespace}",
                         logs=operator)
        eventually(lambda ns=namespace: condition(pool_object(plane, ns), "Reconciled").get(
            "status") == "True", f"the pool in {namespace} reconciled", logs=operator)
    default = f"{POOL}-default"
    release.kubectl("set", "env", "-n", cases["env-by-another-manager"],
                    f"deployment/{default}", "EXTRA_SETTING=1")
    release.kubectl("label", "-n", cases["label-by-hand"], f"deployment/{default}",
                    "team=payments")
    policy_containers = [c["name"] for c in deployments(plane, cases["container-by-policy"])[
        default]["spec"]["template"]["spec"]["containers"]]
    assert "policy-sidecar" in policy_containers, policy_containers
    time.sleep(10)  # what the operator does about the changes above happens now

    writes_before = {ns: len(operator_writes(plane, ns)) for ns in cases.values()}
    events_before = {ns: pool_events(release, ns) for ns in cases.values()}
    time.sleep(QUIET)
    for case, namespace in cases.items():
        new_writes = operator_writes(plane, namespace)[writes_before[namespace]:]
        assert new_writes == [], f"{case}: {described(new_writes)}"
        new_events = pool_events(release, namespace)
        assert new_events == events_before[namespace], f"{case}: {new_events}"
    # the other managers' changes are still there: the operator took nothing it does not own
    env = deployments(plane, cases["env-by-another-manager"])[default]["spec"]["template"][
        "spec"]["containers"][0]["env"]
    assert {"name": "EXTRA_SETTING", "value": "1"} in env
    labels = deployments(plane, cases["label-by-hand"])[default]["metadata"]["labels"]
    assert labels["team"] == "payments"
    for path, body in sidecar_policy(cases["container-by-policy"]):
        plane.admin.delete(f"{path}/{body['metadata']['name']}")
