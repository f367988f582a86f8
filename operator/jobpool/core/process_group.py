"""How many worker processes `jobpool run` starts, and how their group reports its health."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def usable_cpus(affinity: int, cpu_max: str | None) -> int:
    """CPUs this process may use: its affinity (`os.sched_getaffinity`), capped by a cgroup v2
    quota (the text of `cpu.max`, "<quota> <period>" or "max <period>"; None: no cgroup).

    A container limited to 1.5 CPUs on a 16-core node gets 2, not 16: one process per core
    the quota pays for, rounded up so that a fractional quota is used.
    """
    cpus = max(1, affinity)
    if cpu_max:
        parts = cpu_max.split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                return cpus
            if quota > 0 and period > 0:
                cpus = min(cpus, max(1, math.ceil(quota / period)))
    return cpus


def process_count(requested: int, cpus: int) -> int:
    """Worker processes to start: `requested`, or `cpus` when it is 0."""
    return requested if requested > 0 else max(1, cpus)


@dataclass(frozen=True)
class ProcessStatus:
    """What one worker process of a group last reported (its status file).

    beat: its fetch loop's last beat, `time.monotonic()` seconds (one clock for every process
    of the host). problems: what keeps it from being ready, [] when ready.
    """

    beat: float
    problems: tuple[str, ...]


def group_beat(statuses: Mapping[int, ProcessStatus | None], started: float) -> float:
    """The oldest beat of the group (`started` for a process that has not reported yet): the
    group is alive only while every process is."""
    return min((s.beat if s is not None else started for s in statuses.values()),
               default=started)


def group_problems(statuses: Mapping[int, ProcessStatus | None],
                   exited: Sequence[tuple[int, int]]) -> list[str]:
    """What keeps the group from being ready: each process's problems, prefixed with its
    number; a process not reporting yet; `exited` (number, exit code) processes."""
    problems = [f"worker process {n} exited with {code}" for n, code in exited]
    gone = {n for n, _ in exited}
    for n, status in sorted(statuses.items()):
        if n in gone:
            continue
        if status is None:
            problems.append(f"worker process {n}: starting")
        else:
            problems += [f"worker process {n}: {problem}" for problem in status.problems]
    return problems
