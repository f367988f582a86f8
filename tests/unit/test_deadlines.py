"""Handler deadlines: one timer for every running handler (worker/deadlines.py)."""

from __future__ import annotations

import asyncio

import pytest

from jobpool.worker.deadlines import Deadlines


async def _run(deadlines: Deadlines, seconds: float, work: asyncio.Event) -> str:
    """What a handler under a deadline of `seconds` ends with while it waits for `work`."""
    deadline = deadlines.arm(seconds)
    try:
        await work.wait()
    except asyncio.CancelledError:
        if deadlines.finish(deadline):
            return "timed out"
        raise
    finally:
        deadlines.finish(deadline)
    return "done"


async def test_a_handler_past_its_deadline_is_cancelled_as_a_timeout() -> None:
    deadlines = Deadlines()
    assert await _run(deadlines, 0.01, asyncio.Event()) == "timed out"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_handler_that_ends_in_time_is_never_cancelled() -> None:
    deadlines, work = Deadlines(), asyncio.Event()
    work.set()
    assert await _run(deadlines, 0.01, work) == "done"
    await asyncio.sleep(0.05)  # past the deadline: its timer finds nothing to cancel
    assert not deadlines._groups


async def test_a_shorter_timeout_armed_later_fires_first() -> None:
    deadlines, work = Deadlines(), asyncio.Event()
    long = asyncio.create_task(_run(deadlines, 3600.0, work))
    await asyncio.sleep(0)
    short = asyncio.create_task(_run(deadlines, 0.01, work))
    assert await short == "timed out"
    assert not long.done()
    work.set()
    assert await long == "done"


async def test_handlers_of_one_timeout_expire_in_start_order_after_the_first_ends() -> None:
    deadlines = Deadlines()
    first_work, other_work = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(_run(deadlines, 0.05, first_work))
    await asyncio.sleep(0)
    second = asyncio.create_task(_run(deadlines, 0.05, other_work))
    third = asyncio.create_task(_run(deadlines, 0.05, other_work))
    await asyncio.sleep(0)
    first_work.set()  # the earliest deadline goes: the timer armed for it must find the next
    assert await first == "done"
    assert await second == "timed out"
    assert await third == "timed out"


async def test_another_cancellation_is_not_taken_for_the_timeout() -> None:
    deadlines = Deadlines()
    task = asyncio.create_task(_run(deadlines, 0.01, asyncio.Event()))
    await asyncio.sleep(0)
    task.cancel()  # a stop or the end of the grace period, at the same time as the deadline
    await asyncio.sleep(0.05)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_infinite_timeout_arms_no_timer() -> None:
    deadlines, work = Deadlines(), asyncio.Event()
    task = asyncio.create_task(_run(deadlines, float("inf"), work))
    await asyncio.sleep(0)
    assert deadlines._timer is None
    work.set()
    assert await task == "done"


def test_arming_outside_a_task_is_refused() -> None:
    with pytest.raises(RuntimeError, match="running"):
        Deadlines().arm(1.0)
