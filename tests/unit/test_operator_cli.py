"""`jobpool operator`: flags defaulting to the settings; kopf is not imported to build the
parser."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from jobpool.cli_arguments import settings_with_flags
from jobpool.k8s.operator_command import add_operator_command
from jobpool.settings import Settings


def operator_settings(*argv: str, env: dict[str, str] | None = None) -> Settings:
    """The settings `jobpool operator ARGV` runs with, under the variables `env`."""
    settings = Settings.from_env(env or {})
    parser = argparse.ArgumentParser()
    add_operator_command(parser.add_subparsers(dest="command"), settings)
    return settings_with_flags(settings, parser.parse_args(["operator", *argv]))


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_operator_command(parser.add_subparsers(dest="command"), Settings())
    return parser.parse_args(["operator", *argv])


def test_defaults() -> None:
    settings = operator_settings()
    assert (settings.scale_interval, settings.operator_namespaces, settings.lease_namespace) == (
        15.0, (), None)
    assert settings.operator_liveness == "http://0.0.0.0:8080/healthz"


def test_environment_fallbacks_and_flags() -> None:
    env = {"JOBPOOL_SCALE_INTERVAL": "2.5", "JOBPOOL_OPERATOR_NAMESPACES": "mdm, billing"}
    assert operator_settings(env=env).scale_interval == 2.5
    assert operator_settings(env=env).operator_namespaces == ("mdm", "billing")
    assert operator_settings("--scale-interval", "7", env=env).scale_interval == 7.0


def test_namespace_flags_replace_the_variables_namespaces() -> None:
    """They used to be added to them: JOBPOOL_OPERATOR_NAMESPACES=mdm with --namespace
    billing watched both."""
    env = {"JOBPOOL_OPERATOR_NAMESPACES": "mdm"}
    assert operator_settings("--namespace", "billing", "--namespace", "crm,hr",
                             env=env).operator_namespaces == ("billing", "crm", "hr")


def test_bad_interval_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--scale-interval", "0")
    assert "must be from 1 to 3600 seconds, got 0" in capsys.readouterr().err


def test_building_the_cli_does_not_import_kopf() -> None:
    code = ("import sys, jobpool.cli; jobpool.cli.build_parser(); "
            "print('kopf' in sys.modules, 'kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
