"""How many worker processes `jobpool run` starts, and the group's health."""

from __future__ import annotations

from jobpool.core.process_group import (
    ProcessStatus,
    group_beat,
    group_problems,
    process_count,
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
