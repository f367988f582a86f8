"""`jobpool run` exports its attempts' spans as the OTEL_* variables say, in the enqueuer's
trace."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from integration.helpers import job, prepare
from opentelemetry import trace
from otel_spans import memory_exporter

import jobpool
from acceptance.cli import jobpool as run_jobpool
from acceptance.cli import worker_args


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one after another (the console exporter's output)."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        found, at = decoder.raw_decode(text, at)
        objects.append(found)
    return objects


async def test_a_worker_exports_its_spans_to_the_exporter_the_variables_name(
    conn: psycopg.AsyncConnection[dict[str, Any]], dsn: str, tenant: uuid.UUID
) -> None:
    memory_exporter()  # a tracer provider that makes real spans in this process
    await prepare(conn)
    with trace.get_tracer("test").start_as_current_span("POST /records") as request:
        enqueued = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    done = run_jobpool(dsn, *worker_args("test_record", until_empty=True),
                       OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="records-worker")
    assert (await job(conn, enqueued.id))["status"] == "done"
    [span] = [s for s in _json_objects(done.stdout) if s.get("name") == "test_record process"]
    origin = request.get_span_context()
    assert span["context"]["trace_id"] == f"0x{origin.trace_id:032x}"
    assert span["parent_id"] == f"0x{origin.span_id:016x}"
    assert span["kind"] == "SpanKind.CONSUMER"
    assert span["attributes"]["jobpool.outcome"] == "done"
    assert span["attributes"]["jobpool.job.id"] == enqueued.id
    assert span["resource"]["attributes"]["service.name"] == "records-worker"
