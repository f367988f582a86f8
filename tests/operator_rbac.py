"""The exact API access the operator uses, for checking the chart's RBAC against it.

Each entry: (API group, resource, verbs, scope); scope "release" is the operator's own
namespace (the Lease), "pools" every namespace it watches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from k8s_emulator import Attributes, User

Need = tuple[str, str, tuple[str, ...], str]
OPERATOR_NEEDS: tuple[Need, ...] = (
    ("coordination.k8s.io", "leases", ("get", "create", "update"), "release"),
    ("", "events", ("create",), "pools"),
    ("jobs.mdm.io", "jobworkerpools", ("list", "watch", "patch"), "pools"),
    ("jobs.mdm.io", "jobworkerpools/status", ("patch",), "pools"),
    ("jobs.mdm.io", "jobworkerpools/finalizers", ("update",), "pools"),
    ("apps", "deployments", ("get", "list", "create", "patch", "delete"), "pools"),
    ("apps", "deployments/scale", ("patch",), "pools"),
    ("", "secrets", ("get",), "pools"),
)
KEDA_NEEDS: tuple[Need, ...] = tuple(
    ("keda.sh", resource, ("get", "list", "create", "patch", "delete"), "pools")
    for resource in ("scaledobjects", "triggerauthentications")
)
GRANTED_ELSEWHERE: tuple[Need, ...] = (
    ("coordination.k8s.io", "leases", ("get", "create", "update"), "release"),
    ("apps", "deployments/scale", ("patch",), "pools"),
    ("jobs.mdm.io", "jobworkerpools/finalizers", ("update",), "pools"),
    *KEDA_NEEDS[1:],
)
"""Access the rendered chart of this tree does not grant yet; `with_operator_access` adds
it for the operator tests. Empty once the chart grants everything in OPERATOR_NEEDS."""


def refused(user: User, needs: Iterable[Need], release: str, pools: str) -> list[str]:
    """Every (verb resource in namespace) of `needs` that `user` may not do."""
    missing = []
    for group, resource, verbs, scope in needs:
        plural, _, sub = resource.partition("/")
        namespace = release if scope == "release" else pools
        for verb in verbs:
            request = Attributes(verb, "", group, plural, sub, namespace, "")
            if not user.may(request):
                missing.append(f"{verb} {resource}.{group or 'core'} in {namespace}")
    return missing


def with_operator_access(
    objects: Sequence[Mapping[str, Any]], keda: bool
) -> list[dict[str, Any]]:
    """`objects` plus a ClusterRole and binding for GRANTED_ELSEWHERE (for the chart's
    ServiceAccount), only what `keda` asks for."""
    (account,) = [obj for obj in objects if obj["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    rules = [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
             for group, resource, verbs, _ in GRANTED_ELSEWHERE
             if keda or group != "keda.sh"]
    if not rules:
        return [dict(obj) for obj in objects]
    return [dict(obj) for obj in objects] + [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "operator-extra"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "operator-extra"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "operator-extra"},
         "subjects": [{"kind": "ServiceAccount", "name": meta["name"],
                       "namespace": meta["namespace"]}]},
    ]


def rbac_objects(
    needs: Iterable[Need], release: str, account: str
) -> list[dict[str, Any]]:
    """A ServiceAccount `release/account` granted exactly `needs`: a Role in `release` for
    the "release" scope, a ClusterRole for the rest."""
    def rule(group: str, resource: str, verbs: Sequence[str]) -> dict[str, Any]:
        return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}

    def binding(kind: str, namespace: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "operator"}
        if namespace:
            meta["namespace"] = namespace
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": f"{kind}Binding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                            "name": "operator"},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": release}]}

    needs = list(needs)
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": release}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "operator", "namespace": release},
         "rules": [rule(g, r, v) for g, r, v, scope in needs if scope == "release"]},
        binding("Role", release),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "operator"},
         "rules": [rule(g, r, v) for g, r, v, scope in needs if scope == "pools"]},
        binding("ClusterRole", None),
    ]
