"""The operator's writes go out only while its replica leads, each bounded in time."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from jobpool.k8s.client import ApiError, KubeApi
from jobpool.k8s.handlers import PoolController
from jobpool.k8s.leader import NotLeadingError


def controller(budget: Budget) -> PoolController:
    return PoolController(cast(KubeApi, None), write_budget=budget, count_jobs=None)


class Budget:
    """Seconds a write may take, as the Leader answers them; None: no longer leading."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds

    def __call__(self) -> float | None:
        return self.seconds


async def test_a_write_after_leadership_ended_never_goes_out() -> None:
    sent: list[str] = []

    async def write() -> None:
        sent.append("patch")

    budget = Budget(5.0)
    fenced = controller(budget)
    await fenced._write(write())
    budget.seconds = None  # the renew deadline passed mid-round
    with pytest.raises(NotLeadingError):
        await fenced._write(write())
    assert sent == ["patch"]


async def test_a_write_that_outlasts_the_lease_is_abandoned() -> None:
    async def hanging() -> None:
        await asyncio.sleep(3600)

    with pytest.raises(ApiError) as caught:
        await controller(Budget(0.01))._write(hanging())
    assert caught.value.status == 504 and "may still lead" in caught.value.message
