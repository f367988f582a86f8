"""The exact API access the operator uses, for checking the chart's RBAC against it.

Each entry: (API group, resource, verbs, scope); scope "release" is the operator's own
namespace (the Lease), "pools" every namespace it watches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from k8s_emulator import Attributes, User

from jobpool.core.crd import GROUP, PLURAL

Need = tuple[str, str, tuple[str, ...], str]
OPERATOR_NEEDS: tuple[Need, ...] = (
    ("coordination.k8s.io", "leases", ("get", "create", "update"), "release"),
    ("", "events", ("create",), "pools"),
    (GROUP, PLURAL, ("list", "watch", "patch"), "pools"),
    (GROUP, f"{PLURAL}/status", ("patch",), "pools"),
    (GROUP, f"{PLURAL}/finalizers", ("update",), "pools"),
    ("apps", "deployments", ("get", "list", "create", "patch", "delete"), "pools"),
    ("apps", "deployments/scale", ("patch",), "pools"),
    ("", "secrets", ("get",), "pools"),
)
KEDA_NEEDS: tuple[Need, ...] = tuple(
    ("keda.sh", resource, ("get", "list", "create", "patch", "delete"), "pools")
    for resource in ("scaledobjects", "triggerauthentications")
)
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
