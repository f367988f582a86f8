"""Drive the real `jobpool` command in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def env(dsn: str | None, **extra: str) -> dict[str, str]:
    variables = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    # no empty entry (it would put every child's current folder on its path, which the
    # installed command does not do: a test could not tell the two apart)
    inherited = [p for p in variables.get("PYTHONPATH", "").split(os.pathsep) if p]
    variables["PYTHONPATH"] = os.pathsep.join([str(TESTS), *inherited])
    if dsn:
        variables["JOBPOOL_DSN"] = dsn
    variables.update(extra)
    return variables


def jobpool(dsn: str | None, *args: str, check: bool = True, timeout: float = 120,
            cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "jobpool", *args], env=env(dsn, **extra),
                            capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"jobpool {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def start(dsn: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "jobpool", *args], env=env(dsn, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def worker_args(*kinds: str, slots: int = 4, **flags: Any) -> list[str]:
    """`jobpool run` of `kinds`; without metrics_port, no metrics server (a taken port stops
    a worker at its start, and tests run side by side)."""
    flags.setdefault("metrics_port", 0)
    args = ["run", "--kinds", ",".join(kinds), "--slots", str(slots), "--import",
            "kinds_for_tests", "--log-level", "warning"]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return args
