"""How many worker processes `jobpool run` starts, and the group's health."""

from __future__ import annotations

import random
import signal
from typing import Any

from jobpool.core.process_group import (
    STABLE_AFTER,
    LaneExit,
    ProcessStatus,
    group_beat,
    group_problems,
    lane_exit,
    process_count,
    stopped_cleanly,
    usable_cpus,
)


def test_usable_cpus_is_the_affinity_without_a_quota() -> None:
    assert usable_cpus(8, None) == 8
    assert usable_cpus(8, "max 100000\n") == 8


def test_a_cgroup_quota_caps_the_cpus_rounded_up() -> None:
    assert usable_cpus(16, "150000 100000\n") == 2
    assert usable_cpus(16, "100000 100000") == 1
    assert usable_cpus(16, "10000 100000") == 1  # a tenth of a CPU still runs one process
    assert usable_cpus(2, "400000 100000") == 2  # the affinity is the other cap


def test_an_unreadable_quota_is_ignored() -> None:
    assert usable_cpus(4, "garbage") == 4
    assert usable_cpus(4, "x 100000") == 4
    assert usable_cpus(0, None) == 1


def test_process_count_zero_means_one_per_cpu() -> None:
    assert process_count(0, 6) == 6
    assert process_count(3, 6) == 3
    assert process_count(0, 0) == 1


def test_the_group_beats_as_its_slowest_process() -> None:
    statuses = {0: ProcessStatus(100.0, ()), 1: ProcessStatus(40.0, ())}
    assert group_beat(statuses, started=10.0) == 40.0
    assert group_beat({0: ProcessStatus(100.0, ()), 1: None}, started=10.0) == 10.0


def test_the_group_is_ready_only_when_every_process_is() -> None:
    ready = {0: ProcessStatus(1.0, ()), 1: ProcessStatus(1.0, ())}
    assert group_problems(ready, []) == []
    statuses = {0: ProcessStatus(1.0, ("LISTEN connection down",)), 1: None,
                2: ProcessStatus(1.0, ())}
    assert group_problems(statuses, [(2, -9)]) == [
        "worker process 2 exited with -9",
        "worker process 0: LISTEN connection down",
        "worker process 1: starting",
    ]


# -- a local pool's lane processes -------------------------------------------------------


def decide(code: int, **given: Any) -> LaneExit:
    facts: dict[str, Any] = {"name": "lane a worker 0", "started": True, "uptime": 120.0,
                             "stopping": False, "until_empty": False, "failures": 0}
    return lane_exit(code, **{**facts, **given}, rng=random.Random(7))


def test_a_lane_that_fails_at_start_stops_the_pool_with_its_status() -> None:
    assert decide(2, started=False) == LaneExit(
        "stop_pool", "lane a worker 0 failed at start (exit status 2); stopping the pool",
        code=2)
    assert decide(-9, started=False).code == 9  # killed by a signal: its number
    assert decide(0, started=False).code == 1  # gone at start without a word is no success


def test_a_crash_after_start_is_restarted_later_each_time_it_repeats() -> None:
    delays = []
    failures = 0
    for _ in range(8):
        decision = decide(-9, uptime=5.0, failures=failures)
        assert decision.action == "restart"
        assert decision.message.startswith("lane a worker 0 exited with -9 after 5s; "
                                           "restarting it in ")
        failures = decision.failures
        delays.append(decision.delay)
    assert failures == 8
    assert 0.5 <= delays[0] <= 1.0 and 15.0 <= delays[-1] <= 30.0
    assert decide(1, uptime=STABLE_AFTER, failures=7).failures == 1  # it had run a while


def test_a_drain_stops_at_its_first_failure_and_ends_when_every_lane_is_done() -> None:
    assert decide(0, until_empty=True).action == "done"
    failed = decide(2, until_empty=True)
    assert (failed.action, failed.code) == ("stop_pool", 2)
    assert failed.message == "lane a worker 0 failed after 120s (exit status 2); stopping " \
                             "the pool"


def test_while_stopping_a_clean_exit_or_the_sigterm_itself_is_done() -> None:
    assert decide(0, stopping=True) == LaneExit("done", "")
    assert decide(-signal.SIGTERM, stopping=True, started=False) == LaneExit("done", "")
    assert decide(-9, stopping=True) == LaneExit(
        "done", "lane a worker 0 exited with -9 while stopping", code=9)


def test_a_worker_process_killed_by_the_sigterm_passed_on_stopped_cleanly() -> None:
    """`jobpool run --processes N`: a child that got the group's SIGTERM before its handlers
    were installed held no job, and the group still exits 0."""
    assert stopped_cleanly(0, stopping=False)
    assert stopped_cleanly(-signal.SIGTERM, stopping=True)
    assert not stopped_cleanly(-signal.SIGTERM, stopping=False)  # killed by someone else
    assert not stopped_cleanly(-signal.SIGKILL, stopping=True)
    assert not stopped_cleanly(2, stopping=True)
