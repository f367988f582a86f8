"""The spans of this test process, kept in memory by OpenTelemetry's SDK."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """An exporter that keeps every finished span of the process, on the process's tracer
    provider, set up once (OpenTelemetry takes a global provider once)."""
    global _EXPORTER
    if _EXPORTER is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _EXPORTER = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER
