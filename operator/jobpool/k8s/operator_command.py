"""`jobpool operator`: run the Kubernetes operator. kopf is imported only when it runs."""

from __future__ import annotations

import argparse
from typing import Any

from jobpool.cli_arguments import add_setting, add_settings
from jobpool.settings import Settings, parser_of


class _Namespaces(argparse.Action):
    """--namespace NS[,NS], repeatable: the flags given replace the setting's namespaces."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest)
        before = () if given is self.default else given
        setattr(namespace, self.dest, (*before, *parser_of("operator_namespaces")(values)))


def add_operator_command(subparsers: Any, settings: Settings) -> None:
    """Add the `operator` subcommand to the `jobpool` parser's subparsers; its flags default
    to `settings`."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator for JobWorkerPools",
        description="Reconcile JobWorkerPools into one worker Deployment per lane and scale "
                    "each lane from the jobs it can serve.",
    )
    add_settings(p, settings, "operator",
                 operator_namespaces={"action": _Namespaces, "metavar": "NS"},
                 scale_interval={"metavar": "SECONDS"}, kubeconfig={"metavar": "PATH"},
                 lease_namespace={"metavar": "NS"}, operator_liveness={"metavar": "URL"})
    add_setting(p, settings, "log_level", metavar="{debug,info,warning,error}")
    p.set_defaults(func=cmd_operator, extra="operator")


async def cmd_operator(args: argparse.Namespace, settings: Settings) -> int:
    """Run the operator until it is stopped (SIGTERM / SIGINT)."""
    import sys

    from jobpool.k8s.client import NoCredentialsError
    from jobpool.k8s.handlers import OperatorConfig, run_operator

    config = OperatorConfig(
        scale_interval=settings.scale_interval,
        namespaces=settings.operator_namespaces,
        kubeconfig=settings.kubeconfig or None,
        lease_namespace=settings.lease_namespace or None,
        liveness_endpoint=settings.operator_liveness or None,
    )
    try:
        await run_operator(config)
    except NoCredentialsError as exc:
        print(f"jobpool operator: error: no Kubernetes credentials: {exc}", file=sys.stderr)
        return 2
    return 0
