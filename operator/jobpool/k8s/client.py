"""The few Kubernetes API calls the operator makes, on the official client's auth and TLS.

Calls go out as plain JSON over the client's REST layer (no model classes), run in a thread
so the operator's event loop never blocks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

import kubernetes

from jobpool.errors import JobpoolError

_kube_config: Any = kubernetes.config  # its loaders are untyped

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 30.0
KEDA_PATH = "/apis/keda.sh/v1alpha1"


class ApiError(JobpoolError):
    """A Kubernetes API call answered with an error status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """Client configuration: `kubeconfig` if given, else in-cluster, else KUBECONFIG / ~/.kube.

    Raises kubernetes.config.ConfigException when none works.
    """
    configuration = kubernetes.client.Configuration()
    if kubeconfig:
        _kube_config.load_kube_config(
            config_file=kubeconfig, client_configuration=configuration
        )
        return configuration
    try:
        _kube_config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        _kube_config.load_kube_config(config_file=path, client_configuration=configuration)
    return configuration


def bearer_token(configuration: kubernetes.client.Configuration) -> str | None:
    """The bearer token the configuration authenticates with, if any (without "Bearer ")."""
    header = configuration.get_api_key_with_prefix(
        "BearerToken"
    ) or configuration.get_api_key_with_prefix("authorization")
    if not header:
        return None
    value = str(header)
    return value.split(" ", 1)[1] if " " in value else value


class KubeApi:
    """Async access to Deployments, ScaledObjects and Secrets of a namespace."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self.configuration = configuration
        self._client: Any = kubernetes.client.ApiClient(configuration)

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.configuration.host + path
        if query:
            url += "?" + urlencode(query)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        self._client.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        response = self._client.rest_client.request(
            method, url, headers=headers, body=body, _request_timeout=REQUEST_TIMEOUT
        )
        data = response.read()
        if not 200 <= response.status < 300:
            raise _error(response.status, data)
        return json.loads(data) if data else None

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One API call; returns the decoded JSON answer. Raises ApiError for an error status."""
        return await asyncio.to_thread(self._call, method, path, body, query, content_type)

    async def read_secret_value(self, namespace: str, name: str, key: str) -> str:
        """The decoded value of `key` in Secret `name`; ApiError 404 or KeyError if missing."""
        secret = await self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/secrets/{_q(name)}")
        data = (secret or {}).get("data") or {}
        if key in data:
            return base64.b64decode(data[key]).decode("utf-8")
        string_data = (secret or {}).get("stringData") or {}
        if key in string_data:
            return str(string_data[key])
        raise KeyError(f"Secret {namespace}/{name} has no key {key!r}")

    # Deployments

    def _deployments(self, namespace: str) -> str:
        return f"/apis/apps/v1/namespaces/{_q(namespace)}/deployments"

    async def list_deployments(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Deployments of `namespace` matching the label `selector`."""
        answer = await self.request(
            "GET", self._deployments(namespace), query={"labelSelector": selector}
        )
        return list((answer or {}).get("items") or [])

    async def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Deployment `name`, or None if there is none."""
        return await self._read(f"{self._deployments(namespace)}/{_q(name)}")

    async def create_deployment(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a Deployment; ApiError 409 AlreadyExists if the name is taken."""
        await self.request("POST", self._deployments(namespace), body=dict(body))

    async def replace_deployment(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> None:
        """Replace a Deployment (PUT); ApiError 409 if its resourceVersion moved on."""
        await self.request("PUT", f"{self._deployments(namespace)}/{_q(name)}", body=dict(body))

    async def delete_deployment(self, namespace: str, name: str) -> None:
        """Delete a Deployment and, in the background, its pods; gone already is fine."""
        await self._delete(f"{self._deployments(namespace)}/{_q(name)}")

    async def scale_deployment(self, namespace: str, name: str, replicas: int) -> None:
        """Write a Deployment's replicas and nothing else."""
        await self.request(
            "PATCH", f"{self._deployments(namespace)}/{_q(name)}",
            body={"spec": {"replicas": replicas}}, content_type=MERGE_PATCH,
        )

    # KEDA ScaledObjects

    def _scaled_objects(self, namespace: str) -> str:
        return f"{KEDA_PATH}/namespaces/{_q(namespace)}/scaledobjects"

    async def list_scaled_objects(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """ScaledObjects matching `selector`; ApiError 404 without KEDA, 403 if not granted."""
        answer = await self.request(
            "GET", self._scaled_objects(namespace), query={"labelSelector": selector}
        )
        return list((answer or {}).get("items") or [])

    async def read_scaled_object(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ScaledObject `name`, or None if there is none."""
        return await self._read(f"{self._scaled_objects(namespace)}/{_q(name)}")

    async def create_scaled_object(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create a ScaledObject."""
        await self.request("POST", self._scaled_objects(namespace), body=dict(body))

    async def replace_scaled_object(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> None:
        """Replace a ScaledObject (PUT)."""
        await self.request(
            "PUT", f"{self._scaled_objects(namespace)}/{_q(name)}", body=dict(body)
        )

    async def delete_scaled_object(self, namespace: str, name: str) -> None:
        """Delete a ScaledObject; gone already is fine."""
        await self._delete(f"{self._scaled_objects(namespace)}/{_q(name)}")

    async def _read(self, path: str) -> dict[str, Any] | None:
        try:
            answer: dict[str, Any] = await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return answer

    async def _delete(self, path: str) -> None:
        try:
            await self.request("DELETE", path, body={"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:
                raise


def _q(part: str) -> str:
    return quote(part, safe="")


def _error(status: int, data: bytes | None) -> ApiError:
    try:
        answer = json.loads(data or b"{}")
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    text = (data or b"").decode("utf-8", "replace")[:300]
    reason = str(answer.get("reason") or "Error")
    return ApiError(status, reason, str(answer.get("message") or text))
