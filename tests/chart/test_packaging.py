"""The image and the development loop: Dockerfile, .dockerignore and skaffold.yaml by structure."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from jobpool.core.crd import CRD_FILE

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_is_multi_stage_non_root_with_jobpool_entrypoint() -> None:
    """The image installs the extras of what its pods run: workers, operator, admin API, and
    the tracing extra (workers export spans when the pool sets OTEL_* variables)."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\w+))?", text, re.M)
    assert len(stages) >= 2 and stages[0] == "build"
    assert "python -m build --wheel" in text
    assert re.search(r"^COPY --from=build /wheels", text, re.M)
    installed = re.search(r'pip install .*--no-index --find-links=/wheels "jobpool\[(.*)\]"', text)
    assert installed and set(installed[1].split(",")) == {"worker", "api", "operator", "otel"}
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r'^ENTRYPOINT \["jobpool"\]', text, re.M)


def test_dockerignore_sends_only_the_package() -> None:
    lines = (ROOT / ".dockerignore").read_text().split("\n")
    assert "*" in lines and "!operator/" in lines and "!pyproject.toml" in lines


def test_skaffold_builds_the_image_and_deploys_the_chart_with_its_crd() -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    assert config["apiVersion"].startswith("skaffold/v4")
    (artifact,) = config["build"]["artifacts"]
    assert artifact["image"] == "jobpool"
    assert (ROOT / artifact["docker"]["dockerfile"]).is_file()
    helm = config["deploy"]["helm"]
    assert "hooks" not in helm  # the chart installs and upgrades the CRD itself
    (release,) = helm["releases"]
    assert (ROOT / release["chartPath"] / "Chart.yaml").is_file()
    assert "crds.install" not in release.get("setValues", {})
    assert release["setValueTemplates"]["image.repository"] == "{{.IMAGE_REPO_jobpool}}"
    ports = {forward["port"] for forward in config["portForward"]}
    assert 9108 in ports


def test_the_crd_ships_as_package_data() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "crds/*.yaml" in project["tool"]["setuptools"]["package-data"]["jobpool"]
    assert (ROOT / "operator" / "jobpool" / "crds" / CRD_FILE).is_file()
