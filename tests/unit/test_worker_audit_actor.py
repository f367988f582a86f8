"""Worker pods are audited as their service account, as Kubernetes names it."""

from __future__ import annotations

import kubernetes_validate

from unit.test_manifests import K8S_VERSION, _example_spec, deployment, env_of, example


def test_a_worker_pod_names_its_service_account_in_the_audit_log() -> None:
    body = deployment(example(serviceAccountName="mdm-workers"), "default")
    env = env_of(body)
    assert env["JOBPOOL_SERVICE_ACCOUNT"]["value"] == (
        "system:serviceaccount:$(POD_NAMESPACE):$(POD_SERVICE_ACCOUNT)")
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_SERVICE_ACCOUNT"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    names = [item["name"] for item in
             body["spec"]["template"]["spec"]["containers"][0]["env"]]
    # $(VAR) expands only variables defined before it
    assert names.index("POD_NAMESPACE") < names.index("JOBPOOL_SERVICE_ACCOUNT")
    assert names.index("POD_SERVICE_ACCOUNT") < names.index("JOBPOOL_SERVICE_ACCOUNT")
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)


def test_a_service_account_set_in_the_pool_wins_and_appears_once() -> None:
    worker = {**_example_spec()["worker"],
              "env": [{"name": "JOBPOOL_SERVICE_ACCOUNT", "value": "mdm-bot"}]}
    body = deployment(example(worker=worker), "default")
    names = [item["name"] for item in body["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names.count("JOBPOOL_SERVICE_ACCOUNT") == 1
    assert env_of(body)["JOBPOOL_SERVICE_ACCOUNT"]["value"] == "mdm-bot"
    assert "POD_SERVICE_ACCOUNT" not in names
