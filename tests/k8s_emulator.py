"""A fake Kubernetes API server for operator tests: kmock's emulator plus what it lacks.

kmock 0.8 serves a stateful API over real HTTP but checks no credentials, assigns no uid,
resourceVersion, generation or creationTimestamp, answers POST with 200, has no PUT,
ignores label selectors and runs no garbage collector. This subclass fills those in, as
far as the operator relies on them:

- authentication: a request must carry `Authorization: Bearer <token>` of a known User,
  else 401 Unauthorized;
- authorization, before anything else looks at the request (so the path of an API that
  does not exist is 403 as well, as on a real server): a User with grants (compiled from
  RBAC objects by `service_account`, e.g. the chart's rendered ClusterRoles, Roles and
  their bindings) gets 403 Forbidden, with the API server's message, for every request no
  grant allows; refusals are kept in `refusals`. Every authenticated user may read the
  discovery paths (the default ClusterRole system:discovery);
- create: uid, resourceVersion, generation 1, creationTimestamp, namespace; answers 201,
  or 409 AlreadyExists when the name is taken;
- patch: new resourceVersion, generation + 1 when the spec is patched;
- PUT: replace, with a 409 Conflict when the resourceVersion is stale;
- list: `labelSelector` (equality terms) and kind/apiVersion on the list;
- delete: children whose ownerReferences name the deleted uid go too (the GC's job).
"""

from __future__ import annotations

import datetime
import itertools
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import enums, k8s, rendering

_versions = itertools.count(1)
_DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                   "/openapi/*", "/readyz", "/version", "/version/")
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.frozen
class Attributes:
    """What the authorizer sees of a request (the API server's RequestInfo).

    api_group None: a non-resource request (discovery, /version), whose verb is the HTTP
    method in lower case.
    """

    verb: str
    path: str
    api_group: str | None = None
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def full_resource(self) -> str:
        """`resource/subresource`, as RBAC rules name it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """The authorizer's view of `method path?query`, by the API server's rules."""
    parts = [part for part in path.strip("/").split("/") if part]
    rest: list[str] = []
    group = ""
    if parts[:1] == ["api"] and len(parts) > 2:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    if not rest:
        return Attributes(verb=method.lower(), path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    resource, name, subresource = [*rest, "", ""][:3]
    if method in ("GET", "HEAD"):
        verb = "watch" if query.get("watch") in ("true", "1") else "get" if name else "list"
    elif method == "DELETE" and not name:
        verb = "deletecollection"
    else:
        verb = _VERBS.get(method, method.lower())
    return Attributes(verb, path, group, resource, subresource, namespace, name)


def _matches(allowed: Iterable[str], value: str) -> bool:
    return any(item in ("*", value) for item in allowed)


def _url_matches(pattern: str, path: str) -> bool:
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


def _resource_matches(pattern: str, request: Attributes) -> bool:
    if pattern in ("*", request.full_resource):
        return True
    return bool(request.subresource) and pattern == f"*/{request.subresource}"


@attrs.frozen
class Rule:
    """One PolicyRule of a Role or ClusterRole."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rule: Mapping[str, Any]) -> Rule:
        """A rule from its manifest form (`apiGroups`, `resources`, `verbs`, ...)."""
        return cls(*(tuple(rule.get(key) or ()) for key in (
            "verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs")))

    def allows(self, request: Attributes) -> bool:
        """Whether this rule grants `request` (RBAC's rule matching)."""
        if not _matches(self.verbs, request.verb):
            return False
        if request.api_group is None:
            return any(_url_matches(url, request.path) for url in self.non_resource_urls)
        return (
            _matches(self.api_groups, request.api_group)
            and any(_resource_matches(resource, request) for resource in self.resources)
            and (not self.resource_names or request.name in self.resource_names)
        )


@attrs.frozen
class Grant:
    """A rule bound to a subject: everywhere (namespace None: a ClusterRoleBinding) or in one
    namespace (a RoleBinding, which never grants cluster-scoped or non-resource requests)."""

    rule: Rule
    namespace: str | None = None

    def allows(self, request: Attributes) -> bool:
        """Whether this grant admits `request`."""
        if self.namespace is not None and (
            request.api_group is None or request.namespace != self.namespace
        ):
            return False
        return self.rule.allows(request)


DISCOVERY = Grant(Rule(verbs=("get",), non_resource_urls=_DISCOVERY_URLS))
"""What every authenticated user may do (the default ClusterRole system:discovery)."""


@attrs.frozen
class User:
    """Who a token authenticates. grants None: may do anything (a cluster admin)."""

    name: str
    grants: tuple[Grant, ...] | None = None

    def may(self, request: Attributes) -> bool:
        """Whether some grant admits `request`."""
        return self.grants is None or any(grant.allows(request) for grant in self.grants)


def service_account(objects: Iterable[Mapping[str, Any]], namespace: str, name: str) -> User:
    """ServiceAccount `namespace/name` with the grants of `objects`' RBAC bindings naming it.

    objects: manifests, e.g. a rendered chart; Roles, ClusterRoles and their bindings count.
    A binding whose role is missing grants nothing, as on a real server.
    """
    manifests = list(objects)
    rules = {
        (obj["kind"], obj["metadata"].get("namespace") if obj["kind"] == "Role" else None,
         obj["metadata"]["name"]): [Rule.parse(rule) for rule in obj.get("rules") or ()]
        for obj in manifests if obj.get("kind") in ("Role", "ClusterRole")
    }
    grants = [DISCOVERY]
    for binding in manifests:
        if binding.get("kind") not in ("RoleBinding", "ClusterRoleBinding") or not any(
            subject.get("kind") == "ServiceAccount" and subject.get("name") == name
            and subject.get("namespace") == namespace for subject in binding.get("subjects") or ()
        ):
            continue
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        key = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        grants += [Grant(rule, scope) for rule in rules.get(key, ())]
    return User(f"system:serviceaccount:{namespace}:{name}", tuple(grants))


def forbidden_message(user: str, request: Attributes) -> str:
    """The API server's message for a refused request."""
    if request.api_group is None:
        return f'forbidden: User "{user}" cannot {request.verb} path "{request.path}"'
    what = f"{request.resource}.{request.api_group}" if request.api_group else request.resource
    subject = f'{what} "{request.name}"' if request.name else what
    where = (f'in the namespace "{request.namespace}"' if request.namespace
             else "at the cluster scope")
    return (f'{subject} is forbidden: User "{user}" cannot {request.verb} resource '
            f'"{request.full_resource}" in API group "{request.api_group}" {where}')


def _status(code: int, reason: str, message: str, **details: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "code": code, "reason": reason, "message": message, "details": details,
    }, status=code)


@attrs.define(kw_only=True)
class KubernetesApi(k8s.KubernetesEmulator):
    """kmock's KubernetesEmulator with RBAC, metadata, PUT, selectors, 201, 409 and GC.

    tokens: bearer token -> User. refusals: the message of every 403 answered.
    """

    tokens: dict[str, User] = attrs.field(factory=dict)
    refusals: list[str] = attrs.field(factory=list)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        header = raw_request.headers.get("Authorization", "")
        user = self.tokens.get(header.removeprefix("Bearer ")) if header.startswith(
            "Bearer ") else None
        if user is None:
            return _status(401, "Unauthorized", "Unauthorized")
        request = request_attributes(raw_request.method, raw_request.path, raw_request.query)
        if not user.may(request):
            message = forbidden_message(user.name, request)
            self.refusals.append(message)
            return _status(403, "Forbidden", message, name=request.name,
                           group=request.api_group or "", kind=request.resource)
        return await super().__call__(raw_request)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.method == enums.method.PUT and request.name:
            return await self._replace(request)
        if request.action == enums.action.UPDATE and isinstance(request.data, list):
            return await self._json_patch(request)
        # kmock tracks requests by identity, so the parsed body is completed in place
        if request.resource is not None and request.action == enums.action.CREATE:
            taken = self._taken(request)
            if taken is not None:
                return taken
            self._fill_created(request)
        elif request.resource is not None and request.action == enums.action.UPDATE:
            self._fill_patched(request)
        uid = self._uid_of(request) if request.action == enums.action.DELETE else None
        response = await super()._handle(request)
        if request.action == enums.action.CREATE and response.status == 200:
            response.set_status(201)
        if uid is not None and response.status < 300:
            await self._collect_garbage(uid)
        return response

    def _fill_created(self, request: rendering.Request) -> None:
        data = request.data
        if not isinstance(data, dict):
            return
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(_versions))
        meta["generation"] = 1
        meta["creationTimestamp"] = _now()
        if request.namespace:
            meta["namespace"] = request.namespace

    def _fill_patched(self, request: rendering.Request) -> None:
        data = request.data
        if not isinstance(data, dict):
            return  # a JSON patch list: kmock merges dicts only
        meta = data.get("metadata") or {}
        data["metadata"] = meta
        meta["resourceVersion"] = str(next(_versions))
        current = self._current(request)
        if current is not None and "spec" in data and not request.subresource:
            meta["generation"] = int(current.get("metadata", {}).get("generation") or 0) + 1

    def _taken(self, request: rendering.Request) -> aiohttp.web.Response | None:
        """409 AlreadyExists if the name a create asks for is taken, as a real server says."""
        data = request.data if isinstance(request.data, dict) else {}
        meta = data.get("metadata") or {}
        name, resource = meta.get("name"), request.resource
        key = (resource, request.namespace or meta.get("namespace"), name)
        if resource is None or not name or key not in self.objects or self.objects[key].deleted:
            return None
        what = f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)
        return _status(409, "AlreadyExists", f'{what} "{name}" already exists', name=name,
                       group=resource.group or "", kind=str(resource.plural))

    def _current(self, request: rendering.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key in self.objects and not self.objects[key].deleted:
            return dict(self.objects[key].raw)
        return None

    def _uid_of(self, request: rendering.Request) -> str | None:
        current = self._current(request) if request.name else None
        return None if current is None else current.get("metadata", {}).get("uid")

    async def _replace(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        body = json.loads(request.body or b"{}")
        async with self._lock:
            current = self._current(request)
            if current is None:
                return _status(404, "NotFound", f"{request.name} not found")
            meta = body.setdefault("metadata", {})
            sent = meta.get("resourceVersion")
            if sent and sent != current["metadata"].get("resourceVersion"):
                return _status(409, "Conflict", "the object has been modified")
            for key in ("uid", "creationTimestamp", "namespace"):
                meta[key] = current["metadata"].get(key)
            generation = int(current["metadata"].get("generation") or 1)
            meta["generation"] = generation + (body.get("spec") != current.get("spec"))
            meta["resourceVersion"] = str(next(_versions))
            if "status" in current:
                body["status"] = current["status"]
            key = (request.resource, request.namespace, request.name)
            self.objects[key].history.append(body)
            raw = self.objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    async def _json_patch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        async with self._lock:
            current = self._current(request)
            if current is None:
                return _status(404, "NotFound", f"{request.name} not found")
            try:
                body = jsonpatch.apply_patch(current, list(request.data), in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                return _status(422, "Invalid", str(exc))
            body.setdefault("metadata", {})["resourceVersion"] = str(next(_versions))
            if body.get("spec") != current.get("spec") and not request.subresource:
                body["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
            key = (request.resource, request.namespace, request.name)
            self.objects[key].history.append(body)
            raw = self.objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        answer: Any = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            answer["items"] = [
                item for item in answer["items"]
                if _selector_matches(selector, item.get("metadata", {}).get("labels") or {})
            ]
        resource = request.resource
        if resource is not None:
            info = self.resources[resource]
            group = f"{resource.group}/{resource.version}" if resource.group else resource.version
            answer["apiVersion"] = group
            answer["kind"] = f"{info.kind}List" if info.kind else "List"
        return answer

    async def _collect_garbage(self, uid: str) -> None:
        async with self._lock:
            doomed = [
                (key, obj) for key, obj in list(self.objects.items())
                if not obj.deleted and any(
                    ref.get("uid") == uid
                    for ref in obj.get("metadata", {}).get("ownerReferences") or []
                )
            ]
            for (resource, _, _), obj in doomed:
                raw = obj.raw
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})


RESOURCES: dict[str, dict[str, Any]] = {
    "jobs.mdm.io/v1alpha1/jobworkerpools": {
        "kind": "JobWorkerPool", "singular": "jobworkerpool", "namespaced": True,
        "shortnames": ["jwp"], "subresources": ["status"],
        "verbs": ["list", "watch", "get", "create", "update", "patch", "delete"],
    },
    "apps/v1/deployments": {
        "kind": "Deployment", "singular": "deployment", "namespaced": True,
        "subresources": ["status", "scale"],
        "verbs": ["list", "watch", "get", "create", "update", "patch", "delete"],
    },
    "v1/secrets": {
        "kind": "Secret", "singular": "secret", "namespaced": True,
        "verbs": ["list", "watch", "get", "create", "update", "patch", "delete"],
    },
    "v1/events": {
        "kind": "Event", "singular": "event", "namespaced": True,
        "verbs": ["list", "watch", "get", "create", "patch", "delete"],
    },
    "v1/namespaces": {
        "kind": "Namespace", "singular": "namespace", "namespaced": False,
        "verbs": ["list", "watch", "get", "create", "delete"],
    },
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition", "singular": "customresourcedefinition",
        "namespaced": False, "verbs": ["list", "watch", "get", "create"],
    },
}


def declare(api: KubernetesApi, keda: bool = False) -> None:
    """Declare the resources the operator uses (and KEDA's ScaledObjects if `keda`)."""
    for key, info in RESOURCES.items():
        api.resources[key] = kmock.ResourceInfo(**info)
    if keda:
        api.resources["keda.sh/v1alpha1/scaledobjects"] = kmock.ResourceInfo(
            kind="ScaledObject", singular="scaledobject", namespaced=True,
            verbs=["list", "watch", "get", "create", "update", "patch", "delete"],
        )


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig for `server` (plain HTTP) authenticating with bearer `token`."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path
