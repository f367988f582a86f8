"""How many worker processes `jobpool run` starts, how their group reports its health, and
what a local pool does when one of its lane processes exits."""

from __future__ import annotations

import math
import random
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from jobpool.core.retry import retry_pause

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Signals that stop a worker, a process group or a pool as SIGTERM does (the first: running
jobs get the grace period; the second: they are handed back at once). SIGHUP is the one a
closing terminal or SSH session sends: without a handler it would end the process at once,
as kill -9 does, leaving its claimed jobs to wait a lease before they run again."""


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


# -- a local pool's lane processes -------------------------------------------------------

RESTART_FIRST = 1.0
"""Seconds before the first restart of a lane process that crashed."""
RESTART_MAX = 30.0
"""Cap on the pause before a restart, seconds, while a lane process keeps crashing."""
STABLE_AFTER = 60.0
"""Seconds a lane process must have run for its crashes before to be forgotten."""


@dataclass(frozen=True)
class LaneExit:
    """What a local pool does about one of its lane processes that exited.

    action: "done" (it finished: drained with --until-empty, or stopped with the pool),
    "restart" (it crashed after it started: again after `delay` seconds), "stop_pool" (it
    failed at start: the pool stops and exits with `code`). failures: the process's crashes
    in a row so far (0 once it had run STABLE_AFTER seconds). message: what to log.
    """

    action: Literal["done", "restart", "stop_pool"]
    message: str
    code: int = 0
    delay: float = 0.0
    failures: int = 0


def stopped_cleanly(code: int, *, stopping: bool) -> bool:
    """Whether a worker process that exited with `code` (negative: killed by that signal)
    ended cleanly: 0, or, once its parent was stopping, killed by the SIGTERM passed on to it
    before its handlers were installed (it held no job yet)."""
    return code == 0 or (stopping and code == -signal.SIGTERM)


def lane_exit(code: int, *, name: str, started: bool, uptime: float, stopping: bool,
              until_empty: bool, failures: int, rng: random.Random) -> LaneExit:
    """Decide about lane process `name` ("lane L worker i") that exited with `code`
    (negative: killed by that signal) after `uptime` seconds.

    started: it had started (its status file was written: its configuration was accepted and
    its worker was running or waiting for the database); restarts count as started, so only
    the first start can stop the pool (with `until_empty`, a one-off drain that nothing
    restarts, any failure does). A process that fails at start would fail the same way
    again (a bad flag, a module that does not import): the pool stops with its exit status
    rather than running short of a lane that Kubernetes would also never start. A crash
    later (killed, out of memory, an unexpected exception) is restarted after a pause
    (`retry_pause`: RESTART_FIRST seconds doubling to RESTART_MAX, jittered).
    """
    if stopping:
        clean = stopped_cleanly(code, stopping=True)
        return LaneExit("done", "" if clean else f"{name} exited with {code} while stopping",
                        code=0 if clean else exit_status(code))
    if code == 0 and until_empty:
        return LaneExit("done", "")
    if not started or until_empty:  # a one-off drain stops at its first failure, as a worker
        when = "at start" if not started else f"after {uptime:.0f}s"
        return LaneExit("stop_pool", f"{name} failed {when} (exit status {code}); stopping "
                        "the pool", code=exit_status(code) or 1)
    failures = 1 if uptime >= STABLE_AFTER else failures + 1
    delay = retry_pause(failures, first=RESTART_FIRST, cap=RESTART_MAX, rng=rng)
    return LaneExit("restart", f"{name} exited with {code} after {uptime:.0f}s; restarting it "
                    f"in {delay:.1f}s (crash {failures} in a row)", delay=delay,
                    failures=failures)


def exit_status(code: int) -> int:
    """A child's return code as an exit status: a signal's number for a child it killed."""
    return abs(code)
