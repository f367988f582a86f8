"""The Kubernetes API calls of the operator, on lightkube (an async, typed client).

Children are written with server-side apply under the operator's field manager and never
carry `spec.replicas`; replicas go through the Deployment's scale subresource under the
scaler's own field manager, so neither overwrites the other (nor an HPA's, nor KEDA's).
A 409 Conflict or 429 TooManyRequests is retried after a short, growing pause, a few times.
Answers are plain dicts, as the pure planners take them.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast

import httpx2
import lightkube
from lightkube import codecs
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Secret
from lightkube.types import CascadeType, PatchType

from jobpool.core.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from jobpool.errors import JobpoolError
from jobpool.k8s.ownership import FIELD_MANAGER, SCALER

REQUEST_TIMEOUT = 30.0
RETRIES = 4
RETRY_PAUSE = 0.1
"""Seconds before the first retry of a 409 or 429; doubles per retry (0.1, 0.2, 0.4, 0.8)."""
MAX_RETRY_AFTER = 2.0

ScaledObject = create_namespaced_resource(
    "keda.sh", "v1alpha1", "ScaledObject", "scaledobjects")
TriggerAuthentication = create_namespaced_resource(
    "keda.sh", "v1alpha1", "TriggerAuthentication", "triggerauthentications")
JobWorkerPool = create_namespaced_resource(
    GROUP, VERSION, KIND, PLURAL)
ChildKind = Literal["Deployment", "ScaledObject", "TriggerAuthentication"]
_CHILDREN: dict[str, Any] = {
    "Deployment": Deployment, "ScaledObject": ScaledObject,
    "TriggerAuthentication": TriggerAuthentication,
}
T = TypeVar("T")


class ApiError(JobpoolError):
    """A Kubernetes API call answered with an error status (e.g. 403 Forbidden, 404)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NoCredentialsError(JobpoolError):
    """Neither a kubeconfig nor an in-cluster ServiceAccount gives access to a cluster."""


def load_config(kubeconfig: str | None = None) -> SingleConfig:
    """The cluster and credentials to use: `kubeconfig` if given, else in-cluster, else
    KUBECONFIG or ~/.kube/config. Raises NoCredentialsError when none works."""
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except ConfigError as exc:
        raise NoCredentialsError(str(exc)) from exc
    single = config.get()
    if single is None:
        raise NoCredentialsError("the kubeconfig has no current context")
    return single


def _api_error(exc: lightkube.ApiError) -> ApiError:
    status = exc.status
    return ApiError(int(status.code or exc.response.status_code), str(status.reason or "Error"),
                    str(status.message or exc.response.text[:300]))


def _retry_after(exc: lightkube.ApiError, attempt: int) -> float:
    pause = RETRY_PAUSE * 2.0 ** attempt
    header = exc.response.headers.get("Retry-After")
    if header and header.isdigit():
        pause = max(pause, min(float(header), MAX_RETRY_AFTER))
    return pause


async def _call(call: Callable[[], Awaitable[T]], *, retry: bool = True) -> T:
    """`call()`, with 409 and 429 retried (if `retry`); other errors become ApiError."""
    for attempt in range(RETRIES + 1):
        try:
            return await call()
        except lightkube.ApiError as exc:
            code = exc.response.status_code
            if not retry or code not in (409, 429) or attempt == RETRIES:
                raise _api_error(exc) from exc
            await asyncio.sleep(_retry_after(exc, attempt))
        except httpx2.HTTPStatusError as exc:  # an answer that is no Status (a proxy's page)
            response = exc.response
            raise ApiError(response.status_code, response.reason_phrase or "Error",
                           response.text[:300]) from exc
    raise AssertionError("unreachable")


def _as_dict(obj: Any) -> dict[str, Any]:
    return dict(obj.to_dict())


class KubeApi:
    """Async access to the pools' children, their Secrets, status, events and the Lease."""

    def __init__(self, config: SingleConfig) -> None:
        self.config = config
        self._client = lightkube.AsyncClient(
            config, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(REQUEST_TIMEOUT),
            trust_env=False,
        )

    async def close(self) -> None:
        """Release the connection pool."""
        await self._client.close()

    async def list_children(
        self, kind: ChildKind, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """The objects of `kind` in `namespace` whose labels include `labels`."""
        async def listing() -> list[dict[str, Any]]:
            return [_as_dict(obj) async for obj in self._client.list(
                _CHILDREN[kind], namespace=namespace, labels=dict(labels))]
        return await _call(listing)

    async def read_child(self, kind: ChildKind, namespace: str, name: str) -> dict[str, Any] | None:
        """The object `name` of `kind`, or None if there is none."""
        try:
            return _as_dict(await _call(
                lambda: self._client.get(_CHILDREN[kind], name, namespace=namespace)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def apply_child(self, kind: ChildKind, namespace: str,
                          body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply `body` as the operator's field manager, taking over fields that
        another manager changed (a hand-edited image): the operator's fields are its own."""
        name = str(body["metadata"]["name"])
        return _as_dict(await _call(lambda: self._client.patch(
            _CHILDREN[kind], name, dict(body), namespace=namespace,
            patch_type=PatchType.APPLY, force=True)))

    async def create_deployment(self, namespace: str, body: Mapping[str, Any],
                                replicas: int) -> bool:
        """Create the Deployment `body` with `replicas` (its lane's first count), written as
        the scaler, which owns replicas from then on; False when it exists already. A
        Deployment first applied without replicas would get the server's default of 1, and
        its pod would start (and claim jobs) before the scaler could set 0. The server makes
        the scaler the owner of every field: the caller applies the Deployment and hands
        the rest over (`k8s.ownership`)."""
        obj = cast(Deployment, Deployment.from_dict({
            **body, "metadata": {**body["metadata"], "namespace": namespace},
            "spec": {**body["spec"], "replicas": replicas}}))
        try:
            await _call(lambda: self._client.create(obj, field_manager=SCALER), retry=False)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return False
        return True

    async def patch_managed_fields(self, namespace: str, name: str,
                                   patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Apply the JSON patch `patch` to the Deployment `name`'s managedFields
        (`k8s.ownership.HandOver.patch`); ApiError 422 when an entry it tests changed."""
        return _as_dict(await _call(lambda: self._client.patch(
            Deployment, name, list(patch), namespace=namespace, patch_type=PatchType.JSON),
            retry=False))

    async def delete_child(self, kind: ChildKind, namespace: str, name: str) -> None:
        """Delete a child and, in the background, what it owns; gone already is fine."""
        try:
            await _call(lambda: self._client.delete(
                _CHILDREN[kind], name, namespace=namespace, cascade=CascadeType.BACKGROUND))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Write a Deployment's replicas through its scale subresource, as the scaler."""
        await _call(lambda: self._client.patch(
            Deployment.Scale, name, {"spec": {"replicas": replicas}}, namespace=namespace,
            patch_type=PatchType.MERGE, field_manager=SCALER))

    async def list_pools(self, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        """Every JobWorkerPool in `namespaces` (empty: in every namespace), as stored now."""
        async def listing(namespace: str) -> list[dict[str, Any]]:
            return [_as_dict(obj) async for obj in self._client.list(
                JobWorkerPool, namespace=namespace)]
        found: list[dict[str, Any]] = []
        for namespace in namespaces or (lightkube.ALL_NS,):
            found += await _call(functools.partial(listing, namespace))
        return found

    async def read_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The JobWorkerPool `name` as stored now, None if there is none. A list by name: the
        operator's role lists and watches pools, it has no `get` on them."""
        async def listing() -> list[dict[str, Any]]:
            return [_as_dict(obj) async for obj in self._client.list(
                JobWorkerPool, namespace=namespace, fields={"metadata.name": name})]
        found = await _call(listing)
        return found[0] if found else None

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        """The decoded value of `key` in Secret `name`; ApiError 404 or KeyError if missing."""
        secret = await _call(lambda: self._client.get(Secret, name, namespace=namespace))
        data = secret.data or {}
        if key in data:
            return base64.b64decode(data[key]).decode("utf-8")
        raise KeyError(f"Secret {namespace}/{name} has no key {key!r}")

    async def patch_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge `status` into the pool's status (through its status subresource)."""
        await _call(lambda: self._client.patch(
            JobWorkerPool.Status, name, {"status": dict(status)}, namespace=namespace,
            patch_type=PatchType.MERGE))

    async def post_event(self, pool: Mapping[str, Any], type_: Literal["Normal", "Warning"],
                         reason: str, message: str, now: str) -> None:
        """An Event about `pool` (the object as the API returned it); `now` in RFC 3339."""
        meta = pool.get("metadata") or {}
        event = cast(Event, Event.from_dict({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }))
        await _call(lambda: self._client.create(event))

    # the leader Lease: conflicts are answers here (another replica won), never retried

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease `name`, or None if there is none."""
        try:
            return _as_dict(await _call(lambda: self._client.get(Lease, name,
                                                                 namespace=namespace)))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_lease(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Lease; ApiError 409 if another replica created it first."""
        lease = codecs.from_dict(dict(body))
        return _as_dict(await _call(lambda: self._client.create(lease), retry=False))

    async def replace_lease(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace a Lease at the resourceVersion in `body`; ApiError 409 if it moved on."""
        lease = codecs.from_dict(dict(body))
        return _as_dict(await _call(lambda: self._client.replace(lease), retry=False))
