"""The operator's health endpoints: liveness (the process answers) and readiness (it serves
pools: the JobWorkerPool API is there and the pools are watched).

A replica waiting for the CRD to be established is alive (a restart would not help) but
not ready, so `kubectl rollout status` and `helm install --wait` tell that it serves
nothing yet. Standby replicas are ready: they serve the moment they lead. Two GET paths
need no web framework: a minimal HTTP/1.1 answer on asyncio streams (the operator's
install has none of the worker's packages).
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse

log = logging.getLogger(__name__)

READINESS_PATH = "/readyz"
ALLOWED_METHODS = ("GET", "HEAD")
"""What the endpoints answer: HEAD as GET without the body (load balancers and uptime
checks probe with it)."""


class Health:
    """Serves `GET <path>` (liveness: 200 while the process runs) and `GET /readyz`
    (readiness: 200 once `serving()` was called, else 503 with the reason) at `endpoint`,
    e.g. http://0.0.0.0:8080/healthz. Raises ValueError for another scheme than http."""

    def __init__(self, endpoint: str) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme != "http":
            raise ValueError(f"the operator's health endpoint must be http://HOST:PORT/PATH, "
                             f"got {endpoint!r}")
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 80
        self.path = parts.path or "/healthz"
        self.waiting_for: str | None = "the operator is starting"
        self._server: asyncio.Server | None = None

    def waiting(self, reason: str) -> None:
        """Not ready, because of `reason` (e.g. the CRD is not established)."""
        self.waiting_for = reason

    def serving(self) -> None:
        """Ready."""
        self.waiting_for = None

    async def start(self) -> None:
        """Listen (on the endpoint's port; 0 picks a free one, see `port` after)."""
        self._server = await asyncio.start_server(self._answer, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.debug("serving health at http://%s:%s%s and %s", self.host, self.port, self.path,
                  READINESS_PATH)

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def answer(self, method: str, path: str) -> tuple[int, dict[str, object]]:
        """The status and JSON body for `method path` (HEAD: GET's, whose body is not sent)."""
        if method not in ALLOWED_METHODS:
            return 405, {"error": f"{method} is not allowed: {', '.join(ALLOWED_METHODS)} are"}
        if path == self.path:
            return 200, {"alive": True}
        if path == READINESS_PATH:
            if self.waiting_for is None:
                return 200, {"ready": True}
            return 503, {"ready": False, "waiting": self.waiting_for}
        return 404, {"error": f"no {path}: {self.path} and {READINESS_PATH} are served"}

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method = ""
        try:
            async with asyncio.timeout(5.0):
                head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            code, body = self.answer(method, urllib.parse.urlsplit(target).path)
        except (TimeoutError, ValueError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            code, body = 400, {"error": "not an HTTP request"}
        payload = json.dumps(body).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  503: "Service Unavailable"}[code]
        allow = f"Allow: {', '.join(ALLOWED_METHODS)}\r\n" if code == 405 else ""
        writer.write(f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n{allow}Connection: close\r\n\r\n"
                     .encode("latin-1") + (b"" if method == "HEAD" else payload))
        try:
            await writer.drain()
        finally:
            writer.close()
