"""The OpenTelemetry variables a pool's workers get (docs/tracing.md, "On Kubernetes").

The operator passes the `OTEL_*` variables of its own environment (the chart's
`tracing.env`) to every pool's workers, so that one setting of the cluster's collector serves
all pools; a variable the pool's `spec.worker.env` sets wins. Where the workers then export
traces and nothing names their service, they are named `jobpool-<pool>`. Pure: the operator
hands in its environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jobpool.core.poolspec import PoolSpec

PREFIX = "OTEL_"
EXPORT_VARIABLES = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
"""Any of these in the workers' environment makes them export traces."""


def service_name(pool: PoolSpec) -> str:
    """The default `OTEL_SERVICE_NAME` of a pool's workers."""
    return f"jobpool-{pool.name}"


def with_tracing_env(pool: PoolSpec, operator_env: Mapping[str, str]) -> PoolSpec:
    """`pool` with the `OTEL_*` variables of `operator_env` (the operator's environment) that
    its `spec.worker.env` does not set, in name order after its own, and `OTEL_SERVICE_NAME`
    (`service_name`) where the result exports traces and names no service. The pool itself
    where nothing is added."""
    own = dict(pool.env)
    added = {name: value for name, value in sorted(operator_env.items())
             if name.startswith(PREFIX) and name not in own}
    merged = {**own, **added}
    if "OTEL_SERVICE_NAME" not in merged and any(merged.get(v) for v in EXPORT_VARIABLES):
        added["OTEL_SERVICE_NAME"] = service_name(pool)
    if not added:
        return pool
    return dataclasses.replace(pool, env=(*pool.env, *added.items()))
