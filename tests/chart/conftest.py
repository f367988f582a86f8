"""Chart tests need helm: from JOBPOOL_HELM, PATH, or .ci/get-helm.sh's default folder.

Without helm they skip, unless CI is set: then they fail, so CI never passes untested.
"""

from __future__ import annotations

import os

import pytest
from helm_binary import require_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path of a working helm, with its cache, config and data in a temporary folder."""
    found = require_helm()
    home = tmp_path_factory.mktemp("helm-home")
    for name in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        os.environ[name] = str(home / name.lower())
    return found
