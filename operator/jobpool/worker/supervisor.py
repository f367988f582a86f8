"""`jobpool run pool.yaml`: each lane of a JobWorkerPool as local worker processes."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from jobpool.core.poolspec import Lane, PoolSpec
from jobpool.settings import PREFIX, Settings

log = logging.getLogger("jobpool.pool")


@dataclass(frozen=True)
class LaneProcess:
    """One local worker process of a lane: its `jobpool run` arguments and its environment."""

    lane: str
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]


def lane_argv(pool: PoolSpec, lane: Lane, *, imports: Sequence[str], until_empty: bool,
              log_level: str) -> tuple[str, ...]:
    """The `jobpool run` arguments of one local worker process of `lane`: those of its pods
    (`Lane.worker_args` with the pool's `graceSeconds` and `imports`), plus the local run's
    own `imports`, log level and `--until-empty`."""
    modules = tuple(dict.fromkeys((*pool.imports, *imports)))
    argv = [*lane.worker_args(pool.grace_seconds, modules), "--log-level", log_level]
    return (*argv, "--until-empty") if until_empty else tuple(argv)


def lane_environment(pool: PoolSpec, lane: Lane, settings: Settings,
                     inherited: Mapping[str, str]) -> dict[str, str]:
    """The environment of a local process of `lane`, built explicitly: `inherited` without
    its `JOBPOOL_*` variables (PATH, PYTHONPATH, libpq's PG*, ...), then `settings` as
    `JOBPOOL_*` variables (the DSN, the embedded server's included, SMTP, ...), then the
    variables the operator gives the lane's pods (`PoolSpec.lane_env`). `settings.rate_limits`
    is left out: as on Kubernetes, provider caps come from the lane's `rateLimits` alone."""
    base = {name: value for name, value in inherited.items() if not name.startswith(PREFIX)}
    return base | replace(settings, rate_limits=None).to_env() | pool.lane_env(lane)


PROCESSES_PER_CPU = 4
"""Cap on a local pool's processes per CPU of the machine: more only contend for the CPUs
and the database's connections (each process holds its slots + 2, and LISTEN), so a
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
    own variables (`lane_environment`). metrics_port: the n-th process of the pool (counting
    across lanes from 0) serves /metrics on metrics_port + n; 0 turns it off everywhere;
    None leaves it to the settings.
    """
    processes = [
        LaneProcess(lane.name, index,
                    lane_argv(pool, lane, imports=imports, until_empty=until_empty,
                              log_level=settings.log_level),
                    lane_environment(pool, lane, settings, inherited))
        for lane in pool.lanes
        for index in range(max(1, lane.min_replicas))
    ]
    if metrics_port is None:
        return processes
    return [
        LaneProcess(proc.lane, proc.index,
                    (*proc.argv, "--metrics-port", str(metrics_port + n if metrics_port else 0)),
                    proc.env)
        for n, proc in enumerate(processes)
    ]


def supervise(processes: Sequence[LaneProcess]) -> int:
    """Start the processes, forward SIGTERM/SIGINT, wait; return the worst exit code."""
    children: list[tuple[LaneProcess, subprocess.Popen[bytes]]] = []
    for proc in processes:
        log.info("lane %s: starting worker %d: jobpool %s",
                 proc.lane, proc.index, " ".join(proc.argv))
        children.append((proc, subprocess.Popen([sys.executable, "-m", "jobpool", *proc.argv],
                                                env=dict(proc.env))))

    def forward(signum: int, _frame: object) -> None:
        for _, child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while any(child.poll() is None for _, child in children):
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    worst = 0
    for proc, child in children:
        code = child.returncode
        if code:
            log.error("lane %s worker %d exited with %d", proc.lane, proc.index, code)
        worst = max(worst, abs(code))
    return worst
