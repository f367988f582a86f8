"""`jobpool operator`: flags with JOBPOOL_* fallbacks; kopf is not imported to build the parser."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from jobpool.k8s.cli import add_operator_command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_operator_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["operator", *argv])


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JOBPOOL_SCALE_INTERVAL", "JOBPOOL_OPERATOR_NAMESPACES", "JOBPOOL_PEERING"):
        monkeypatch.delenv(name, raising=False)
    args = parse()
    assert (args.scale_interval, args.namespaces, args.peering) == (15.0, None, None)
    assert args.liveness == "http://0.0.0.0:8080/healthz"


def test_environment_fallbacks_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBPOOL_SCALE_INTERVAL", "2.5")
    monkeypatch.setenv("JOBPOOL_OPERATOR_NAMESPACES", "mdm, billing")
    assert parse().scale_interval == 2.5
    assert parse().namespaces == ["mdm", "billing"]
    assert parse("--scale-interval", "7").scale_interval == 7.0


def test_bad_interval_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--scale-interval", "0")
    assert "must be from 1 to 3600 seconds, got 0" in capsys.readouterr().err


def test_building_the_cli_does_not_import_kopf() -> None:
    code = ("import sys, jobpool.cli; jobpool.cli.build_parser(); "
            "print('kopf' in sys.modules, 'kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
