"""Traces without a database: the `otel` extra is optional, the OTEL_* variables choose the
export, the operator passes them on to the workers, an attempt's span follows the messaging
conventions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

import jsonschema
import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_spans import memory_exporter

from jobpool.core.poolspec import PoolSpec, load_pool
from jobpool.job import Job
from jobpool.k8s import manifests
from jobpool.k8s.tracing_env import with_tracing_env
from jobpool.metrics import JobOutcome
from jobpool.trace_context import current_trace_context, extract_context
from jobpool.worker import tracing

ROOT = Path(__file__).resolve().parents[2]

_BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class NoOpenTelemetry(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, NoOpenTelemetry())
""")


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_jobpool_imports_no_opentelemetry() -> None:
    out = _python("import sys, jobpool, jobpool.enqueue, jobpool.trace_context\n"
                  "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    assert out == "[]"


def test_without_the_extra_enqueue_and_the_worker_run_untraced() -> None:
    out = _python(_BLOCKED + textwrap.dedent("""
        import jobpool
        from jobpool.trace_context import current_trace_context, extract_context
        from jobpool.worker import runtime, tracing

        with tracing.attempt_span(None) as span:
            assert span is None
        tracing.attempt_outcome("done")
        tracing.attempt_failed(RuntimeError("x"))
        print(current_trace_context(), extract_context({"traceparent": "x"}),
              tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "console"}),
              any(m.startswith("opentelemetry") for m in sys.modules))
    """))
    assert out == "None None False False"


# -- the process's spans (a provider of the test's own, its spans kept in memory) ---------


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = memory_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()


def _job(attempts: int = 1) -> Job:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return Job(id=42, tenant_id=uuid.UUID(int=7), job_kind="email_send", payload={},
               status="running", priority=100, available_at=now, created_at=now,
               claimed_by="w", claimed_at=now, attempts=attempts, max_attempts=3,
               last_error=None, idempotency_key=None)


def test_no_current_span_keeps_no_context(spans: InMemorySpanExporter) -> None:
    assert current_trace_context() is None


def test_the_current_span_is_kept_as_w3c_trace_context(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("test").start_as_current_span("request") as span:
        kept = current_trace_context()
    assert kept is not None
    carrier = json.loads(kept)
    c = span.get_span_context()
    assert carrier["traceparent"] == f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


@pytest.mark.parametrize("stored", [None, [], {}, {"traceparent": 5}, {"traceparent": "junk"}])
def test_a_stored_context_that_carries_no_span_is_no_parent(stored: object) -> None:
    assert extract_context(stored) is None


def test_an_attempt_span_follows_the_messaging_conventions(
    spans: InMemorySpanExporter,
) -> None:
    with trace.get_tracer("test").start_as_current_span("request") as request:
        stored = json.loads(current_trace_context() or "{}")
    with tracing.attempt_span(_job(attempts=2), stored):
        tracing.attempt_failed(RuntimeError("smtp down"))
        tracing.attempt_outcome("retry")
    [span] = [s for s in spans.get_finished_spans() if s.name != "request"]
    assert span.name == "email_send process"
    assert span.kind == trace.SpanKind.CONSUMER
    enqueued = request.get_span_context()
    assert span.parent is not None and span.parent.span_id == enqueued.span_id
    assert span.context.trace_id == enqueued.trace_id
    assert [link.context.span_id for link in span.links] == [enqueued.span_id]
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "jobpool"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "email_send"
    assert attributes["jobpool.job.attempt"] == 2
    assert attributes["jobpool.job.id"] == 42
    assert attributes["jobpool.tenant.id"] == str(uuid.UUID(int=7))
    assert attributes["jobpool.outcome"] == "retry"
    assert attributes["error.type"] == "RuntimeError"
    assert span.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise SystemExit(4)


def test_an_exception_that_cannot_be_printed_is_recorded_without_raising(
    spans: InMemorySpanExporter,
) -> None:
    # a handler's exception: formatting it must fail nothing, least of all the worker
    with pytest.raises(_Unprintable), tracing.attempt_span(_job(attempts=1)):
        tracing.attempt_failed(_Unprintable())
        raise _Unprintable()
    [span] = spans.get_finished_spans()
    assert [event.name for event in span.events] == ["exception", "exception"]
    event = dict(span.events[0].attributes or {})
    assert event["exception.type"] == "_Unprintable"
    assert "could not be built" in str(event["exception.message"])
    assert span.status.status_code == trace.StatusCode.ERROR


def test_an_attempt_without_a_stored_context_starts_its_own_trace(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.attempt_span(_job(), None):
        tracing.attempt_outcome("dlq")
    [span] = spans.get_finished_spans()
    assert span.parent is None and span.links == ()
    assert dict(span.attributes or {})["jobpool.outcome"] == "dead"


# -- the OTEL_* variables ------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "names"), [
    ({}, ()),
    ({"OTEL_SERVICE_NAME": "mail"}, ()),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ("otlp",)),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp",)),
    ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ("console", "otlp")),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, ()),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, ()),
])
def test_the_variables_choose_the_exporters(environ: dict[str, str],
                                            names: tuple[str, ...]) -> None:
    assert tracing.exporter_names(environ) == names


def test_an_unknown_exporter_is_named() -> None:
    out = _python(textwrap.dedent("""
        from jobpool.worker import tracing
        try:
            tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "zipkn"})
        except ValueError as exc:
            print(exc)
    """))
    assert out.startswith("OTEL_TRACES_EXPORTER names 'zipkn', which no installed package "
                          "provides (installed: ")
    assert "otlp" in out and "console" in out


def test_with_the_api_alone_export_is_refused_by_name_and_attempts_still_run() -> None:
    blocked = _BLOCKED.replace('name == "opentelemetry" or name.startswith("opentelemetry.")',
                               'name.startswith("opentelemetry.sdk")')
    out = _python(blocked + textwrap.dedent("""
        import logging, os, uuid
        from datetime import UTC, datetime
        from jobpool.job import Job
        from jobpool.worker import tracing
        try:
            tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "console"})
        except ValueError as exc:
            print(exc)
        logging.basicConfig(level=logging.ERROR, format="%(message)s")
        os.environ["OTEL_TRACES_EXPORTER"] = "console"
        now = datetime.now(UTC)
        job = Job(1, uuid.uuid4(), "k", {}, "running", 100, now, now, "w", now, 1, 1, None, None)
        with tracing.attempt_span(job) as span:
            print(span.is_recording())
    """))
    assert out == ("exporting traces needs OpenTelemetry's SDK: pip install 'jobpool[otel]'\n"
                   "False")


def test_the_sdk_is_set_up_from_the_variables_where_the_process_has_no_provider() -> None:
    out = _python(textwrap.dedent("""
        from opentelemetry import trace
        from jobpool.worker import tracing
        environ = {"OTEL_TRACES_EXPORTER": "console"}
        first = tracing.configure_from_environment(environ)
        provider = trace.get_tracer_provider()
        print(first, type(provider).__name__, tracing.configure_from_environment(environ))
    """))
    assert out == "True TracerProvider False"


# -- the workers' environment on Kubernetes ------------------------------------------------


def _pool(env: list[dict[str, str]] | None = None) -> PoolSpec:
    worker: dict[str, object] = {} if env is None else {"env": env}
    return load_pool({"apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
                      "metadata": {"name": "mail", "namespace": "mdm"},
                      "spec": {"image": "jobpool:1", "worker": worker,
                               "database": {"secretName": "db", "key": "dsn"},
                               "lanes": [{"name": "default", "kinds": ["email_send"]}]}})


def _worker_env(pool: PoolSpec) -> dict[str, str]:
    lane = pool.lanes[0]
    return {item["name"]: item.get("value") for item in manifests.build_worker_env(pool, lane)}


def test_the_operators_otel_variables_reach_every_workers_pod() -> None:
    operator_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "HOME": "/x"}
    env = _worker_env(with_tracing_env(_pool(), operator_env))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"
    assert env["OTEL_SERVICE_NAME"] == "jobpool-mail"
    assert "HOME" not in env


def test_a_pools_own_otel_variables_win() -> None:
    pool = _pool([{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://own:4317"},
                  {"name": "OTEL_SERVICE_NAME", "value": "mailer"}])
    env = _worker_env(with_tracing_env(pool, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}))
    assert (env["OTEL_EXPORTER_OTLP_ENDPOINT"], env["OTEL_SERVICE_NAME"]) == (
        "http://own:4317", "mailer")


def test_without_otel_variables_the_pool_is_unchanged() -> None:
    pool = _pool()
    assert with_tracing_env(pool, {"HOME": "/x"}) is pool
    named = with_tracing_env(pool, {"OTEL_SERVICE_NAME": "mail"})
    assert dict(named.env) == {"OTEL_SERVICE_NAME": "mail"}  # passed on, nothing exported


# -- docs/tracing.md -------------------------------------------------------------------------


def _first_column(table_header: str) -> list[str]:
    """The backquoted first cells of the table that starts with `table_header`."""
    text = (ROOT / "docs" / "tracing.md").read_text()
    lines = text[text.index(table_header):].splitlines()[2:]
    cells = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells.append(line.split("|")[1].strip().strip("`"))
    return cells


def test_the_docs_list_every_attribute_of_an_attempts_span() -> None:
    assert _first_column("| attribute | value |") == [*tracing.span_attributes(_job()),
                                                       tracing.OUTCOME]


def test_the_docs_list_every_outcome() -> None:
    assert _first_column("| `jobpool.outcome` | the attempt |") == list(tracing.OUTCOMES.values())


def test_every_outcome_of_an_attempt_has_its_span_name() -> None:
    """The metric's outcomes and the span's are one list: a new outcome gets its name (and so
    its row in docs/tracing.md) instead of reaching the span as its bare label."""
    assert sorted(tracing.OUTCOMES) == sorted(get_args(JobOutcome))


def test_the_docs_yaml_examples_are_a_valid_value_and_a_valid_pool() -> None:
    page = (ROOT / "docs" / "tracing.md").read_text("utf-8")
    values, pool_spec = (yaml.safe_load(block) for block in
                         re.findall(r"^```yaml\n(.*?)^```$", page, flags=re.S | re.M))
    schema = json.loads((ROOT / "charts" / "jobpool" / "values.schema.json").read_text())
    jsonschema.validate(values, schema)
    operator_env = values["tracing"]["env"]
    pool = _pool(pool_spec["spec"]["worker"]["env"])
    env = _worker_env(with_tracing_env(pool, operator_env))
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == operator_env["OTEL_EXPORTER_OTLP_ENDPOINT"]
