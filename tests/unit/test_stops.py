"""A worker's stops without a database: which task a stop cancels, when, and the grace."""

from __future__ import annotations

import asyncio
import logging

import pytest

from jobpool.worker.config import WorkerConfig
from jobpool.worker.stops import Stops


class Slots:
    """What the worker gives `Stops`: jobs being finished, and the slots it frees."""

    def __init__(self) -> None:
        self.finishing: set[int] = set()
        self.freed: list[int] = []


def stops(slots: Slots, grace: float = 30.0) -> Stops:
    return Stops(grace=grace, finishing=slots.finishing.__contains__, abandon=slots.freed.append)


async def _wait_forever(caught: list[str], *, swallow: bool = False) -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        caught.append("first")
        if not swallow:
            raise
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        caught.append("second")
        raise


async def test_a_notification_cancels_the_named_job_and_no_other() -> None:
    slots = Slots()
    s = stops(slots)
    caught: list[str] = []
    other: list[str] = []
    stopped = asyncio.create_task(_wait_forever(caught))
    running = asyncio.create_task(_wait_forever(other))
    s.running(7, "k", stopped)
    s.running(8, "k", running)
    await asyncio.sleep(0)
    s.notified("7")
    assert s.stopping(7) and not s.stopping(8)
    with pytest.raises(asyncio.CancelledError):
        await stopped
    assert caught == ["first"] and other == [] and not running.done()
    s.finished(7)
    assert not s.stopping(7) and slots.freed == []
    running.cancel()


async def test_a_job_being_finished_or_not_running_here_is_left_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    slots = Slots()
    s = stops(slots)
    task = asyncio.create_task(_wait_forever([]))
    s.running(7, "k", task)
    slots.finishing.add(7)
    s.notified("7")
    s.notified("99")  # another worker's job
    with caplog.at_level(logging.WARNING, logger="jobpool.worker"):
        s.notified("not a job")
    await asyncio.sleep(0)
    assert not task.done() and not s.stopping(7)
    assert "names no job id: 'not a job'" in caplog.text
    task.cancel()


async def test_a_claim_the_renewal_found_gone_is_cancelled_once_and_counted_by_its_cause(
) -> None:
    slots = Slots()
    s = stops(slots)
    caught: list[str] = []
    recovered = asyncio.create_task(_wait_forever(caught, swallow=True))
    stopped = asyncio.create_task(_wait_forever([]))
    s.running(7, "k", recovered)
    s.running(8, "k", stopped)
    await asyncio.sleep(0)
    s.claim_lost(7, stopped=False)
    s.claim_lost(8, stopped=True)
    s.notified("7")  # a notification after the renewal found it: not cancelled twice
    await asyncio.sleep(0)
    assert caught == ["first"] and not recovered.done()
    assert (s.outcome(7), s.outcome(8)) == ("lost_claim", "stopped")
    recovered.cancel()


async def test_a_handler_still_running_after_the_grace_is_cancelled_again_and_its_slot_freed(
) -> None:
    slots = Slots()
    s = stops(slots, grace=0.01)
    caught: list[str] = []
    task = asyncio.create_task(_wait_forever(caught, swallow=True))
    s.running(7, "k", task)
    await asyncio.sleep(0)
    s.notified("7")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caught == ["first", "second"]
    assert slots.freed == [7]


def test_the_grace_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stop grace must be > 0 seconds, got 0"):
        Stops(grace=0, finishing=lambda _: False, abandon=lambda _: None)
    with pytest.raises(ValueError, match="stop_grace must be > 0 seconds, got -1"):
        WorkerConfig(stop_grace=-1)
