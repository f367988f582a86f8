"""Where the chart and e2e tests find helm: JOBPOOL_HELM, PATH, or .ci/get-helm.sh's folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


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
