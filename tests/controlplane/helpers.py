"""Reading the pools, their children, Events and the audit log of the control plane."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobpool.core.crd import API_VERSION, PLURAL

from .control_plane import ControlPlane

RELEASE, OPERATOR_NAMESPACE = "jp", "jobpool-system"
SERVICE_ACCOUNT = "jp-jobpool"
WAIT = 90.0
"""Seconds a scenario may take before it counts as failed (generous; not a timing check)."""
ROOT = Path(__file__).resolve().parents[2]
POOL = "mdm-jobs"
LANES = ("default", "bulk", "acme", "heavy")
CHILDREN = frozenset(f"{POOL}-{lane}" for lane in LANES)
"""The example pool's Deployments, one per lane."""
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"


def pools_path(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"


def deployments_path(namespace: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments"


def example_pool() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "pool.yaml").read_text())
    return document


def deployments(plane: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in plane.admin.items(deployments_path(namespace))}


def pool_object(plane: ControlPlane, namespace: str, name: str = POOL) -> dict[str, Any] | None:
    found: dict[str, Any] | None = plane.admin.get(f"{pools_path(namespace)}/{name}")
    return found


def events(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return plane.admin.items(f"/api/v1/namespaces/{namespace}/events")


def pods(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return plane.admin.items(f"/api/v1/namespaces/{namespace}/pods")


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def operator_writes(plane: ControlPlane, namespace: str | None = None,
                    user: str = OPERATOR_USER,
                    credential: str | None = None) -> list[dict[str, Any]]:
    """The writes the API server answered for `user` (in `namespace`, if given; with the
    token `credential`, as conftest.credential_id names it, if given)."""
    return [event for event in plane.audit_events()
            if event["user"].get("username") == user
            and (credential is None or credential in (event["user"].get("extra") or {}).get(
                "authentication.kubernetes.io/credential-id", []))
            and event["verb"] in ("create", "update", "patch", "delete")
            and (namespace is None or event.get("objectRef", {}).get("namespace") == namespace)]


def described(writes: list[dict[str, Any]]) -> list[str]:
    """Each write as `verb resource[/subresource] name (code)`, for an assertion message."""
    out = []
    for event in writes:
        ref = event.get("objectRef", {})
        resource = ref.get("resource", "?") + (f"/{ref['subresource']}"
                                               if ref.get("subresource") else "")
        out.append(f"{event['verb']} {resource} {ref.get('name', '')} "
                   f"({event.get('responseStatus', {}).get('code')})")
    return out


def eventually(check: Any, what: str, wait: float = WAIT, *, logs: Any = None) -> Any:
    """Poll `check` until it returns something truthy; fail after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            tail = "" if logs is None else "\noperator log:\n" + logs.output()[-4000:]
            pytest.fail(f"gave up waiting: {what}{tail}", pytrace=False)
        time.sleep(0.5)


def every_deployment(plane: ControlPlane, namespace: str, what: str = "the pool's Deployments",
                     *, logs: Any = None) -> dict[str, dict[str, Any]]:
    """The Deployments in `namespace` once they are the example pool's `CHILDREN`, by name
    (`eventually`, failing with `what`)."""
    def found() -> dict[str, dict[str, Any]] | None:
        current = deployments(plane, namespace)
        return current if set(current) == CHILDREN else None

    return dict(eventually(found, what, logs=logs))


def refused_writes(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """The operator's writes in `namespace` that the API server refused (4xx, 5xx)."""
    return [w for w in operator_writes(plane, namespace)
            if w.get("responseStatus", {}).get("code", 200) >= 400]


APPLICATION_ROLE = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{RELEASE}-jobpool-application"
"""The chart's ClusterRole for pools and their children (operator.watchNamespaces empty)."""


@contextmanager
def role_without(plane: ControlPlane, group: str, resources: set[str],
                 verb: str | None = None) -> Iterator[None]:
    """The chart's application ClusterRole without `verb` (every verb, if None) on
    `resources` of API group `group`, as for an operator whose RBAC lacks it; restored on
    exit."""
    role = plane.admin.get(APPLICATION_ROLE)
    rules = []
    for rule in role["rules"]:
        matched = set(rule.get("resources", ())) & resources
        if group not in rule.get("apiGroups", ()) or not matched:
            rules.append(rule)
            continue
        rest = [r for r in rule["resources"] if r not in matched]
        verbs = [] if verb is None else [v for v in rule["verbs"] if v != verb]
        if rest:
            rules.append({**rule, "resources": rest})
        if verbs:
            rules.append({**rule, "resources": sorted(matched), "verbs": verbs})
    plane.admin.patch(APPLICATION_ROLE, {"rules": rules})
    try:
        yield
    finally:
        plane.admin.patch(APPLICATION_ROLE, {"rules": role["rules"]})


KEDA = "/apis/keda.sh/v1alpha1/namespaces/{namespace}/{resource}"


def with_lane_mode(document: dict[str, Any], lane: str, mode: str) -> dict[str, Any]:
    """`document` (a pool) with lane `lane`'s autoscaling mode set to `mode`."""
    changed = copy.deepcopy(document)
    for entry in changed["spec"]["lanes"]:
        if entry["name"] == lane:
            entry["autoscaling"] = {**(entry.get("autoscaling") or {}), "mode": mode}
    return changed


def reason_of(plane: ControlPlane, namespace: str, kind: str, reason: str,
              logs: Any = None, name: str = POOL) -> dict[str, Any]:
    """Pool `name` once its condition `kind` has `reason`."""
    def check() -> dict[str, Any] | None:
        pool = pool_object(plane, namespace, name)
        return pool if condition(pool, kind).get("reason") == reason else None

    return dict(eventually(check, f"{kind}/{reason} on pool {name}", logs=logs))
