"""The worker's HTTP side: `/metrics` (Prometheus), `/healthz` and `/readyz` (Kubernetes probes).

/healthz: the fetch loop has beaten within `LIVENESS_TIMEOUT` seconds (else 503: restart me).
It beats also while waiting for the database: a restart would not bring the database back.
Served from a thread of its own, so it answers while a handler blocks the worker's loop,
and then says what blocks it and for how long (`blocked`: still 200 while the fetch loop's
silence is below the timeout; the worker's leases and heartbeat are renewed meanwhile).
/readyz: the worker reports no problem (else 503 with the list): the database answers, the
LISTEN connection is up (unless poll-only by design), no background task is failing, the
queue gauges are not stale. Its `notes` say what a ready worker runs with short of its
configuration (fewer slots for the connection budget, poll-only wake-ups).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from aiohttp import web

from jobpool.errors import JobpoolError
from jobpool.metrics import CONTENT_TYPE, MetricsExposition, QueueGauges

log = logging.getLogger("jobpool.worker")

T = TypeVar("T")

LIVENESS_TIMEOUT = 60.0
"""Seconds without a fetch-loop beat after which /healthz fails (a claim waits at most 30 s)."""


class HealthSource(Protocol):
    """What the probes read from a worker (`jobpool.worker.runtime.Worker` has these, and
    `loop_blocked()` and `readiness_notes()`, which /healthz and /readyz read when present)."""

    @property
    def loop_beat(self) -> float:
        """`time.monotonic()` of the fetch loop's last beat."""
        ...

    def not_ready(self) -> list[str]:
        """What keeps the worker from being ready, one sentence each; [] when ready."""
        ...


class ObservedWorker(HealthSource, Protocol):
    """A worker with its metrics (`Worker.metrics`, or a process group's summed ones)."""

    @property
    def metrics(self) -> MetricsExposition:
        """What /metrics serves."""
        ...


class HealthServerError(JobpoolError):
    """The health/metrics server cannot listen (e.g. the port is taken)."""


def build_app(source: HealthSource, metrics: MetricsExposition, *,
              clock: Callable[[], float] = time.monotonic) -> web.Application:
    """The aiohttp application serving /metrics, /healthz and /readyz."""

    async def metrics_view(_: web.Request) -> web.Response:
        body = await metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_: web.Request) -> web.Response:
        silent = clock() - source.loop_beat
        blocked_of = getattr(source, "loop_blocked", None)
        blocked: tuple[float, str] | None = blocked_of() if blocked_of is not None else None
        extra = {"blocked": f"event loop blocked for {blocked[0]:.0f}s by {blocked[1]}"
                 } if blocked is not None else {}
        if silent > LIVENESS_TIMEOUT:
            return web.json_response(
                {"status": "stuck", "detail": f"fetch loop silent for {silent:.0f}s", **extra},
                status=503)
        return web.json_response({"status": "ok", **extra})

    async def readyz(_: web.Request) -> web.Response:
        problems = source.not_ready()
        stale = metrics.gauges.stale() if metrics.gauges is not None else None
        if stale:
            problems = [*problems, stale]
        notes_of = getattr(source, "readiness_notes", None)
        notes: list[str] = notes_of() if notes_of is not None else []
        extra = {"notes": notes} if notes else {}
        if problems:
            return web.json_response({"status": "not ready", "problems": problems, **extra},
                                     status=503)
        return web.json_response({"status": "ready", **extra})

    app = web.Application()
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


class HealthServer:
    """Runs `build_app` on a TCP port alongside the worker, in a thread with an event loop of
    its own: the probes and /metrics answer also while a handler blocks the worker's loop
    (/healthz then tells how long the fetch loop has been silent)."""

    def __init__(self, source: HealthSource, metrics: MetricsExposition) -> None:
        self.app = build_app(source, metrics)
        self.metrics = metrics
        self.runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self, *, port: int, host: str = "0.0.0.0") -> int:
        """Listen on `host:port` (0: any free port); return the port. Raises HealthServerError."""
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="jobpool-health",
                                        daemon=True)
        self._thread.start()
        try:
            return await self._in_thread(self._listen(host, port))
        except BaseException:
            await asyncio.to_thread(self._end_thread)
            raise

    async def stop(self) -> None:
        """Stop listening, close the gauges' database connection, end the thread."""
        if self._loop is None:
            return
        try:
            await self._in_thread(self._shut_down())
        finally:
            await asyncio.to_thread(self._end_thread)

    async def _in_thread(self, work: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _listen(self, host: str, port: int) -> int:
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            self.runner = None
            raise HealthServerError(
                f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc}; set "
                "--metrics-port / JOBPOOL_METRICS_PORT to a free port, or 0 to disable") from None
        addresses = self.runner.addresses
        return int(addresses[0][1]) if addresses else port

    async def _shut_down(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self.metrics.gauges is not None:
            await self.metrics.gauges.close()

    def _end_thread(self) -> None:
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def start_worker_health(worker: ObservedWorker, dsn: str, port: int, *,
                              transaction_pooler: bool) -> HealthServer | None:
    """Serve `worker`'s /metrics (with queue gauges from `dsn`) and probes on `port`.

    `transaction_pooler`: `dsn` leads to a pooler in transaction mode (the worker's own
    `pooler` setting): the gauges' connection prepares nothing on the server. port 0: no
    server (None). Raises HealthServerError naming the port and its setting when
    the port is taken: a worker without its probes and metrics would run unseen (and on
    Kubernetes be restarted by its failing probes), so it stops at its start instead.
    """
    if not port:
        return None
    worker.metrics.add_queue_gauges(QueueGauges(dsn, transaction_pooler=transaction_pooler))
    server = HealthServer(worker, worker.metrics)
    try:
        bound = await server.start(port=port)
    except HealthServerError:
        await server.stop()
        raise
    log.info("metrics and probes on :%d (/metrics, /healthz, /readyz)", bound)
    return server
