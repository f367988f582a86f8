"""`jobpool run --processes N`: N worker processes behind one /metrics, /healthz and /readyz.

One Python process runs its jobs on one core; a pod (or host) with more cores runs several
worker processes, each with its own slots, pool and worker id. The parent starts them, serves
the probes and the metrics of all of them on the one port, forwards SIGTERM/SIGINT (each
child finishes or hands back its jobs within the grace period) and exits with the worst exit
code (a second signal: each child hands back its jobs at once). The children run in process
groups of their own, so that a terminal's Ctrl-C reaches them only through the parent. A child
that dies while the group is not stopping stops the group (exit code 1 or
the child's), so that Kubernetes restarts the pod rather than running it short of processes.

Health: every child writes its fetch loop's beat and its readiness problems to a status file
every `STATUS_EVERY` seconds; /healthz fails when any child's beat is old, /readyz lists every
child's problems. Metrics: prometheus-client's multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`,
one folder per group): counters and histograms are summed over the children.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from jobpool.core.process_group import (
    ProcessStatus,
    group_beat,
    group_problems,
    stopped_cleanly,
    usable_cpus,
)
from jobpool.metrics import MetricsExposition, multiprocess_metrics
from jobpool.worker.health import HealthSource

log = logging.getLogger("jobpool.worker")

STATUS_EVERY = 1.0
"""Seconds between a child's status-file writes."""

CHILD_POLL = 0.2
"""Seconds between the parent's checks of its children."""

MULTIPROC_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cpu_count() -> int:
    """CPUs this process may use: its affinity, capped by its cgroup's CPU quota."""
    try:
        cpu_max: str | None = CGROUP_CPU_MAX.read_text(encoding="utf-8")
    except OSError:
        cpu_max = None
    return usable_cpus(len(os.sched_getaffinity(0)), cpu_max)


async def report_status(source: HealthSource, path: Path) -> None:
    """Write `source`'s beat and problems to `path` every `STATUS_EVERY` seconds (replaced
    atomically, so the parent never reads half a file)."""
    partial = path.with_suffix(".partial")
    while True:
        partial.write_text(json.dumps({"beat": source.loop_beat,
                                       "problems": source.not_ready()}), encoding="utf-8")
        os.replace(partial, path)
        await asyncio.sleep(STATUS_EVERY)


def read_status(path: Path) -> ProcessStatus | None:
    """A child's last status; None before its first write (or if the file is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ProcessStatus(float(data["beat"]), tuple(str(p) for p in data["problems"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


PARENT_CHECK_EVERY = 1.0
"""Seconds between a child process's looks at whether its parent still runs."""


async def stop_when_orphaned(stop: Callable[[], None], parent: int | None) -> None:
    """Call `stop` (what SIGTERM calls) once `parent`, the process that started this one
    (`--parent-pid`, as it gave its own), is no longer its parent: a worker process of
    `jobpool run --processes N` or of a local pool's lane whose parent was killed (kill -9,
    the OOM killer) would otherwise run on, claiming jobs beside the set a restarted parent
    starts. The pid comes from the parent, not from `os.getppid()` at this task's start: a
    parent killed while this process was still starting would be missed. None (an older
    parent): the parent at this task's start."""
    parent = os.getppid() if parent is None else parent
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_CHECK_EVERY)
    log.error("the jobpool process that started this one (pid %d) is gone: stopping, as on "
              "SIGTERM", parent)
    stop()


class ProcessGroup:
    """The parent of `count` worker processes (`jobpool run` with `run_args` each)."""

    def __init__(self, run_args: Sequence[str], count: int, env: Mapping[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="jobpool-workers-"))
        self.run_args = tuple(run_args)
        self.count = count
        self.env = {**env, MULTIPROC_VARIABLE: str(self.folder)}
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started = time.monotonic()
        self.stopping = False
        self.metrics: MetricsExposition = multiprocess_metrics(str(self.folder))

    def _status_file(self, n: int) -> Path:
        return self.folder / f"status-{n}.json"

    # -- what the health server reads ------------------------------------------------------

    def _statuses(self) -> dict[int, ProcessStatus | None]:
        return {n: read_status(self._status_file(n)) for n in self.children}

    def _exited(self) -> list[tuple[int, int]]:
        return [(n, child.returncode) for n, child in self.children.items()
                if child.returncode is not None]

    @property
    def loop_beat(self) -> float:
        """The oldest fetch-loop beat of the children (/healthz)."""
        return group_beat(self._statuses(), self.started)

    def not_ready(self) -> list[str]:
        """What keeps any child from being ready (/readyz); [] when all are."""
        return group_problems(self._statuses(), self._exited())

    def all_started(self) -> bool:
        """Whether every child has started (written its status)."""
        statuses = self._statuses()
        return len(statuses) == self.count and None not in statuses.values()

    async def report_status(self, path: Path) -> None:
        """Once every child has started, write the group's status to `path` as a worker
        does (a local pool's lane process is such a group): a child that fails at start
        fails the group at start."""
        while not self.all_started():
            await asyncio.sleep(CHILD_POLL)
        await report_status(self, path)

    # -- running ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Pass SIGTERM on to every child still running (again: they hand back their jobs
        at once)."""
        if not self.stopping:
            log.info("stopping %d worker process(es)", self.count)
        else:
            log.warning("stopped again: the worker processes hand back their jobs now")
        self.stopping = True
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)

    async def run(self) -> int:
        """Start the children and wait for all of them; the worst exit code (`stopped_cleanly`
        counts as 0)."""
        try:
            for n in range(self.count):
                argv = [sys.executable, "-m", "jobpool", *self.run_args,
                        "--status-file", str(self._status_file(n)),
                        "--parent-pid", str(os.getpid())]
                # a process group of its own: a terminal's Ctrl-C reaches the parent alone,
                # which passes one SIGTERM on (a second one would end the grace period)
                self.children[n] = subprocess.Popen(argv, env=self.env, process_group=0)
            log.info("started %d worker process(es): %s", self.count,
                     ", ".join(str(c.pid) for c in self.children.values()))
            while any(child.poll() is None for child in self.children.values()):
                failed = [(n, code) for n, code in self._exited() if code != 0]
                if failed and not self.stopping:
                    log.error("worker process %d exited with %d; stopping the others",
                              *failed[0])
                    self.stop()
                await asyncio.sleep(CHILD_POLL)
        except BaseException:
            self._signal(signal.SIGTERM)
            raise
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.folder)
        return max((0 if stopped_cleanly(child.returncode, stopping=self.stopping)
                    else abs(child.returncode) for child in self.children.values()), default=0)
