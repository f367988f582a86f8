"""The enqueuer's trace context, as a job keeps it (docs/tracing.md).

With the `otel` extra installed and a span current where a job is enqueued, the job keeps that
span's W3C Trace Context (`traceparent`, `tracestate`), so that the worker's span of each
attempt joins the enqueuer's trace. OpenTelemetry is imported on the first call, never at
import: without the extra (or without a current span) a job keeps nothing and an enqueue costs
one cached look-up.
"""

from __future__ import annotations

import importlib
import json
from functools import cache
from types import ModuleType
from typing import Any


@cache
def opentelemetry_api() -> tuple[ModuleType, ModuleType] | None:
    """OpenTelemetry's `trace` and `propagate` modules; None where the `otel` extra is not
    installed. Imported once, on first use."""
    try:
        return (importlib.import_module("opentelemetry.trace"),
                importlib.import_module("opentelemetry.propagate"))
    except ImportError:
        return None


def current_trace_context() -> str | None:
    """The current span's trace context as the JSON text of a job's `trace_context` (an object
    of the propagator's fields: `traceparent` and, where set, `tracestate`); None where
    OpenTelemetry is absent or no valid span is current."""
    api = opentelemetry_api()
    if api is None:
        return None
    trace, propagate = api
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier) if carrier else None


def extract_context(stored: Any) -> Any:
    """The OpenTelemetry Context a job's `trace_context` (the decoded jsonb: a mapping of
    strings, or None) carries; None where there is none, where OpenTelemetry is absent, or
    where the stored value is not a mapping of strings (written by hand, say)."""
    api = opentelemetry_api()
    if api is None or not isinstance(stored, dict):
        return None
    carrier = {key: value for key, value in stored.items()
               if isinstance(key, str) and isinstance(value, str)}
    if not carrier:
        return None
    trace, propagate = api
    context = propagate.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context
