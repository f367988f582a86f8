"""Supervision of a worker's background tasks: restart on failure, reported until healthy."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from jobpool.core.retry import retry_pause
from jobpool.core.schedules import ScheduleError
from jobpool.worker.background import BackgroundTasks


async def test_a_task_that_raises_is_restarted_and_reported_until_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(random.Random(1))
    runs = 0
    release = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("unexpected")
        tasks.healthy("flaky")
        await release.wait()

    tasks.start("flaky", flaky)
    await asyncio.sleep(0.05)
    assert tasks.problems() == ["background task flaky failing: RuntimeError: unexpected"]
    assert "background task flaky failed (RuntimeError: unexpected); restarting it in" in (
        caplog.text)
    assert any(record.exc_info for record in caplog.records if record.levelno == logging.ERROR)
    for _ in range(100):
        if runs == 2:
            break
        await asyncio.sleep(0.05)
    assert (runs, tasks.problems(), tasks.running("flaky")) == (2, [], True)
    release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not tasks.running("flaky")  # returning ends a task
    await tasks.stop()


def test_a_traceback_is_logged_once_per_run_of_failures_and_never_for_jobpools_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A schedule another pool owns logged its whole traceback on every retry."""
    tasks = BackgroundTasks(random.Random(1))
    for _ in range(3):
        tasks.failed("bug", RuntimeError("unexpected"))
        tasks.failed("clash", ScheduleError("schedule nightly: declared by pool other"))
    traced = [(r.getMessage().split()[2], bool(r.exc_info)) for r in caplog.records]
    assert traced == [("bug", True), ("clash", False)] + [("bug", False), ("clash", False)] * 2
    tasks.healthy("bug")
    tasks.failed("bug", RuntimeError("again"))
    assert caplog.records[-1].exc_info  # a new run of failures


def test_retry_pauses_grow_to_their_cap_and_are_spread() -> None:
    rng = random.Random(7)
    pauses = [retry_pause(n, first=0.1, cap=1.0, rng=rng) for n in range(1, 200)]
    assert 0.05 <= pauses[0] <= 0.1
    assert all(0.5 <= pause <= 1.0 for pause in pauses[5:])
    assert len(set(pauses[5:])) > 100
    assert retry_pause(10**6, first=1.0, cap=30.0, rng=rng) <= 30.0


async def test_stop_cancels_again_a_task_that_lost_its_cancellation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("jobpool.worker.background.RECANCEL_EVERY", 0.05)
    tasks = BackgroundTasks(random.Random(1))
    cancellations = 0

    async def swallows_the_first() -> None:
        nonlocal cancellations
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations > 1:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    tasks.start("refresh", swallows_the_first)
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.stop(), 10)
    assert cancellations == 2
    assert not tasks.running("refresh")
    assert "background task(s) refresh did not end when cancelled; cancelling again" in (
        caplog.text)
