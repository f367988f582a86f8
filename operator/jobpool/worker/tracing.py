"""A span per attempt of a job, in the trace of the code that enqueued it (docs/tracing.md).

Follows OpenTelemetry's messaging conventions for a consumer's "process" span: named
`<kind> process`, of kind CONSUMER, with `messaging.system` `jobpool` and
`messaging.operation.type` `process`. The span is a child of the enqueuer's context (one job per
span, so the conventions allow the parent; the whole history of a job is then one trace) and
also links to it, as the conventions ask of every process span. Without the `otel` extra
nothing of OpenTelemetry is imported and `traced_attempt` returns the method unchanged.

Configuration is OpenTelemetry's own: where the process has no tracer provider of its own and
`OTEL_TRACES_EXPORTER` or an OTLP endpoint variable asks for export, the first attempt sets up
the SDK's provider (its resource from `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`, its
sampler from `OTEL_TRACES_SAMPLER`), a batch processor (`OTEL_BSP_*`) and the named exporters
(each reads its own `OTEL_EXPORTER_*` variables).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from jobpool.core.retry import error_text, safe_str
from jobpool.job import Job
from jobpool.trace_context import extract_context, opentelemetry_api

log = logging.getLogger(__name__)

TRACER_NAME = "jobpool.worker"
SYSTEM = "jobpool"
OUTCOME = "jobpool.outcome"
"""The attribute that says how the attempt ended (`OUTCOMES`' values)."""

OUTCOMES: Mapping[str, str] = {
    "done": "done", "retry": "retry", "dlq": "dead", "released": "handed back",
    "rate_limited": "rate limited", "lost_claim": "claim lost", "stopped": "stopped",
    "error": "not recorded",
}
"""The worker's outcomes of an attempt (the metric's labels) as the span says them: `dead` for
the DLQ, `handed back` for an attempt not counted (a connection lost, a conflict, the grace
period over), `rate limited` for one put back before it ran, `stopped` for one whose handler a stop
interrupted, `not recorded` where the outcome could not be written."""

FAILED = frozenset({"retry", "dlq"})
"""The outcomes whose span's status is ERROR."""

EXPORT_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
"""Any of these set asks for export (the SDK's own variables; an OTLP endpoint alone means
the `otlp` exporter, OpenTelemetry's default)."""


def exporter_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The trace exporters `environ` asks for: the names of `OTEL_TRACES_EXPORTER` (comma
    separated; `none` for none), `otlp` where only an OTLP endpoint is set, none where
    `OTEL_SDK_DISABLED` is true or no variable asks. Pure: the process's decision for
    `configure_from_environment`."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if named:
        names = tuple(dict.fromkeys(n.strip() for n in named.split(",") if n.strip()))
        return () if "none" in names else names
    return ("otlp",) if any(environ.get(v, "").strip() for v in EXPORT_VARIABLES) else ()


def configure_from_environment(environ: Mapping[str, str] = os.environ) -> bool:
    """Set up the SDK's tracer provider with the exporters `environ` names (see
    `exporter_names`), unless the process set a provider of its own. True when one was set
    up. Raises ValueError where the SDK is missing, or naming an exporter no installed
    package provides (the `opentelemetry_traces_exporter` entry points: `otlp`,
    `otlp_proto_grpc`, `otlp_proto_http` from the exporter the extra installs, `console`
    from the SDK)."""
    names = exporter_names(environ)
    api = opentelemetry_api()
    if not names or api is None:
        return False
    trace, _ = api
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application's own provider
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ValueError("exporting traces needs OpenTelemetry's SDK: "
                         "pip install 'jobpool[otel]'") from None

    provider = TracerProvider()  # resource and sampler from the OTEL_* variables
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)()))
    trace.set_tracer_provider(provider)
    log.info("traces exported by %s", ", ".join(names))
    return True


def _exporter(name: str) -> Callable[[], Any]:
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        known = sorted(e.name for e in entry_points(group="opentelemetry_traces_exporter"))
        raise ValueError(f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package "
                         f"provides (installed: {', '.join(known) or 'none'})")
    exporter: Callable[[], Any] = next(iter(found)).load()
    return exporter


@cache
def _tracer() -> Any:
    """The worker's tracer, the provider set up from the environment on first use. A bad
    exporter name is logged: tracing never stops the jobs."""
    api = opentelemetry_api()
    assert api is not None
    try:
        configure_from_environment()
    except ValueError as exc:
        log.error("traces are not exported: %s", exc)
    return api[0].get_tracer(TRACER_NAME)


def span_attributes(job: Job) -> dict[str, str | int]:
    """The attributes of an attempt's span: the messaging conventions' and jobpool's own."""
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.job_kind,
        "messaging.message.id": str(job.id),
        "jobpool.job.kind": job.job_kind,
        "jobpool.job.id": job.id,
        "jobpool.tenant.id": str(job.tenant_id),
        "jobpool.job.attempt": job.attempts,
        "jobpool.job.max_attempts": job.max_attempts,
    }


NO_SPAN: AbstractContextManager[None] = nullcontext()
"""What `attempt_span` returns where OpenTelemetry is absent: one shared block that does
nothing, so that a job costs the worker no span machinery at all."""


def attempt_span(job: Job, trace_context: Any = None) -> AbstractContextManager[Any]:
    """The current span of one attempt of `job` while the block runs; trace_context: the
    job's stored `trace_context` (a mapping, or None). Yields the span, None where
    OpenTelemetry is absent (`NO_SPAN`). An exception leaving the block is recorded on the
    span."""
    if opentelemetry_api() is None:
        return NO_SPAN
    return _recorded_span(job, trace_context)


@contextmanager
def _recorded_span(job: Job, trace_context: Any) -> Iterator[Any]:
    api = opentelemetry_api()
    assert api is not None
    trace = api[0]
    parent = extract_context(trace_context)
    links = [] if parent is None else [trace.Link(trace.get_current_span(parent)
                                                  .get_span_context())]
    # the SDK's own recording of an exception leaving the block formats it with str(), which
    # a handler's exception may make raise anything: it is recorded here, safely, instead
    with _tracer().start_as_current_span(
            f"{job.job_kind} process", context=parent, kind=trace.SpanKind.CONSUMER,
            attributes=span_attributes(job), links=links, record_exception=False,
            set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            attempt_failed(exc)
            raise


def attempt_outcome(outcome: str) -> None:
    """Note how the current attempt ended (a metric outcome: `OUTCOMES`' keys) on its span."""
    api = opentelemetry_api()
    if api is None:
        return
    trace = api[0]
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute(OUTCOME, OUTCOMES.get(outcome, outcome))
    if outcome in FAILED:
        span.set_status(trace.Status(trace.StatusCode.ERROR))


def attempt_failed(exc: BaseException) -> None:
    """Record the exception that failed the current attempt on its span."""
    api = opentelemetry_api()
    if api is None:
        return
    trace = api[0]
    span = trace.get_current_span()
    if span.is_recording():
        text = error_text(exc)  # str(exc) may raise anything: a handler made it
        span.add_event("exception", {
            "exception.type": type(exc).__qualname__,
            "exception.message": safe_str(exc, what="its message"),
            "exception.stacktrace": "".join(traceback.format_tb(exc.__traceback__)),
        })
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(trace.Status(trace.StatusCode.ERROR, text))
