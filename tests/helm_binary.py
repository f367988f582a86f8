"""Where the tests find helm (JOBPOOL_HELM, PATH, or .ci/get-helm.sh's folder), and rendering.

Tests that need helm skip without it, unless CI is set: then they fail, so CI never
passes untested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "jobpool"


def find_helm() -> str | None:
    """The helm binary to use, or None."""
    explicit = os.environ.get("JOBPOOL_HELM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    candidate = cache / "jobpool" / "bin" / "helm"
    return str(candidate) if candidate.is_file() else None


def require_helm() -> str:
    """The helm binary; skips the test without one (fails it where CI is set)."""
    found = find_helm()
    if found is None:
        reason = "helm not found: run .ci/get-helm.sh (or set JOBPOOL_HELM)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason}; CI must run the tests that need helm", pytrace=False)
        pytest.skip(reason)
    return found


def render_chart(
    helm: str, *args: str, chart: Path = CHART, namespace: str = "jobpool-system"
) -> list[dict[str, Any]]:
    """`helm template jp <chart> --namespace <namespace> <args>`, as a list of objects."""
    result = subprocess.run(
        [helm, "template", "jp", str(chart), "--namespace", namespace, *args],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
