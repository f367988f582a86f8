"""Traces on real PostgreSQL: one trace from the enqueuing span through every attempt."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_spans import memory_exporter

import jobpool
from integration.helpers import job, prepare, run_until_empty
from jobpool.job import Job

Conn = psycopg.AsyncConnection[dict[str, Any]]


@jobpool.kind("test_fails_once", max_attempts=3, backoff_base=1.0, backoff_max=1.0,
              backoff_jitter=0.0)
async def fails_once(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Fail the first attempt, succeed from the second on."""
    await tx.execute("SELECT 1")
    if job.attempts == 1:
        raise RuntimeError("mail server down")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = memory_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()


async def test_one_trace_from_the_enqueuer_through_every_attempt(
    conn: Conn, dsn: str, tenant: uuid.UUID, spans: InMemorySpanExporter
) -> None:
    await prepare(conn)
    with trace.get_tracer("test").start_as_current_span("POST /mails") as request:
        enqueued = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_fails_once")
    await run_until_empty(dsn, "test_fails_once")
    assert (await job(conn, enqueued.id))["status"] == "pending"
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() WHERE id = %s",
                       (enqueued.id,))
    await run_until_empty(dsn, "test_fails_once")
    assert (await job(conn, enqueued.id))["status"] == "done"

    origin = request.get_span_context()
    attempts = sorted((s for s in spans.get_finished_spans()
                       if s.name == "test_fails_once process"),
                      key=lambda s: dict(s.attributes or {})["jobpool.job.attempt"])
    assert len(attempts) == 2
    for span in attempts:
        assert span.context.trace_id == origin.trace_id
        assert span.parent is not None and span.parent.span_id == origin.span_id
        assert [link.context.span_id for link in span.links] == [origin.span_id]
        assert span.kind == trace.SpanKind.CONSUMER
        attributes = dict(span.attributes or {})
        assert attributes["messaging.system"] == "jobpool"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["jobpool.job.id"] == enqueued.id
        assert attributes["jobpool.tenant.id"] == str(tenant)
        assert attributes["jobpool.job.kind"] == "test_fails_once"
    first, second = (dict(span.attributes or {}) for span in attempts)
    assert (first["jobpool.job.attempt"], first["jobpool.outcome"]) == (1, "retry")
    assert (second["jobpool.job.attempt"], second["jobpool.outcome"]) == (2, "done")
    assert attempts[0].status.status_code == trace.StatusCode.ERROR
    [exception] = attempts[0].events
    assert exception.name == "exception"
    assert dict(exception.attributes or {})["exception.message"] == "mail server down"
    assert attempts[1].status.status_code == trace.StatusCode.UNSET
    assert attempts[1].events == ()


async def test_the_job_keeps_the_enqueuers_trace_context(
    conn: Conn, dsn: str, tenant: uuid.UUID, spans: InMemorySpanExporter
) -> None:
    await prepare(conn)
    with trace.get_tracer("test").start_as_current_span("batch") as request:
        batch = await jobpool.enqueue_many(conn, [
            jobpool.NewJob(tenant, "test_record"),
            jobpool.NewJob(tenant, "test_record", idempotency_key="k1")])
        with psycopg.connect(dsn, autocommit=True) as sync:
            synced = jobpool.enqueue_sync(sync, tenant_id=tenant, kind="test_record")
    context = request.get_span_context()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    for enqueued in (*batch, synced):
        stored = (await job(conn, enqueued.id))["trace_context"]
        assert stored == {"traceparent": traceparent}, enqueued


async def test_without_a_current_span_a_job_keeps_no_trace_context(
    conn: Conn, dsn: str, tenant: uuid.UUID, spans: InMemorySpanExporter
) -> None:
    await prepare(conn)
    enqueued = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    assert (await job(conn, enqueued.id))["trace_context"] is None
    await run_until_empty(dsn, "test_record")
    [span] = [s for s in spans.get_finished_spans() if s.name == "test_record process"]
    assert span.parent is None and span.links == ()
    assert dict(span.attributes or {})["jobpool.outcome"] == "done"


async def test_a_hand_written_trace_context_does_not_stop_the_job(
    conn: Conn, dsn: str, tenant: uuid.UUID, spans: InMemorySpanExporter
) -> None:
    await prepare(conn)
    enqueued = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    await conn.execute("UPDATE mdm.aa_job SET trace_context = %s::jsonb WHERE id = %s",
                       (json.dumps({"traceparent": "not a traceparent"}), enqueued.id))
    await run_until_empty(dsn, "test_record")
    assert (await job(conn, enqueued.id))["status"] == "done"
    [span] = [s for s in spans.get_finished_spans() if s.name == "test_record process"]
    assert span.parent is None


async def test_the_docs_example_enqueues_in_the_requests_trace(
    conn: Conn, tenant: uuid.UUID, spans: InMemorySpanExporter
) -> None:
    await prepare(conn)
    page = (Path(__file__).resolve().parents[2] / "docs" / "tracing.md").read_text("utf-8")
    [example] = re.findall(r"^```python\n(.*?)^```$", page, flags=re.S | re.M)
    names: dict[str, Any] = {}
    exec(compile(example, "docs/tracing.md", "exec"), names)
    enqueued = await names["checkout"](conn, tenant)
    [checkout] = spans.get_finished_spans()
    stored = (await job(conn, enqueued.id))["trace_context"]
    assert stored["traceparent"].split("-")[1:3] == [f"{checkout.context.trace_id:032x}",
                                                     f"{checkout.context.span_id:016x}"]
