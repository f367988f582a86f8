"""`jobpool run pool.yaml`: each lane of a JobWorkerPool as local worker processes."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from jobpool.cli_arguments import worker_command
from jobpool.core.poolspec import Lane, PoolSpec
from jobpool.core.process_group import STOP_SIGNALS, lane_exit
from jobpool.settings import PREFIX, Settings

log = logging.getLogger("jobpool.pool")

CHILD_POLL = 0.2
"""Seconds between the pool's checks of its lane processes."""


@dataclass(frozen=True)
class LaneProcess:
    """One local worker process of a lane: its `jobpool run` arguments and its environment."""

    lane: str
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]


def lane_command(pool: PoolSpec, lane: Lane, settings: Settings, *, imports: Sequence[str],
                 until_empty: bool, inherited: Mapping[str, str],
                 metrics_port: int | None = None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The `jobpool run` arguments and the environment of one local worker process of `lane`.

    Arguments: those of its pods (`PoolSpec.worker_run`), plus the local run's own
    `imports`, log level, metrics port (if not None) and `--until-empty`. Environment, built
    explicitly: `inherited` without its `JOBPOOL_*` variables (PATH, PYTHONPATH, libpq's
    PG*, ...), then `settings` as `JOBPOOL_*` variables (the DSN, the embedded server's
    included, SMTP, ...), then the variables the operator gives the lane's pods.
    `settings.rate_limits` is left out: as on Kubernetes, provider caps come from the lane's
    `rateLimits` alone."""
    more: dict[str, object] = {"log_level": settings.log_level}
    if metrics_port is not None:
        more["metrics_port"] = metrics_port
    argv, lane_env = worker_command(pool.worker_run(lane, imports), until_empty=until_empty,
                                    **more)
    base = {name: value for name, value in inherited.items() if not name.startswith(PREFIX)}
    return tuple(argv), base | replace(settings, rate_limits=None).to_env() | lane_env


PROCESSES_PER_CPU = 4
"""Cap on a local pool's processes per CPU of the machine: more only contend for the CPUs
and the database's connections (each process holds up to its slots + 6), so a
`minReplicas` meant for a cluster is refused instead of starting hundreds of processes on one
host."""


def local_process_count(pool: PoolSpec, cpus: int) -> int:
    """The processes `jobpool run pool.yaml` starts: max(1, minReplicas) per lane.

    Raises ValueError naming the lanes when that is more than PROCESSES_PER_CPU * `cpus`.
    """
    counts = {lane.name: max(1, lane.min_replicas) for lane in pool.lanes}
    total, cap = sum(counts.values()), PROCESSES_PER_CPU * max(1, cpus)
    if total > cap:
        lanes = ", ".join(f"{name}: {count}" for name, count in counts.items())
        raise ValueError(
            f"the pool file asks for {total} local worker processes ({lanes}), more than the "
            f"cap of {cap} on this machine ({PROCESSES_PER_CPU} per CPU, {max(1, cpus)} "
            f"CPU{'s' if cpus > 1 else ''}); lower minReplicas for a local run, or run the "
            "pool on Kubernetes")
    return total


def lane_processes(pool: PoolSpec, settings: Settings, *, imports: Sequence[str],
                   until_empty: bool, inherited: Mapping[str, str],
                   metrics_port: int | None = None) -> list[LaneProcess]:
    """max(1, minReplicas) local processes per lane of `pool`: a local run has no autoscaler.

    settings: the parent's, its DSN resolved; the processes get them as `JOBPOOL_*`
    variables, and its log level as a flag. inherited: the environment besides jobpool's
    own variables (`lane_command`). metrics_port: the n-th process of the pool (counting
    across lanes from 0) serves /metrics on metrics_port + n; 0 turns it off everywhere;
    None leaves it to the settings.
    """
    places = [(lane, index) for lane in pool.lanes for index in range(max(1, lane.min_replicas))]
    return [
        LaneProcess(lane.name, index, *lane_command(
            pool, lane, settings, imports=imports, until_empty=until_empty, inherited=inherited,
            metrics_port=None if metrics_port is None else metrics_port and metrics_port + n))
        for n, (lane, index) in enumerate(places)
    ]


@dataclass
class _Running:
    """One lane process the pool runs, and what the pool knows of it."""

    proc: LaneProcess
    status_file: Path
    child: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    restarts: int = 0
    failures: int = 0

    @property
    def name(self) -> str:
        return f"lane {self.proc.lane} worker {self.proc.index}"

    def start(self) -> None:
        self.status_file.unlink(missing_ok=True)
        if not self.restarts:
            log.info("%s: starting: jobpool %s", self.name, " ".join(self.proc.argv))
        argv = [sys.executable, "-m", "jobpool", *self.proc.argv,
                "--status-file", str(self.status_file), "--parent-pid", str(os.getpid())]
        # a process group of its own: a terminal's Ctrl-C reaches the pool alone, which
        # passes one SIGTERM on (the second ends the grace period, see `supervise`)
        self.child = subprocess.Popen(argv, env=dict(self.proc.env), process_group=0)
        self.started_at = time.monotonic()
        self.restart_at = None


class _Stop:
    """The pool's stop signals: how many came, and what each one does.

    Each live lane process gets one SIGTERM per signal, up to two (the first stops it with
    its grace period, the second ends that), also one started after the signal came.
    """

    def __init__(self, running: Sequence[_Running], grace: float) -> None:
        self.running = running
        self.grace = grace
        self.count = 0
        self.sent: dict[int, int] = {}
        """SIGTERMs sent, by process id."""

    def __call__(self, _signum: int = 0, _frame: object = None) -> None:
        self.count += 1
        if self.count == 1:
            log.warning("stopping the pool: running jobs get %gs to finish, then are handed "
                        "back (Ctrl-C again hands them back now)", self.grace)
        elif self.count == 2:
            log.warning("stopping the pool now: running jobs are handed back at once")
        else:
            log.warning("still handing back: waiting for %d worker(s) to exit", sum(
                1 for r in self.running if r.child is not None and r.child.poll() is None))
        self.forward()

    def forward(self) -> None:
        """Send each live lane process the SIGTERMs it is owed."""
        owed = min(self.count, 2)
        for run in self.running:
            child = run.child
            if child is not None and child.poll() is None:
                while self.sent.get(child.pid, 0) < owed:
                    child.send_signal(signal.SIGTERM)
                    self.sent[child.pid] = self.sent.get(child.pid, 0) + 1


def supervise(processes: Sequence[LaneProcess], *, grace: float, until_empty: bool,
              rng: random.Random | None = None) -> int:
    """Run the lane processes until the pool stops; return its exit status.

    A process that fails at start stops the pool with its exit status (`lane_exit`); one that
    crashes later is started again after a pause, logged. SIGTERM or SIGINT (Ctrl-C) stops
    the pool: each process gets one SIGTERM (its jobs get `grace` seconds, then are handed
    back) and the pool exits 0 once they did; a second signal makes them hand back at once.
    until_empty: the processes drain and exit 0 (done), as `lane_processes` made them.
    """
    rng = rng or random.Random()
    folder = Path(tempfile.mkdtemp(prefix="jobpool-pool-"))
    running = [_Running(proc, folder / f"lane-{n}.json") for n, proc in enumerate(processes)]
    stop = _Stop(running, grace)
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    status = 0
    try:
        for run in running:
            run.start()
        while any(r.child is not None or r.restart_at is not None for r in running):
            for run in running:
                if run.child is not None and run.child.poll() is not None:
                    status = max(status, _exited(run, stopping=bool(stop.count),
                                                 until_empty=until_empty, rng=rng))
                    if run.restart_at is None and not stop.count and status:
                        stop()  # a lane failed: the pool stops with its status
                elif run.restart_at is not None and stop.count:
                    run.restart_at = None
                elif run.restart_at is not None and time.monotonic() >= run.restart_at:
                    run.start()
            stop.forward()  # to processes that started after a signal too
            time.sleep(CHILD_POLL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for run in running:
            if run.child is not None and run.child.poll() is None:
                run.child.kill()
        shutil.rmtree(folder, ignore_errors=True)
    return status


def _exited(run: _Running, *, stopping: bool, until_empty: bool, rng: random.Random) -> int:
    """Carry out `lane_exit` for `run`, whose process exited; the pool's exit status."""
    assert run.child is not None
    decision = lane_exit(run.child.returncode, name=run.name,
                         started=run.restarts > 0 or run.status_file.exists(),
                         uptime=time.monotonic() - run.started_at, stopping=stopping,
                         until_empty=until_empty, failures=run.failures, rng=rng)
    run.child = None
    if decision.action == "restart":
        log.error("%s", decision.message)
        run.failures, run.restarts = decision.failures, run.restarts + 1
        run.restart_at = time.monotonic() + decision.delay
        return 0
    if decision.message:
        log.error("%s", decision.message)
    return decision.code
