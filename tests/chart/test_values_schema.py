"""values.schema.json: the chart refuses misspelt or out-of-range values before rendering."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jobpool"


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def defaults() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_the_defaults_satisfy_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    jsonschema.Draft7Validator(schema()).validate(defaults())


def _closed_objects(node: dict[str, Any], path: str = "") -> dict[str, set[str]]:
    """The property names of every object the schema closes (additionalProperties false)."""
    found: dict[str, set[str]] = {}
    if node.get("additionalProperties") is False:
        found[path] = set(node["properties"])
        for name, child in node["properties"].items():
            found |= _closed_objects(child, f"{path}.{name}" if path else name)
    return found


def _at(values: dict[str, Any], path: str) -> Any:
    for key in filter(None, path.split(".")):
        values = values[key]
    return values


def test_every_closed_object_lists_exactly_the_keys_values_yaml_documents() -> None:
    """Schema and defaults name the same settings; `global` is what parent charts pass down."""
    values = defaults()
    closed = _closed_objects(schema())
    assert "operator" in closed and "rbac" in closed
    for path, names in closed.items():
        documented = set(_at(values, path))
        assert names - {"global"} == documented, path


TYPOS = [
    "operator.watchNamespce={mdm}",  # misspelt key
    "operator.peering=jobpool",  # removed: operator.replicas with leader election replaced it
    "metrics.serviceMonitor.enabled=true",  # removed: the PodMonitor replaced it
    "rbac.kedaa=true",
    "crd.install=false",
    "operator.replicas=0",
    "operator.logLevel=verbose",
    "operator.watchNamespaces={Not_A_Namespace}",
    "operator.podDisruptionBudget.maxUnavailable=half",
    "networkPolicy.databasePorts={70000}",
    "image.pullPolicy=Sometimes",
    "api.jwt.secretKy=jwt",  # misspelt: the API would start without its key
    "api.port=80",  # below 1024: the image's user cannot bind it
    "api.logLevel=verbose",
    "tracing.env.JOBPOOL_DSN=postgresql://x",  # not an OpenTelemetry variable
]


@pytest.mark.parametrize("value", TYPOS)
def test_lint_and_install_refuse_a_value_the_schema_does_not_allow(
    helm: str, value: str, tmp_path: Path
) -> None:
    for command in (
        [helm, "lint", "--strict", str(CHART)],
        [helm, "install", "jp", str(CHART), "--dry-run=client"],
    ):
        result = subprocess.run([*command, "--set", value], capture_output=True, text=True,
                                check=False, env={"KUBECONFIG": str(tmp_path / "none"),
                                                  "PATH": "/usr/bin:/bin"} | _helm_homes())
        assert result.returncode != 0, (command, value)
        assert "schema" in result.stdout + result.stderr, result.stdout + result.stderr


def _helm_homes() -> dict[str, str]:
    return {name: os.environ[name] for name in
            ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME") if name in os.environ}


@pytest.mark.parametrize("value", [
    "operator.replicas=2",
    "operator.podDisruptionBudget.maxUnavailable=50%",
    "podSecurityContext.runAsUser=null",
    "global.imageRegistry=registry.example.com",
])
def test_lint_accepts_values_the_schema_allows(helm: str, value: str) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART), "--set", value],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
