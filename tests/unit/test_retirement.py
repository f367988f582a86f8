"""When the operator retires a deleted pool's schedules (k8s.retirement)."""

from __future__ import annotations

import pytest

from jobpool.core.poolspec import load_pool
from jobpool.k8s.manifests import build_pod_template
from jobpool.k8s.retirement import (
    GIVE_UP_AFTER,
    WARN_EVERY,
    GonePool,
    failed_try,
    linger_seconds,
    retirement_step,
    succeeded,
)

LINGER = 100.0


def gone(retired_at: float | None = None) -> GonePool:
    return GonePool({"metadata": {"namespace": "mdm", "name": "p"}}, retired_at=retired_at)


@pytest.mark.parametrize(("retired_at", "stored", "deployments", "now", "step"), [
    # created again: its workers own the schedules, whatever else holds
    (None, True, False, 0.0, "forget"),
    (None, True, True, 0.0, "forget"),
    (50.0, True, False, 60.0, "forget"),
    # its Deployments not collected yet: a pool created again could take them over
    (None, False, True, 0.0, "wait"),
    (50.0, False, True, 60.0, "wait"),
    # gone with its Deployments: retire, and again until its pods cannot declare any more
    (None, False, False, 0.0, "retire"),
    (50.0, False, False, 50.0 + LINGER - 1, "retire"),
    (50.0, False, False, 50.0 + LINGER, "forget"),
])
def test_a_gone_pools_step(retired_at: float | None, stored: bool, deployments: bool,
                           now: float, step: str) -> None:
    assert retirement_step(gone(retired_at), stored=stored, deployments=deployments, now=now,
                           linger=LINGER) == step


def test_retiring_goes_on_past_the_longest_a_pod_of_the_pool_may_still_run() -> None:
    pool = load_pool({
        "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
        "metadata": {"name": "p", "namespace": "mdm"},
        "spec": {"image": "jobpool:1", "database": {"secretName": "db", "key": "dsn"},
                 "worker": {"graceSeconds": 45},
                 "lanes": [{"name": "all"}, {"name": "b", "kinds": ["reindex"]}]}})
    # what the kubelet gives each lane's pods once they are deleted
    longest = max(build_pod_template(pool, lane)["spec"]["terminationGracePeriodSeconds"]
                  for lane in pool.lanes)
    assert longest > 45
    assert linger_seconds(pool, 15.0) >= longest + 2 * 15.0


def test_failed_tries_warn_first_then_now_and_then_and_give_up_after_an_hour() -> None:
    pool = gone()
    outcomes = [failed_try(pool, 1000.0 + 15 * n) for n in range(WARN_EVERY)]
    assert outcomes[0] == "warn" and outcomes[-1] == "warn"
    assert set(outcomes[1:-1]) == {"quiet"}
    assert failed_try(pool, 1000.0 + GIVE_UP_AFTER) == "give up"


def test_a_retirement_that_went_through_starts_the_failures_over() -> None:
    pool = gone()
    failed_try(pool, 1000.0)
    failed_try(pool, 1015.0)
    succeeded(pool, 1030.0)
    assert (pool.failures, pool.failing_since, pool.retired_at) == (0, None, 1030.0)
    succeeded(pool, 1045.0)  # the linger's later rounds keep the first retirement's time
    assert pool.retired_at == 1030.0
    assert failed_try(pool, 1060.0 + GIVE_UP_AFTER - 1) == "warn"  # failing since then only
