"""A fake Kubernetes API server for operator tests: kmock's emulator plus what it lacks.

kmock 0.8 serves a stateful API over real HTTP but assigns no uid, resourceVersion,
generation or creationTimestamp, answers POST with 200, has no PUT, ignores label
selectors and runs no garbage collector. This subclass fills those in, as far as the
operator relies on them:

- create: uid, resourceVersion, generation 1, creationTimestamp, namespace; answers 201;
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
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import enums, k8s, rendering

_versions = itertools.count(1)


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


@attrs.define(kw_only=True)
class KubernetesApi(k8s.KubernetesEmulator):
    """kmock's KubernetesEmulator with metadata, PUT, selectors, 201 and garbage collection."""

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.method == enums.method.PUT and request.name:
            return await self._replace(request)
        if request.action == enums.action.UPDATE and isinstance(request.data, list):
            return await self._json_patch(request)
        # kmock tracks requests by identity, so the parsed body is completed in place
        if request.resource is not None and request.action == enums.action.CREATE:
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
                return self._status(404, "NotFound", f"{request.name} not found")
            meta = body.setdefault("metadata", {})
            sent = meta.get("resourceVersion")
            if sent and sent != current["metadata"].get("resourceVersion"):
                return self._status(409, "Conflict", "the object has been modified")
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
                return self._status(404, "NotFound", f"{request.name} not found")
            try:
                body = jsonpatch.apply_patch(current, list(request.data), in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                return self._status(422, "Invalid", str(exc))
            body.setdefault("metadata", {})["resourceVersion"] = str(next(_versions))
            if body.get("spec") != current.get("spec") and not request.subresource:
                body["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
            key = (request.resource, request.namespace, request.name)
            self.objects[key].history.append(body)
            raw = self.objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
        return aiohttp.web.json_response({
            "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
            "reason": reason, "message": message,
        }, status=code)

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


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for `server` (plain HTTP, no credentials)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path
