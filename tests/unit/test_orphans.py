"""A worker process whose parent (`jobpool run --processes`, a local pool) is gone stops."""

from __future__ import annotations

import asyncio
import os

from jobpool.worker.processes import stop_when_orphaned


async def test_a_parent_gone_before_the_watch_started_stops_the_process_at_once() -> None:
    """The parent's pid comes from the parent: one killed while this process was still
    starting (its pid read then would be init's) is not missed."""
    stopped: list[bool] = []
    gone = os.getppid() + 1_000_000  # not this process's parent: as if that one had died
    await asyncio.wait_for(stop_when_orphaned(lambda: stopped.append(True), gone), 5)
    assert stopped == [True]


async def test_a_live_parent_is_watched_without_stopping() -> None:
    stopped: list[bool] = []
    watch = asyncio.create_task(stop_when_orphaned(lambda: stopped.append(True), os.getppid()))
    await asyncio.sleep(0.05)
    assert not watch.done() and stopped == []
    watch.cancel()
