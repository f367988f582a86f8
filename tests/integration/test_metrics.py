"""/metrics, /healthz and /readyz of a real worker on a real database."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import jobpool
from jobpool.db.store import register_kinds
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.errors import PermanentError, RetryAfter
from jobpool.job import Job
from jobpool.metrics import DURATION_BUCKETS, QueueGauges, WorkerMetrics
from jobpool.registry import REGISTRY
from jobpool.worker.config import WorkerConfig
from jobpool.worker.health import HealthServer, HealthServerError
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]
OK, FAIL, FLAKY = "test_metrics_ok", "test_metrics_fail", "test_metrics_flaky"
KINDS = (OK, FAIL, FLAKY)


@jobpool.kind(OK)
async def ok(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    await asyncio.sleep(0.005)


@jobpool.kind(FAIL)
async def fail(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    raise PermanentError("broken on purpose")


@jobpool.kind(FLAKY, max_attempts=5)
async def flaky(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    if job.attempts == 1:
        raise RetryAfter(0, "first attempt fails")


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for got, v in samples[name] if got == labels]
    assert len(found) == 1, f"{name}{labels}: {samples[name]}"
    return found[0]


async def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, \
            session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.text()


async def tenant_with(conn: Conn, key: str, metadata: dict[str, Any]) -> uuid.UUID:
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES (%s, %s::jsonb) "
                             "RETURNING id", (key, json.dumps(metadata)))
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


async def db_counts(conn: Conn) -> dict[tuple[str, str, str], int]:
    cur = await conn.execute(
        "SELECT t.key, j.job_kind, j.status::text AS status, count(*)::int AS n "
        "FROM mdm.aa_job j JOIN mdm.aa_tenant t ON t.id = j.tenant_id "
        "GROUP BY 1, 2, 3")
    return {(r["key"], r["job_kind"], r["status"]): r["n"] for r in await cur.fetchall()}


async def test_metrics_after_a_run_match_the_database(dsn: str, conn: Conn, tenant: uuid.UUID
                                                      ) -> None:
    limited = await tenant_with(conn, "limited", {"rate_limit": {OK: {"rps": 0.5, "burst": 1}}})
    await register_kinds(conn, [REGISTRY.get(k) for k in KINDS])
    await enqueue_many(conn, [
        *(NewJob(tenant, OK) for _ in range(6)), *(NewJob(tenant, FAIL) for _ in range(2)),
        *(NewJob(tenant, FLAKY) for _ in range(3)), *(NewJob(limited, OK) for _ in range(3)),
    ])
    # another worker took the bucket's token just now: the first limited job this worker
    # claims finds its lease's token not due, and goes back to pending, counted as a hit
    await conn.execute(
        "INSERT INTO mdm.aa_rate_bucket (key, rps, burst, tokens, taken, updated_at) "
        "VALUES (%s, 0.5, 1, 0, 1, clock_timestamp())", (f"tenant/{limited}/{OK}",))
    worker = Worker(dsn, REGISTRY, WorkerConfig(kinds=KINDS, slots=4, poll_interval=0.5),
                    actor="test")
    worker.metrics.add_queue_gauges(QueueGauges(dsn, max_age=0))
    server = HealthServer(worker, worker.metrics)
    port = await server.start(port=0, host="127.0.0.1")
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(3.0)
        assert await scrape(port, "/healthz") == (200, '{"status": "ok"}')
        assert (await scrape(port, "/readyz"))[0] == 200
        worker.stop()
        await asyncio.wait_for(task, 30)
        status, text = await scrape(port)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await server.stop()
    assert status == 200
    samples = parse(text)
    db = await db_counts(conn)

    # counters: one per finished attempt, by outcome
    assert value(samples, "mdm_jobs_attempts_total", kind=OK, outcome="done") == (
        db[("acme", OK, "done")] + db.get(("limited", OK, "done"), 0))
    assert value(samples, "mdm_jobs_attempts_total", kind=FAIL, outcome="dlq") == 2 == (
        db[("acme", FAIL, "dlq")])
    assert value(samples, "mdm_jobs_attempts_total", kind=FLAKY, outcome="retry") == 3
    assert value(samples, "mdm_jobs_attempts_total", kind=FLAKY, outcome="done") == 3 == (
        db[("acme", FLAKY, "done")])
    hits = value(samples, "mdm_jobs_rate_limit_hits_total",
                 tenant="limited", kind=OK, limit="tenant")
    assert hits >= 1
    assert value(samples, "mdm_jobs_attempts_total", kind=OK, outcome="rate_limited") == hits
    assert db[("limited", OK, "pending")] >= 1

    # histograms: one observation per attempt that ran, buckets from 5 ms to a day
    ran = {OK: db[("acme", OK, "done")] + db.get(("limited", OK, "done"), 0), FAIL: 2, FLAKY: 6}
    for kind, count in ran.items():
        for name in ("mdm_jobs_claim_latency_seconds", "mdm_jobs_processing_seconds"):
            assert value(samples, f"{name}_count", kind=kind) == count
            bounds = {labels["le"] for labels, _ in samples[f"{name}_bucket"]
                      if labels["kind"] == kind}
            assert {"0.005", "86400.0", "+Inf"} <= bounds
            assert len(bounds) == len(DURATION_BUCKETS) + 1

    # gauges: from the database, per tenant key and kind
    for (key, kind, state), count in db.items():
        if state in ("pending", "running", "dlq"):
            assert value(samples, f"mdm_jobs_{state}", tenant=key, kind=kind) == count
    assert value(samples, "mdm_jobs_dlq", tenant="acme", kind=FAIL) == 2
    assert value(samples, "mdm_jobs_running", tenant="limited", kind=OK) == 0
    assert value(samples, "mdm_jobs_pending", tenant="limited", kind=OK) == (
        db[("limited", OK, "pending")])
    assert {tuple(sorted(labels)) for labels, _ in samples["mdm_jobs_pending"]} == {
        ("kind", "tenant")}


async def test_queue_gauges_are_cached_between_scrapes(dsn: str, conn: Conn,
                                                       tenant: uuid.UUID) -> None:
    await register_kinds(conn, [REGISTRY.get(OK)])
    await enqueue_many(conn, [NewJob(tenant, OK)])
    metrics = WorkerMetrics()
    gauges = QueueGauges(dsn, max_age=60)
    metrics.add_queue_gauges(gauges)
    try:
        first = parse((await metrics.exposition()).decode())
        await enqueue_many(conn, [NewJob(tenant, OK), NewJob(tenant, OK)])
        cached = parse((await metrics.exposition()).decode())
        gauges.max_age = 0
        fresh = parse((await metrics.exposition()).decode())
    finally:
        await gauges.close()
    assert value(first, "mdm_jobs_pending", tenant="acme", kind=OK) == 1
    assert value(cached, "mdm_jobs_pending", tenant="acme", kind=OK) == 1
    assert value(fresh, "mdm_jobs_pending", tenant="acme", kind=OK) == 3


async def test_gauges_survive_an_unreachable_database() -> None:
    metrics = WorkerMetrics()
    gauges = QueueGauges("postgresql://nobody@127.0.0.1:1/none", max_age=0)
    metrics.add_queue_gauges(gauges)
    samples = parse((await metrics.exposition()).decode())
    assert samples["mdm_jobs_pending"] == []
    assert samples["mdm_jobs_gauges_age_seconds"] == []


async def test_stale_gauges_show_on_readyz_and_as_a_metric() -> None:
    """Gauges that cannot be read make the worker not ready, with the reason, and
    `mdm_jobs_gauges_stale` 1; a ready worker's notes come with its answer."""
    metrics = WorkerMetrics()
    metrics.add_queue_gauges(QueueGauges("postgresql://nobody@127.0.0.1:1/none", max_age=0))
    source = NotedSource([], loop_beat=10**9, notes=["poll-only: no LISTEN connection"])
    server = HealthServer(source, metrics)
    port = await server.start(port=0, host="127.0.0.1")
    try:
        assert (await scrape(port, "/readyz"))[0] == 200  # not read yet: nothing stale
        _, text = await scrape(port)
        assert parse(text)["mdm_jobs_gauges_stale"][0][1] == 1.0
        status, body = await scrape(port, "/readyz")
    finally:
        await server.stop()
    answer = json.loads(body)
    assert status == 503
    assert answer["problems"][0].startswith("queue gauges stale (never read): ")
    assert answer["notes"] == ["poll-only: no LISTEN connection"]


class FakeSource:
    """A worker as the probes see it: its problems and its fetch loop's last beat."""

    def __init__(self, problems: list[str], loop_beat: float) -> None:
        self.problems = problems
        self.loop_beat = loop_beat

    def not_ready(self) -> list[str]:
        return self.problems


class NotedSource(FakeSource):
    """A ready worker with notes (fewer slots, poll-only)."""

    def __init__(self, problems: list[str], loop_beat: float, notes: list[str]) -> None:
        super().__init__(problems, loop_beat)
        self.notes = notes

    def readiness_notes(self) -> list[str]:
        return self.notes


async def test_readyz_names_what_is_down_and_healthz_a_stuck_loop() -> None:
    source = FakeSource(["LISTEN connection down"], loop_beat=-1000.0)
    server = HealthServer(source, WorkerMetrics())
    port = await server.start(port=0, host="127.0.0.1")
    try:
        status, body = await scrape(port, "/readyz")
        assert (status, json.loads(body)["problems"]) == (503, ["LISTEN connection down"])
        status, body = await scrape(port, "/healthz")
        assert status == 503 and "fetch loop silent" in body
        source.problems = []
        assert (await scrape(port, "/readyz"))[0] == 200
    finally:
        await server.stop()


async def test_a_taken_port_is_a_clear_error() -> None:
    source = FakeSource([], loop_beat=0.0)
    first = HealthServer(source, WorkerMetrics())
    port = await first.start(port=0, host="127.0.0.1")
    try:
        with pytest.raises(HealthServerError, match=f"127.0.0.1:{port}.*JOBPOOL_METRICS_PORT"):
            await HealthServer(source, WorkerMetrics()).start(port=port, host="127.0.0.1")
    finally:
        await first.stop()


# -- the dashboard and the alert rules use what the worker exports ---------------------------

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def exported_names() -> set[str]:
    metrics = WorkerMetrics()
    metrics.observe("k", "done", claim_latency=1.0, processing=1.0)
    metrics.rate_limited("t", "k", "tenant")
    names = {name for name in parse(generate_latest(metrics.registry).decode())}
    return names | exported_families()


def exported_families() -> set[str]:
    """The name of every metric family a worker serves: its own and the queue gauges'."""
    return ({family.name for family in WorkerMetrics().registry.collect()}
            | {family.name for family in QueueGauges("").collect()})


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "jobpool-dashboard.json").read_text())
    return [target["expr"] for panel in dashboard["panels"]
            for target in panel.get("targets", [])]


def alert_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "jobpool-alerts.yaml").read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def test_dashboard_and_alerts_only_use_exported_metrics() -> None:
    exported = exported_names()
    used = {name for expr in dashboard_exprs() + alert_exprs()
            for name in re.findall(r"\bmdm_[a-z_]+", expr)}
    assert used, "no metric found in the dashboard or the alerts"
    assert used <= exported, used - exported
    assert {"mdm_jobs_pending", "mdm_jobs_dlq", "mdm_jobs_claim_latency_seconds_bucket",
            "mdm_jobs_attempts_total", "mdm_jobs_rate_limit_hits_total"} <= used
    alerts = {rule["alert"] for group in yaml.safe_load(
        (DEPLOY / "prometheus" / "jobpool-alerts.yaml").read_text())["groups"]
        for rule in group["rules"]}
    assert {"JobpoolDLQGrowing", "JobpoolClaimLatencyHigh", "JobpoolNoWorkerClaiming"} <= alerts


def test_the_dashboard_shows_every_metric_the_worker_serves() -> None:
    """A metric added without a panel is one nobody watches."""
    used = {name for expr in dashboard_exprs() for name in re.findall(r"\bmdm_[a-z_]+", expr)}
    suffixes = ("", "_total", "_bucket", "_count", "_sum")
    unshown = {family for family in exported_families()
               if not any(family + suffix in used for suffix in suffixes)}
    assert unshown == set()


def test_the_chart_ships_the_dashboard_and_the_alerts_of_deploy() -> None:
    chart = DEPLOY.parent / "charts" / "jobpool" / "files"
    for path in ("grafana/jobpool-dashboard.json", "prometheus/jobpool-alerts.yaml"):
        assert (chart / path).read_text() == (DEPLOY / path).read_text(), path


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    folder = DEPLOY / "prometheus"
    for args in (["check", "rules", "jobpool-alerts.yaml"],
                 ["test", "rules", "jobpool-alerts.test.yaml"]):
        run = subprocess.run([str(PROMTOOL), *args], cwd=folder, capture_output=True, text=True,
                             check=False)
        assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    exprs = [expr.replace("$__rate_interval", "5m").replace("$tenant", ".*")
             .replace("$kind", ".*") for expr in dashboard_exprs()]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(rules))
    run = subprocess.run([str(PROMTOOL), "check", "rules", "queries.yaml"], cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in run.stdout


async def test_one_worker_counts_the_queue_per_interval_for_the_whole_pool(
        dsn: str, conn: Conn, tenant: uuid.UUID) -> None:
    await register_kinds(conn, [REGISTRY.get(OK)])
    await enqueue_many(conn, [NewJob(tenant, OK), NewJob(tenant, OK)])
    pool = [QueueGauges(dsn, max_age=60) for _ in range(6)]

    async def scrape_all() -> int:
        """Every worker reads the database once; the snapshots taken in that round."""
        before = sum(gauges.computed for gauges in pool)
        for gauges in pool:
            gauges.fetched_at = None
        await asyncio.gather(*(gauges.refresh() for gauges in pool))
        return sum(gauges.computed for gauges in pool) - before

    try:
        taken = [await scrape_all(), await scrape_all()]
        served = [gauges.rows for gauges in pool]
        await enqueue_many(conn, [NewJob(tenant, OK)])
        await conn.execute("UPDATE mdm.aa_queue_gauges SET taken_at = now() - interval '1 hour'")
        taken.append(await scrape_all())
        await scrape_all()
        latest = {row["pending"] for gauges in pool for row in gauges.rows}
    finally:
        for gauges in pool:
            await gauges.close()
    assert taken == [1, 0, 1]  # once per interval for the six, not once per worker
    assert all(rows == served[0] for rows in served) and served[0][0]["pending"] == 2
    assert latest == {3}
