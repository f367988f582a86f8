"""`jobpool operator`: run the Kubernetes operator. kopf is imported only when it runs."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


MIN_SCALE_INTERVAL, MAX_SCALE_INTERVAL = 1.0, 3600.0
"""Seconds; each interval runs one counting query per pool, and an hour is no autoscaling."""


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def add_operator_command(subparsers: Any) -> None:
    """Add the `operator` subcommand to the `jobpool` parser's subparsers."""
    from jobpool.cli import EnvDefault, seconds

    p: argparse.ArgumentParser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator for JobWorkerPools",
        description="Reconcile JobWorkerPools into one worker Deployment per lane and scale "
                    "each lane from the jobs it can serve.",
    )
    namespaces = _env("JOBPOOL_OPERATOR_NAMESPACES")
    p.add_argument(
        "--namespace", dest="namespaces", action="append", metavar="NS",
        default=list(_csv(namespaces)) if namespaces else None,
        help="watch only this namespace (repeatable; default: every namespace) "
             "[env JOBPOOL_OPERATOR_NAMESPACES, comma-separated]",
    )
    p.add_argument(
        "--scale-interval", type=seconds(MIN_SCALE_INTERVAL, MAX_SCALE_INTERVAL),
        action=EnvDefault, envvar="JOBPOOL_SCALE_INTERVAL", default=15.0, metavar="SECONDS",
        help="seconds between job counts per pool",
    )
    p.add_argument(
        "--kubeconfig", default=_env("JOBPOOL_KUBECONFIG"), metavar="PATH",
        help="kubeconfig file (default: in-cluster, then KUBECONFIG or ~/.kube/config) "
             "[env JOBPOOL_KUBECONFIG]",
    )
    p.add_argument(
        "--peering", default=_env("JOBPOOL_PEERING"), metavar="NAME",
        help="kopf peering name for several operator replicas (default: standalone) "
             "[env JOBPOOL_PEERING]",
    )
    p.add_argument(
        "--liveness", default=_env("JOBPOOL_OPERATOR_LIVENESS", DEFAULT_LIVENESS), metavar="URL",
        help="where to serve the operator's health check, '' for nowhere "
             "[env JOBPOOL_OPERATOR_LIVENESS]",
    )
    p.add_argument(
        "--log-level", default=_env("JOBPOOL_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"], help="log level [env JOBPOOL_LOG_LEVEL]",
    )
    p.set_defaults(func=cmd_operator, extra="operator")


async def cmd_operator(args: argparse.Namespace, settings: Any = None) -> int:
    """Run the operator until it is stopped (SIGTERM / SIGINT)."""
    import sys

    import kubernetes

    from jobpool.k8s.handlers import OperatorConfig, run_operator

    config = OperatorConfig(
        scale_interval=args.scale_interval,
        namespaces=tuple(args.namespaces or ()),
        kubeconfig=args.kubeconfig or None,
        peering=args.peering or None,
        liveness_endpoint=args.liveness or None,
    )
    try:
        await run_operator(config)
    except kubernetes.config.ConfigException as exc:
        print(f"jobpool operator: error: no Kubernetes credentials: {exc}", file=sys.stderr)
        return 2
    return 0
