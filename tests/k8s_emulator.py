"""A fake Kubernetes API server for operator tests: kmock's emulator writing objects as a
real API server does, as far as the operator relies on it.

kmock 0.8 serves a stateful API over real HTTP (discovery, list, watch, get) but checks no
credentials and stores writes as plain dict merges. This subclass answers every write
itself:

- authentication: a request must carry `Authorization: Bearer <token>` of a known User,
  else 401 Unauthorized;
- authorization, before anything else looks at the request (so the path of an API that
  does not exist is 403 as well, as on a real server): a User with grants (compiled from
  RBAC objects by `service_account`, e.g. the chart's rendered ClusterRoles, Roles and
  their bindings) gets 403 Forbidden, with the API server's message, for every request no
  grant allows; refusals are kept in `refusals`. Every authenticated user may read the
  discovery paths (the default ClusterRole system:discovery). A server-side apply that
  creates its object needs `create` as well; a new ownerReference with blockOwnerDeletion
  needs `update` on the owner's `finalizers` subresource;
- custom resources from their CRD (`install_crd`): the schema's defaults filled in, unknown
  fields pruned, and 422 Invalid for a value the schema refuses;
- create: uid, resourceVersion, generation 1, creationTimestamp, namespace; 201, or 409
  AlreadyExists when the name is taken;
- PUT and patches (merge, strategic as merge, JSON patch): 409 Conflict when the
  resourceVersion sent is stale; `generation` + 1 only when something outside metadata and
  status changed; status written only through the status subresource, which changes
  nothing else;
- server-side apply (`application/apply-patch+yaml`): creates a missing object, keeps
  managedFields per field manager (lists count as one field), answers 409 for a field
  another manager owns with another value unless `force=true`, and removes the fields a
  manager stops applying; other writes take the fields they change;
- the scale subresource of Deployments (read and write `spec.replicas` alone), and a
  minimal Deployment status (ready replicas follow `spec.replicas`, as a controller with
  instantly ready pods would);
- delete: with finalizers, only `deletionTimestamp` is set until they are removed; children
  whose ownerReferences name the deleted uid go too (the garbage collector's job);
- `throttle`: the next writes get 429 TooManyRequests, as from API priority and fairness;
- list: `labelSelector` (equality terms), `fieldSelector` on metadata.name and
  metadata.namespace (the fields every resource, custom ones included, can be selected by;
  400 BadRequest for any other), and kind/apiVersion on the list.
"""

from __future__ import annotations

import contextvars
import copy
import datetime
import itertools
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import jsonschema
import kmock
import yaml
from kmock._internal import k8s, rendering

from jobpool.core.crd import CRD_FILE

_versions = itertools.count(1)
_DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                   "/openapi/*", "/readyz", "/version", "/version/")
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SELECTABLE_FIELDS = ("metadata.name", "metadata.namespace")


def _fields_match(selector: str, item: dict[str, Any]) -> bool:
    """Whether `item` matches the field selector's equality terms; Refused 400 for a field
    other than SELECTABLE_FIELDS, as the API server answers for a custom resource."""
    metadata = item.get("metadata") or {}
    for term in filter(None, (part.strip() for part in selector.split(","))):
        negated = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        if key.strip() not in SELECTABLE_FIELDS:
            raise Refused(400, "BadRequest",
                          f'"{key.strip()}" is not a known field selector: only '
                          '"metadata.name", "metadata.namespace"')
        found = str(metadata.get(key.strip().removeprefix("metadata."), ""))
        if (found == value.strip()) == negated:
            return False
    return True


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


def _json(answer: Any, status: int = 200) -> aiohttp.web.Response:
    """A JSON answer with the API server's exact Content-Type (no charset)."""
    return aiohttp.web.Response(body=json.dumps(answer).encode(), status=status,
                                headers={"Content-Type": "application/json"})


def _status(code: int, reason: str, message: str, **details: str) -> aiohttp.web.Response:
    return _json({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "code": code, "reason": reason, "message": message, "details": details,
    }, status=code)


class Refused(Exception):
    """A request the server answers with an error Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# -- field paths and managed fields (server-side apply) ----------------------------------------

Path_ = tuple[str, ...]
_UNOWNED = {("apiVersion",), ("kind",), ("status",)} | {
    ("metadata", key) for key in ("name", "namespace", "uid", "resourceVersion", "generation",
                                  "creationTimestamp", "managedFields", "deletionTimestamp")}
_SYSTEM_META = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                "deletionTimestamp", "namespace", "name")


def _owned(path: Path_) -> bool:
    return not any(path[:len(unowned)] == unowned for unowned in _UNOWNED)


def leaf_paths(obj: Any, prefix: Path_ = ()) -> set[Path_]:
    """The fields an applied configuration sets: dict keys down to scalars; lists are atomic
    (as the operator's lists are replaced whole), empty dicts set nothing."""
    if isinstance(obj, dict):
        found: set[Path_] = set()
        for key, value in obj.items():
            found |= leaf_paths(value, (*prefix, str(key)))
        return {path for path in found if _owned(path)}
    return {prefix} if prefix else set()


def changed_paths(before: Any, after: Any, prefix: Path_ = ()) -> set[Path_]:
    """The fields whose values differ between two objects (lists atomic)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found: set[Path_] = set()
        for key in set(before) | set(after):
            if before.get(key) != after.get(key):
                found |= changed_paths(before.get(key), after.get(key), (*prefix, str(key)))
        return {path for path in found if _owned(path)}
    return {prefix} if prefix and before != after else set()


def _get(obj: Any, path: Path_) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _set(obj: dict[str, Any], path: Path_, value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def _remove(obj: dict[str, Any], path: Path_) -> None:
    parents = [obj]
    for key in path[:-1]:
        child = parents[-1].get(key)
        if not isinstance(child, dict):
            return
        parents.append(child)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):  # drop the dicts the removal emptied
        if parents[depth] == {}:
            parents[depth - 1].pop(path[depth - 1], None)


def _overlap(one: Path_, other: Path_) -> bool:
    shorter = min(len(one), len(other))
    return one[:shorter] == other[:shorter]


def fields_v1(paths: Iterable[Path_]) -> dict[str, Any]:
    """Paths in the API server's FieldsV1 form ({"f:spec": {"f:replicas": {}}})."""
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def paths_of(tree: Mapping[str, Any], prefix: Path_ = ()) -> set[Path_]:
    """The inverse of fields_v1."""
    found: set[Path_] = set()
    for key, child in tree.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        found |= paths_of(child, path) if child else {path}
    return found


@attrs.frozen
class Manager:
    """One entry of managedFields."""

    name: str
    operation: str  # Apply | Update
    subresource: str = ""


def managers_of(obj: Mapping[str, Any]) -> dict[Manager, set[Path_]]:
    """The managedFields of `obj` as sets of field paths."""
    found: dict[Manager, set[Path_]] = {}
    for entry in (obj.get("metadata") or {}).get("managedFields") or ():
        key = Manager(entry["manager"], entry["operation"], entry.get("subresource", ""))
        found[key] = paths_of(entry.get("fieldsV1") or {})
    return found


def write_managers(obj: dict[str, Any], managers: Mapping[Manager, set[Path_]]) -> None:
    entries = []
    for manager, paths in managers.items():
        if not paths:
            continue
        entry = {"manager": manager.name, "operation": manager.operation,
                 "apiVersion": obj.get("apiVersion"), "time": _now(),
                 "fieldsType": "FieldsV1", "fieldsV1": fields_v1(paths)}
        if manager.subresource:
            entry["subresource"] = manager.subresource
        entries.append(entry)
    obj.setdefault("metadata", {})["managedFields"] = entries


def take_fields(
    managers: dict[Manager, set[Path_]], taker: Manager, paths: set[Path_]
) -> dict[Manager, set[Path_]]:
    """`paths` now belong to `taker` alone (what an update or a forced apply does)."""
    result = {m: {p for p in owned if not any(_overlap(p, q) for q in paths)}
              for m, owned in managers.items() if m != taker}
    result[taker] = (managers.get(taker, set()) if taker.operation == "Update" else set()) | paths
    return result


def server_side_apply(
    current: Mapping[str, Any] | None, applied: Mapping[str, Any], manager: str, force: bool
) -> dict[str, Any]:
    """The object after `manager` applies `applied` to `current` (None: it does not exist).

    Raises Refused 409 Conflict for a field another manager owns with another value, unless
    `force` (then the field changes hands). Fields this manager applied before and no longer
    applies are removed unless another manager owns them too.
    """
    me = Manager(manager, "Apply")
    base: dict[str, Any] = copy.deepcopy(dict(current or {}))
    managers = managers_of(base)
    mine = leaf_paths(dict(applied))
    conflicts = sorted(
        (other.name, path) for other, owned in managers.items() if other != me
        for path in mine if any(_overlap(path, q) for q in owned)
        and _get(base, path) != _get(applied, path)
    )
    if conflicts and not force:
        lines = "\n".join(f'- conflict with "{name}": .{".".join(path)}'
                          for name, path in conflicts)
        raise Refused(409, "Conflict",
                      f"Apply failed with {len(conflicts)} conflict(s):\n{lines}")
    others = set().union(*(owned for m, owned in managers.items() if m != me), set())
    for path in managers.get(me, set()) - mine:
        if not any(_overlap(path, q) for q in others - {path}) and path not in others:
            _remove(base, path)
    for path in sorted(mine):
        _set(base, path, _get(applied, path))
    for key in ("apiVersion", "kind"):
        base[key] = applied.get(key, base.get(key))
    meta = base.setdefault("metadata", {})
    for key in ("name", "namespace"):
        if (applied.get("metadata") or {}).get(key):
            meta[key] = applied["metadata"][key]
    write_managers(base, take_fields(managers, me, mine))
    return base


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it: a value that replaces
    another whole (a list) keeps none of its objects' null fields (a status entry written
    with `lastRunTime: null` is stored without the field)."""
    if not isinstance(patch, dict):
        return _without_nulls(copy.deepcopy(patch))
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _without_nulls(value: Any) -> Any:
    """`value` without the null fields of the objects in it, at any depth."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


# -- CRD schemas: defaults, pruning, validation ------------------------------------------------


def _jsonschema_of(schema: Any) -> Any:
    """An OpenAPI v3 schema as JSON Schema (`nullable` becomes a null type)."""
    if isinstance(schema, list):
        return [_jsonschema_of(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: _jsonschema_of(value) for key, value in schema.items()
                 if not key.startswith("x-kubernetes")}
    if schema.get("nullable") and "type" in converted:
        converted["type"] = [converted["type"], "null"]
    for bound in ("Minimum", "Maximum"):  # OpenAPI's boolean flags are bounds in JSON Schema
        if converted.get(f"exclusive{bound}") is True:
            converted[f"exclusive{bound}"] = converted.pop(bound.lower())
        elif converted.get(f"exclusive{bound}") is False:
            del converted[f"exclusive{bound}"]
    return converted


def apply_defaults(obj: Any, schema: Mapping[str, Any]) -> Any:
    """`obj` with the schema's defaults filled in where fields are missing (structural)."""
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = apply_defaults(obj[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj:
                obj[key] = apply_defaults(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


def prune(obj: Any, schema: Mapping[str, Any]) -> Any:
    """`obj` without the fields its structural schema does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return obj
    if isinstance(obj, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties is not None:
            return {key: prune(value, properties[key]) for key, value in obj.items()
                    if key in properties}
        if isinstance(extra, dict):
            return {key: prune(value, extra) for key, value in obj.items()}
        return obj
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in obj]
    return obj


@attrs.frozen
class CustomResource:
    """A CRD's served version: kind, whether it has a status subresource, its schema."""

    kind: str
    group: str
    schema: Mapping[str, Any]
    status_subresource: bool

    def admit(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Default, prune and validate `obj`; Refused 422 Invalid names every bad field."""
        meta = obj.get("metadata")
        body = {key: value for key, value in obj.items() if key != "metadata"}
        body = prune(apply_defaults(body, self.schema), self.schema)
        validator = jsonschema.Draft7Validator(_jsonschema_of(
            {**self.schema, "properties": {k: v for k, v in
                                           (self.schema.get("properties") or {}).items()
                                           if k != "metadata"}}))
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        if errors:
            name = (meta or {}).get("name")
            causes = "; ".join(
                f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: Invalid value: "
                f"{json.dumps(error.instance)}: {error.message}" for error in errors)
            raise Refused(422, "Invalid",
                          f'{self.kind}.{self.group} "{name}" is invalid: {causes}')
        return {**body, "metadata": meta}


def custom_resource(crd: Mapping[str, Any]) -> tuple[str, CustomResource]:
    """The resource key ("group/version/plural") and rules of a CRD's first served version."""
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("served", True))
    key = f"{spec['group']}/{version['name']}/{spec['names']['plural']}"
    return key, CustomResource(
        kind=spec["names"]["kind"], group=spec["group"],
        schema=version["schema"]["openAPIV3Schema"],
        status_subresource="status" in (version.get("subresources") or {}),
    )


# -- the server --------------------------------------------------------------------------------

_CALLER: contextvars.ContextVar[User] = contextvars.ContextVar("caller")
APPLY = "application/apply-patch+yaml"
_STATUS_SUBRESOURCE = {"apps/v1/deployments", "keda.sh/v1alpha1/scaledobjects"}


def _key_of(resource: Any) -> str:
    return "/".join(part for part in (resource.group, resource.version, resource.plural) if part)


@attrs.define(kw_only=True)
class KubernetesApi(k8s.KubernetesEmulator):
    """kmock's KubernetesEmulator that writes objects as a real API server does.

    tokens: bearer token -> User. refusals: the message of every 403 answered.
    crds: resource key -> its CRD's rules (see `install_crd`).
    """

    tokens: dict[str, User] = attrs.field(factory=dict)
    refusals: list[str] = attrs.field(factory=list)
    crds: dict[str, CustomResource] = attrs.field(factory=dict)
    throttle: int = 0
    """How many of the next writes to answer 429 TooManyRequests (Retry-After: 0)."""

    def install_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CRD's resource with its schema's defaults, pruning and validation."""
        key, rules = custom_resource(crd)
        self.crds[key] = rules
        spec = crd["spec"]
        version = next(v for v in spec["versions"] if v.get("served", True))
        self.resources[key] = kmock.ResourceInfo(
            kind=spec["names"]["kind"], singular=spec["names"].get("singular"),
            namespaced=spec.get("scope") == "Namespaced",
            shortnames=spec["names"].get("shortNames") or [],
            subresources=list(version.get("subresources") or {}),
            verbs=["list", "watch", "get", "create", "update", "patch", "delete"],
        )

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        header = raw_request.headers.get("Authorization", "")
        user = self.tokens.get(header.removeprefix("Bearer ")) if header.startswith(
            "Bearer ") else None
        if user is None:
            return _status(401, "Unauthorized", "Unauthorized")
        request = request_attributes(raw_request.method, raw_request.path, raw_request.query)
        if not user.may(request):
            return self._forbid(user, request)
        if self.throttle > 0 and raw_request.method not in ("GET", "HEAD"):
            self.throttle -= 1
            response = _status(429, "TooManyRequests", "the server has received too many "
                               "requests and has asked us to try again later")
            response.headers["Retry-After"] = "0"
            return response
        _CALLER.set(user)
        return await super().__call__(raw_request)

    def _forbid(self, user: User, request: Attributes) -> aiohttp.web.Response:
        message = forbidden_message(user.name, request)
        self.refusals.append(message)
        return _status(403, "Forbidden", message, name=request.name,
                       group=request.api_group or "", kind=request.resource)

    def _check(self, verb: str, resource: Any, namespace: str | None, name: str,
               subresource: str = "") -> None:
        """Refused 403 unless the caller may `verb` (a second check, e.g. create by apply)."""
        user = _CALLER.get()
        attributes = Attributes(verb, "", resource.group or "", resource.plural, subresource,
                                namespace or "", name)
        if not user.may(attributes):
            message = forbidden_message(user.name, attributes)
            self.refusals.append(message)
            raise Refused(403, "Forbidden", message)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        method = str(request.method.value if hasattr(request.method, "value") else
                     request.method).upper()
        if resource is None or (method == "GET" and not request.name) or (
            method == "DELETE" and not request.name
        ):
            try:
                return await super()._handle(request)
            except Refused as refused:  # a list's selector
                return _status(refused.code, refused.reason, refused.message,
                               kind=str(getattr(resource, "plural", "")))
        try:
            async with self._lock:
                if method == "GET" and request.subresource != "scale":
                    code, answer = 200, self._fetch(request)
                elif request.subresource == "scale":
                    code, answer = await self._scale(request, method)
                elif request.subresource not in (None, "status"):
                    raise Refused(404, "NotFound", "the server could not find the resource")
                elif method == "POST":
                    code, answer = await self._create(request)
                elif method == "DELETE":
                    code, answer = await self._delete(request)
                elif method in ("PUT", "PATCH"):
                    code, answer = await self._write(request, method)
                else:
                    raise Refused(405, "MethodNotAllowed", f"{method} is not allowed")
        except Refused as refused:
            return _status(refused.code, refused.reason, refused.message,
                           name=request.name or "", kind=str(resource.plural))
        return _json(answer, status=code)

    def _fetch(self, request: rendering.Request) -> dict[str, Any]:
        found = self._stored(request.resource, request.namespace, str(request.name))
        if found is None or request.subresource not in (None, "status"):
            what = request.resource
            raise Refused(404, "NotFound", f'{what.plural}.{what.group} "{request.name}" '
                          "not found" if what.group else f'{what.plural} "{request.name}" '
                          "not found")
        return found

    # storage

    def _stored(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key in self._objects and not self._objects[key].deleted:
            return copy.deepcopy(dict(self._objects[key].raw))
        return None

    async def _save(self, resource: Any, namespace: str | None, body: dict[str, Any],
                    event: str) -> dict[str, Any]:
        key = (resource, namespace, body["metadata"]["name"])
        if key not in self._objects:
            self._objects[key] = body
        elif self._objects[key].deleted:
            self._objects[key].create(body)
        else:
            self._objects[key].history.append(body)
        raw: dict[str, Any] = self._objects[key].raw
        await self._buses[resource].put({"type": event, "object": raw})
        return copy.deepcopy(raw)

    async def _drop(self, resource: Any, namespace: str | None, name: str, *,
                    orphan: bool = False) -> dict[str, Any]:
        """Delete the object, and what it owns (`orphan`: the owned objects lose their
        reference to it instead, as with `propagationPolicy=Orphan`)."""
        obj = self._objects[(resource, namespace, name)]
        raw = copy.deepcopy(dict(obj.raw))
        obj.delete()
        await self._buses[resource].put({"type": "DELETED", "object": raw})
        if orphan:
            await self._orphan_dependents(raw["metadata"].get("uid"))
        else:
            await self._collect_garbage(raw["metadata"].get("uid"))
        return raw

    async def delete_in_watch_gap(self, path: str) -> None:
        """Delete the object at `path` (e.g. /apis/g/v/namespaces/ns/plural/name) as a real
        server does while a client's watch is cut: the object and what it owns go, and the
        watch, listed again, sends no DELETED for it."""
        *prefix, plural, name = path.strip("/").split("/")
        namespace = prefix[prefix.index("namespaces") + 1] if "namespaces" in prefix else None
        (resource,) = [r for r in self.resources if r.plural == plural]
        async with self._lock:
            obj = self._objects[(resource, namespace, name)]
            uid = obj.raw["metadata"].get("uid")
            obj.delete()
            await self._collect_garbage(uid)

    # writes

    def _admit(self, resource: Any, obj: dict[str, Any], current: dict[str, Any] | None,
               subresource: str | None) -> dict[str, Any]:
        """What a write stores: status and spec each only through their own endpoint,
        defaults, validation, generation, resourceVersion, a Deployment's status."""
        key = _key_of(resource)
        has_status = key in _STATUS_SUBRESOURCE or (
            key in self.crds and self.crds[key].status_subresource)
        if current is not None and subresource == "status":
            obj = {**current, "status": obj.get("status")}
            if obj["status"] is None:
                obj.pop("status")
        elif has_status:
            obj = {k: v for k, v in obj.items() if k != "status"}
            if current is not None and "status" in current:
                obj["status"] = current["status"]
        if key in self.crds:
            obj = self.crds[key].admit(obj)
        if key == "apps/v1/deployments":
            obj.setdefault("spec", {}).setdefault("replicas", 1)
        meta = obj.setdefault("metadata", {})
        if current is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["generation"] = 1
            meta["creationTimestamp"] = _now()
        else:
            old = current["metadata"]
            for field in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
                if old.get(field) is not None:
                    meta[field] = old[field]
            content = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
            before = {k: v for k, v in current.items() if k not in ("metadata", "status")}
            meta["generation"] = int(old.get("generation") or 1) + (content != before)
        self._check_owner_references(resource, obj, current)
        meta["resourceVersion"] = str(next(_versions))
        if key == "apps/v1/deployments":
            replicas = int(obj["spec"]["replicas"])
            obj["status"] = {
                "observedGeneration": meta["generation"], "replicas": replicas,
                "readyReplicas": replicas, "availableReplicas": replicas,
                "updatedReplicas": replicas,
            }
        return obj

    def _check_owner_references(self, resource: Any, obj: Mapping[str, Any],
                                current: Mapping[str, Any] | None) -> None:
        """A new ownerReference that blocks the owner's deletion needs `update` on the
        owner's finalizers (the OwnerReferencesPermissionEnforcement admission plugin)."""
        old = (current or {}).get("metadata", {}).get("ownerReferences") or []
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
            if not ref.get("blockOwnerDeletion") or ref in old:
                continue
            group, _, _ = str(ref.get("apiVersion")).rpartition("/")
            owner = next((r for r, info in self.resources.items()
                          if info.kind == ref.get("kind") and (r.group or "") == group), None)
            if owner is not None:
                self._check("update", owner, (obj.get("metadata") or {}).get("namespace"),
                            str(ref.get("name")), "finalizers")

    async def _create(self, request: rendering.Request) -> tuple[int, dict[str, Any]]:
        body = json.loads(request.body or b"{}")
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        namespace = request.namespace or meta.get("namespace")
        if namespace:
            meta["namespace"] = namespace
        resource = request.resource
        if self._stored(resource, namespace, meta.get("name")) is not None:
            what = (f"{resource.plural}.{resource.group}" if resource.group
                    else str(resource.plural))
            raise Refused(409, "AlreadyExists", f'{what} "{meta["name"]}" already exists')
        manager = Manager(request.params.get("fieldManager") or "unknown", "Update")
        body = self._admit(resource, body, None, None)
        write_managers(body, {manager: leaf_paths(body)})
        return 201, await self._save(resource, namespace, body, "ADDED")

    async def _write(self, request: rendering.Request, method: str) -> tuple[int, dict[str, Any]]:
        resource, namespace, name = request.resource, request.namespace, str(request.name)
        current = self._stored(resource, namespace, name)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        applying = method == "PATCH" and content_type == APPLY
        if current is None and not applying:
            raise Refused(404, "NotFound", f'{resource.plural} "{name}" not found')
        if current is None:
            self._check("create", resource, namespace, name)
        if applying:
            manager = request.params.get("fieldManager")
            if not manager:
                raise Refused(400, "BadRequest", "fieldManager is required for apply requests")
            applied = yaml.safe_load(request.body or b"{}") or {}
            sent = (applied.get("metadata") or {}).get("resourceVersion")
            body = server_side_apply(current, applied, manager,
                                     request.params.get("force") in ("true", "1"))
            if namespace:
                body["metadata"]["namespace"] = namespace
        else:
            body, sent = self._updated(request, method, current or {}, content_type)
        if current is not None and sent and sent != current["metadata"].get("resourceVersion"):
            raise Refused(409, "Conflict",
                          f'Operation cannot be fulfilled on {resource.plural} "{name}": the '
                          "object has been modified; please apply your changes to the latest "
                          "version and try again")
        body = self._admit(resource, body, current, request.subresource)
        if not applying:
            taker = Manager(request.params.get("fieldManager") or "unknown", "Update",
                            request.subresource or "")
            write_managers(body, take_fields(managers_of(body), taker,
                                             changed_paths(current, body)))
        meta = body["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            await self._save(resource, namespace, body, "MODIFIED")
            return 200, await self._drop(resource, namespace, name)
        event = "ADDED" if current is None else "MODIFIED"
        return (201 if current is None else 200), await self._save(
            resource, namespace, body, event)

    def _updated(self, request: rendering.Request, method: str, current: dict[str, Any],
                 content_type: str) -> tuple[dict[str, Any], str | None]:
        """A PUT's or a (merge, strategic, JSON) patch's object, and the resourceVersion sent."""
        if method == "PUT":
            body = json.loads(request.body or b"{}")
            body.setdefault("metadata", {})["managedFields"] = current["metadata"].get(
                "managedFields")
            return body, body["metadata"].get("resourceVersion")
        patch = json.loads(request.body or b"null")
        if content_type == "application/json-patch+json":
            try:
                body = jsonpatch.apply_patch(current, patch, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise Refused(422, "Invalid", str(exc)) from exc
            sent = body["metadata"].get("resourceVersion")
            return body, None if sent == current["metadata"].get("resourceVersion") else sent
        sent = ((patch or {}).get("metadata") or {}).get("resourceVersion")
        return merge_patch(current, patch), sent

    async def _scale(self, request: rendering.Request, method: str) -> tuple[int, dict[str, Any]]:
        """The scale subresource of a Deployment: read and write spec.replicas alone."""
        resource, namespace, name = request.resource, request.namespace, str(request.name)
        current = self._stored(resource, namespace, name)
        if current is None or _key_of(resource) != "apps/v1/deployments":
            raise Refused(404, "NotFound", f'{resource.plural} "{name}" not found')
        scale = _scale_of(current)
        if method == "GET":
            return 200, scale
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type == APPLY:
            changed = merge_patch(scale, yaml.safe_load(request.body or b"{}"))
            operation = "Apply"
        else:
            changed, _ = self._updated(request, method, scale, content_type)
            operation = "Update"
        replicas = (changed.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise Refused(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
        body = copy.deepcopy(current)
        body["spec"]["replicas"] = replicas
        body = self._admit(resource, body, current, None)
        manager = Manager(request.params.get("fieldManager") or "unknown", operation, "scale")
        write_managers(body, take_fields(managers_of(body), manager, {("spec", "replicas")}))
        return 200, _scale_of(await self._save(resource, namespace, body, "MODIFIED"))

    async def _delete(self, request: rendering.Request) -> tuple[int, dict[str, Any]]:
        resource, namespace, name = request.resource, request.namespace, str(request.name)
        current = self._stored(resource, namespace, name)
        if current is None:
            raise Refused(404, "NotFound", f'{resource.plural} "{name}" not found')
        if not current["metadata"].get("finalizers"):
            return 200, await self._drop(
                resource, namespace, name,
                orphan=request.params.get("propagationPolicy") == "Orphan")
        if not current["metadata"].get("deletionTimestamp"):
            current["metadata"]["deletionTimestamp"] = _now()
            current["metadata"]["resourceVersion"] = str(next(_versions))
            return 200, await self._save(resource, namespace, current, "MODIFIED")
        return 200, current

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        answer: Any = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            answer["items"] = [
                item for item in answer["items"]
                if _selector_matches(selector, item.get("metadata", {}).get("labels") or {})
            ]
        fields = request.params.get("fieldSelector")
        if fields:
            answer["items"] = [item for item in answer["items"] if _fields_match(fields, item)]
        answer["metadata"] = {"resourceVersion": str(next(_versions))}
        resource = request.resource
        if resource is not None:
            info = self.resources[resource]
            group = f"{resource.group}/{resource.version}" if resource.group else resource.version
            answer["apiVersion"] = group
            answer["kind"] = f"{info.kind}List" if info.kind else "List"
        return answer

    def _dependents(self, uid: str | None) -> list[tuple[Any, str | None, str]]:
        """The keys of the stored objects whose ownerReferences name `uid`."""
        if uid is None:
            return []
        return [key for key, obj in list(self.objects.items())
                if not obj.deleted and any(
                    ref.get("uid") == uid
                    for ref in obj.get("metadata", {}).get("ownerReferences") or [])]

    async def _orphan_dependents(self, uid: str | None) -> None:
        """Take the references to `uid` off the objects it owned (the GC's orphaning)."""
        for resource, namespace, name in self._dependents(uid):
            current = self._stored(resource, namespace, name)
            if current is None:
                continue
            kept = [ref for ref in current["metadata"]["ownerReferences"]
                    if ref.get("uid") != uid]
            if kept:
                current["metadata"]["ownerReferences"] = kept
            else:
                del current["metadata"]["ownerReferences"]
            current["metadata"]["resourceVersion"] = str(next(_versions))
            await self._save(resource, namespace, current, "MODIFIED")

    async def _collect_garbage(self, uid: str | None) -> None:
        """Delete (or, with finalizers, mark deleted) the objects `uid` owned: the GC's job."""
        for resource, namespace, name in self._dependents(uid):
            current = self._stored(resource, namespace, name)
            if current is None:
                continue
            if current["metadata"].get("finalizers"):
                current["metadata"].setdefault("deletionTimestamp", _now())
                await self._save(resource, namespace, current, "MODIFIED")
            else:
                await self._drop(resource, namespace, name)

def _scale_of(deployment: Mapping[str, Any]) -> dict[str, Any]:
    meta = deployment["metadata"]
    labels = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion",
                                                "creationTimestamp") if key in meta},
        "spec": {"replicas": int(deployment["spec"].get("replicas") or 0)},
        "status": {"replicas": int((deployment.get("status") or {}).get("replicas") or 0),
                   "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))},
    }


CRD = Path(__file__).resolve().parents[1] / "crds" / CRD_FILE
_ALL_VERBS = ["list", "watch", "get", "create", "update", "patch", "delete"]
RESOURCES: dict[str, dict[str, Any]] = {
    "apps/v1/deployments": {
        "kind": "Deployment", "singular": "deployment", "namespaced": True,
        "subresources": ["status", "scale"], "verbs": _ALL_VERBS,
    },
    "v1/secrets": {
        "kind": "Secret", "singular": "secret", "namespaced": True, "verbs": _ALL_VERBS,
    },
    "v1/events": {
        "kind": "Event", "singular": "event", "namespaced": True, "verbs": _ALL_VERBS,
    },
    "v1/namespaces": {
        "kind": "Namespace", "singular": "namespace", "namespaced": False,
        "verbs": ["list", "watch", "get", "create", "delete"],
    },
    "coordination.k8s.io/v1/leases": {
        "kind": "Lease", "singular": "lease", "namespaced": True, "verbs": _ALL_VERBS,
    },
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition", "singular": "customresourcedefinition",
        "namespaced": False, "verbs": ["list", "watch", "get", "create"],
    },
}
KEDA: dict[str, dict[str, Any]] = {
    "keda.sh/v1alpha1/scaledobjects": {
        "kind": "ScaledObject", "singular": "scaledobject", "namespaced": True,
        "subresources": ["status"], "verbs": _ALL_VERBS,
    },
    "keda.sh/v1alpha1/triggerauthentications": {
        "kind": "TriggerAuthentication", "singular": "triggerauthentication",
        "namespaced": True, "verbs": _ALL_VERBS,
    },
}


def declare(api: KubernetesApi, keda: bool = False, crd: bool = True) -> None:
    """Declare the resources the operator uses, the JobWorkerPool CRD from crds/ unless not
    `crd` (see install_pool_crd), and KEDA's ScaledObjects and TriggerAuthentications if
    `keda`."""
    for key, info in (RESOURCES | (KEDA if keda else {})).items():
        api.resources[key] = kmock.ResourceInfo(**info)
    if crd:
        install_pool_crd(api)


def install_pool_crd(api: KubernetesApi) -> None:
    """The JobWorkerPool CRD from crds/, established at once."""
    api.install_crd(yaml.safe_load(CRD.read_text()))


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig for `server` (plain HTTP) authenticating with bearer `token`."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path


class Failure(Exception):
    """An error Status the server answered."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class RawClient:
    """Plain HTTP requests to the fake server as the holder of `token` (what kubectl sends)."""

    def __init__(self, server: str, token: str) -> None:
        self.server = server
        self.token = token
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self, method: str, path: str, body: Any = None, *,
        content_type: str = "application/json", query: Mapping[str, str] | None = None,
    ) -> Any:
        """One call; the decoded answer. Raises Failure for an error status."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        data = None if body is None else (
            body if isinstance(body, (str, bytes)) else json.dumps(body))
        async with self._session.request(
            method, self.server + path, data=data, params=dict(query or {}),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        ) as response:
            answer = await response.json(content_type=None)
            if response.status >= 400:
                raise Failure(response.status, str(answer.get("reason")),
                              str(answer.get("message")))
            return answer

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
