-- The trace context of the code that enqueued a job (W3C Trace Context: an object with
-- "traceparent" and, where there is one, "tracestate"), so that the worker's span of each
-- attempt joins the enqueuer's trace (docs/tracing.md). NULL when the enqueuer had no current
-- span or no OpenTelemetry. A nullable column without a default: adding it rewrites nothing.
ALTER TABLE mdm.aa_job ADD COLUMN IF NOT EXISTS trace_context jsonb;
