"""Prometheus metrics of a worker process.

Counters and histograms are recorded by the worker as attempts finish; the queue gauges
(`mdm_jobs_pending`, `_ready`, `_running`, `_dlq`, `_ready_age_seconds`, per tenant key and
kind) come from one snapshot for the whole pool (`queue_gauge_snapshot`): the first worker to
find it older than `GAUGE_MAX_AGE` seconds recomputes it, every other worker reads it, so the
database counts the queue once per interval whatever the number of workers. Every worker
reports the whole queue, so aggregate the gauges with `max by (tenant, kind)`, never `sum`.
The live-worker gauges (`mdm_workers_live`, `mdm_worker_slots`, `mdm_worker_slots_busy` per
pool and lane, `mdm_jobs_running_without_live_holder`) come from the registry of live workers
(`jobpool.db.live_workers`), read with the snapshot: they too are the whole pool's, as are
the schedules' `mdm_schedule_last_run_timestamp_seconds` and `_next_run_` (per schedule and
kind; aggregate with `max`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from psycopg.rows import dict_row

from jobpool.db.connect import KEEP_WHEN_IDLE, prepare_threshold, with_tcp_liveness
from jobpool.db.live_workers import DEAD_AFTER
from jobpool.db.own_sessions import count_as_own
from jobpool.db.queries import Many, One
from jobpool.db.store import OWN_ISOLATION

GAUGE_TRANSACTION_SETTINGS = One("gauge_transaction_settings")
LIVE_WORKER_GAUGES = One("live_worker_gauges")
LIST_SCHEDULES = Many("list_schedules")
QUEUE_GAUGE_SNAPSHOT = One("queue_gauge_snapshot")

log = logging.getLogger("jobpool.metrics")

JobOutcome = Literal["done", "retry", "dlq", "rate_limited", "lost_claim", "released",
                     "stopped", "error"]

DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
)
"""Seconds, from milliseconds (a quick email) to a day (a backed-off retry, a GIN build)."""

GAUGE_MAX_AGE = 5.0
"""Seconds a queue gauge snapshot is served before one worker of the pool takes a new one."""

QUEUE_GAUGES = (
    ("mdm_jobs_pending", "pending", "Jobs in status pending (runnable now or later)."),
    ("mdm_jobs_ready", "ready", "Pending jobs whose available_at has passed."),
    ("mdm_jobs_running", "running", "Jobs in status running."),
    ("mdm_jobs_dlq", "dlq", "Jobs in the dead-letter queue."),
    ("mdm_jobs_ready_age_seconds", "ready_age",
     "Seconds since the oldest ready job became available (0 when none is ready)."),
    ("mdm_jobs_paused", "paused",
     "Pending jobs of a paused scope (`jobpool pause`): not claimed until resumed."),
)
"""(metric, query column, help) of the per-(tenant, kind) gauges."""

WORKER_GAUGES = (
    ("mdm_workers_live", "workers", "Workers whose heartbeat is recent."),
    ("mdm_worker_slots", "slots", "Slots of the live workers."),
    ("mdm_worker_slots_busy", "busy", "Slots of the live workers running a job."),
)
"""(metric, query column, help) of the per-(pool, lane) gauges of the live workers."""

UNHELD_GAUGE = "mdm_jobs_running_without_live_holder"

SCHEDULE_GAUGES = (
    ("mdm_schedule_last_run_timestamp_seconds", "last_run_at",
     "Unix time of the schedule's latest tick enqueued (absent before its first)."),
    ("mdm_schedule_next_run_timestamp_seconds", "next_run_at",
     "Unix time of the schedule's next tick."),
)
"""(metric, `list_schedules` column, help) of the per-schedule gauges."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsExposition:
    """A registry served on /metrics, with the queue gauges once added."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.gauges: QueueGauges | None = None

    def add_queue_gauges(self, gauges: QueueGauges) -> None:
        """Serve the queue gauges of `gauges` with these metrics."""
        self.registry.register(gauges)
        self.gauges = gauges

    async def exposition(self) -> bytes:
        """The Prometheus text format, with the queue gauges refreshed if stale."""
        if self.gauges is not None:
            await self.gauges.refresh()
        return generate_latest(self.registry)


def multiprocess_metrics(folder: str) -> MetricsExposition:
    """The counters and histograms that the worker processes writing to `folder` recorded
    (prometheus-client's multiprocess mode), summed over the processes."""
    registry = CollectorRegistry()
    collector: Callable[..., Collector] = MultiProcessCollector  # its __init__ has no types
    collector(registry, path=folder)
    return MetricsExposition(registry)


class WorkerMetrics(MetricsExposition):
    """The metrics of one worker, in a registry of their own (several workers per process
    in tests do not mix).

    Under `jobpool run --processes N` (`PROMETHEUS_MULTIPROC_DIR` set) the values go to that
    folder instead, where the parent's `multiprocess_metrics` sums them.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry or CollectorRegistry(auto_describe=True))
        self.attempts = Counter(
            "mdm_jobs_attempts", "Finished attempts (claims) by kind and outcome.",
            ["kind", "outcome"], registry=self.registry)
        self.claim_latency = Histogram(
            "mdm_jobs_claim_latency_seconds", "now() - created_at when a job is claimed to run.",
            ["kind"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.processing = Histogram(
            "mdm_jobs_processing_seconds", "Seconds a claimed job ran, whatever its outcome.",
            ["kind"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.slots = Gauge(
            "mdm_worker_slots_running", "Slots this worker runs with: fewer than configured when "
            "the database's connection limits leave too few connections (docs/operations.md, "
            "Production databases).", registry=self.registry, multiprocess_mode="livesum")
        self.configured_slots = Gauge(
            "mdm_worker_slots_configured", "Slots the worker was configured with.",
            registry=self.registry, multiprocess_mode="livesum")
        self.poll_only = Gauge(
            "mdm_worker_poll_only", "1 when the worker has no LISTEN connection by design "
            "(behind a transaction pooler without JOBPOOL_LISTEN_DSN) and claims every poll "
            "interval instead.", registry=self.registry, multiprocess_mode="livemax")
        self.rate_limit_hits = Counter(
            "mdm_jobs_rate_limit_hits", "Claimed jobs requeued for want of a token; limit is "
            "the empty bucket (tenant or provider).",
            ["tenant", "kind", "limit"], registry=self.registry)
        # labelled children by label values: labels() costs a lookup per job otherwise
        self._attempts: dict[tuple[str, str], Any] = {}
        self._timings: dict[str, tuple[Any, Any]] = {}

    def observe(self, kind: str, outcome: JobOutcome, *, claim_latency: float | None,
                processing: float | None) -> None:
        """Count one finished attempt; record the latency and duration when given (seconds)."""
        attempts = self._attempts.get((kind, outcome))
        if attempts is None:
            attempts = self._attempts[kind, outcome] = self.attempts.labels(kind, outcome)
        attempts.inc()
        timings = self._timings.get(kind)
        if timings is None:
            timings = self._timings[kind] = (self.claim_latency.labels(kind),
                                             self.processing.labels(kind))
        if claim_latency is not None:
            timings[0].observe(max(0.0, claim_latency))
        if processing is not None:
            timings[1].observe(max(0.0, processing))

    def rate_limited(self, tenant: str, kind: str, limit: str) -> None:
        """Count one rate-limit hit (a metric, not an audit row: hits are frequent)."""
        self.rate_limit_hits.labels(tenant, kind, limit).inc()



class QueueGauges(Collector):
    """Queue gauges from the pool's snapshot (`queue_gauge_snapshot`) on a connection of
    their own.

    Kept apart from the worker's pool so that a scrape neither waits for a busy slot nor
    fails after the worker stopped. Between reads the rows are served from memory for up to
    `max_age` seconds; a read finding the snapshot older than that recomputes it, unless
    another process is doing so (then the previous snapshot is served). On a database error
    the last values stay, `mdm_jobs_gauges_age_seconds` shows how old they are and
    `mdm_jobs_gauges_stale` is 1 (`stale()`, which /readyz reports) until a read succeeds.
    `computed` counts the snapshots this process took. Behind a transaction pooler
    (`transaction_pooler`) nothing is prepared on the server.
    """

    def __init__(self, dsn: str, *, max_age: float = GAUGE_MAX_AGE,
                 clock: Callable[[], float] = time.monotonic,
                 transaction_pooler: bool = False) -> None:
        self.dsn = dsn
        self.transaction_pooler = transaction_pooler
        self.failure: str | None = None
        """Why the last read failed (None after one succeeded)."""
        self.max_age = max_age
        self.clock = clock
        self.rows: list[dict[str, Any]] = []
        self.lanes: list[dict[str, Any]] = []
        self.unheld: int | None = None
        self.schedules: list[dict[str, Any]] = []
        self.fetched_at: float | None = None
        self.taken_at: float | None = None
        self.computed = 0
        self.conn: psycopg.AsyncConnection[dict[str, Any]] | None = None
        self.lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Read (or take) the snapshot unless the rows in memory are younger than `max_age`."""
        async with self.lock:
            if self.fetched_at is not None and self.clock() - self.fetched_at < self.max_age:
                return
            try:
                conn = await self._connection()
                async with conn.pipeline():
                    await conn.execute(GAUGE_TRANSACTION_SETTINGS.text)
                    cur = await conn.execute(QUEUE_GAUGE_SNAPSHOT.text,
                                             {"max_age": self.max_age})
                    await conn.commit()
                row = await cur.fetchone()
                workers = await LIVE_WORKER_GAUGES(conn, {"dead_after": DEAD_AFTER})
                schedules = await LIST_SCHEDULES(conn)
                await conn.commit()
            except (psycopg.Error, OSError) as exc:
                log.warning("queue gauges not refreshed (serving the last values): %s", exc)
                self.failure = str(exc) or type(exc).__name__
                await self.close()
                return
            self.failure = None
            if row is None:  # the snapshot row is made by the migrations
                log.warning("queue gauges not refreshed: no snapshot row (run `jobpool migrate`)")
                return
            now = self.clock()
            if workers is not None:
                self.lanes, self.unheld = list(workers["lanes"]), int(workers["unheld"])
            self.rows = list(row["gauges"])
            self.schedules = list(schedules)
            self.fetched_at = now
            self.taken_at = now - float(row["age"])
            self.computed += int(bool(row["computed"]))

    async def _connection(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        if self.conn is None or self.conn.closed:
            conn = count_as_own(await psycopg.AsyncConnection.connect(
                with_tcp_liveness(self.dsn), row_factory=dict_row, connect_timeout=5,
                application_name="jobpool-metrics",
                prepare_threshold=prepare_threshold(transaction_pooler=self.transaction_pooler)))
            try:
                await conn.set_isolation_level(OWN_ISOLATION)
                if not self.transaction_pooler:
                    await KEEP_WHEN_IDLE(conn)  # it idles between scrapes
                    await conn.commit()
            except BaseException:
                await conn.close()
                raise
            self.conn = conn
        return self.conn

    def stale(self) -> str | None:
        """Why the gauges served are stale (their last read failed), or None."""
        if self.failure is None:
            return None
        age = "never read" if self.taken_at is None else (
            f"{max(0.0, self.clock() - self.taken_at):.0f}s old")
        return f"queue gauges stale ({age}): {self.failure}"

    async def close(self) -> None:
        """Close the connection (a later refresh reconnects)."""
        if self.conn is not None:
            conn, self.conn = self.conn, None
            with contextlib.suppress(psycopg.Error):  # already broken
                await conn.close()

    def collect(self) -> Iterable[Metric]:
        """The cached gauges (called by the registry at every scrape)."""
        for name, column, text in QUEUE_GAUGES:
            family = GaugeMetricFamily(name, text, labels=["tenant", "kind"])
            for row in self.rows:
                # a snapshot taken before an upgrade lacks the newer columns
                family.add_metric([str(row["tenant"]), str(row["kind"])],
                                  float(row.get(column, 0)))
            yield family
        for name, column, text in WORKER_GAUGES:
            family = GaugeMetricFamily(name, text, labels=["pool", "lane"])
            for lane in self.lanes:
                family.add_metric([str(lane["pool"]), str(lane["lane"])], float(lane[column]))
            yield family
        unheld = GaugeMetricFamily(UNHELD_GAUGE, "Running jobs whose holder no longer beats "
                                   "(they wait for stale-claim recovery).")
        if self.unheld is not None:
            unheld.add_metric([], float(self.unheld))
        yield unheld
        for name, column, text in SCHEDULE_GAUGES:
            family = GaugeMetricFamily(name, text, labels=["schedule", "kind"])
            for schedule in self.schedules:
                if schedule[column] is not None:
                    family.add_metric([str(schedule["name"]), str(schedule["kind"])],
                                      schedule[column].timestamp())
            yield family
        age = GaugeMetricFamily("mdm_jobs_gauges_age_seconds",
                                "Seconds since the queue gauges were counted in the database.")
        if self.taken_at is not None:
            age.add_metric([], max(0.0, self.clock() - self.taken_at))
        yield age
        stale = GaugeMetricFamily("mdm_jobs_gauges_stale",
                                  "1 while the queue gauges could not be read from the database "
                                  "(the last values are served).")
        stale.add_metric([], float(self.failure is not None))
        yield stale

    def describe(self) -> Iterable[Metric]:
        """No samples: the families are known only at collect time."""
        return []
