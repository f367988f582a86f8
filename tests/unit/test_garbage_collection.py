"""A running worker collects cyclic garbage in rarer, larger batches, and at least every second."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from jobpool.event_loop import (
    YOUNG_COLLECTION_THRESHOLD,
    collect_garbage_less_often,
    collect_young_garbage,
)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.mark.usefixtures("restored_collector")
def test_the_collector_runs_less_often_and_leaves_start_up_objects_alone() -> None:
    older = gc.get_threshold()[1:]
    collect_garbage_less_often()
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *older)
    assert gc.get_freeze_count() > 0  # the objects alive at start-up


async def test_young_cycles_are_collected_within_the_interval_however_few() -> None:
    gc.disable()  # only the periodic collection may find the cycle
    try:
        cycle = Cycle()
        gone = weakref.ref(cycle)
        del cycle
        assert gone() is not None  # a cycle: reference counting alone keeps it
        collector = asyncio.create_task(collect_young_garbage(every=0.01))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if gone() is None:
                break
        collector.cancel()
        assert gone() is None
    finally:
        gc.enable()
