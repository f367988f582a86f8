"""The event loop the `jobpool` command runs its coroutines on.

uvloop's loop where it is installed (the worker extra brings it, except on Windows, where
uvloop does not exist): a worker spent about 7 % less CPU per job on it than on
asyncio's own loop, whose scheduling of tasks, callbacks and timers is a large part of a
worker's work per job (bench/RESULTS.md, "The worker's CPU per job"). Without uvloop,
asyncio's own loop runs everything the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("jobpool")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's `new_event_loop` where uvloop is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on a new event loop (`loop_factory`), as `asyncio.run` does, and
    return its result (or raise its exception).

    A job's handler runs on this loop and may stop it (`loop.stop()`): asyncio would then
    end the command half way, its running jobs left to lease expiry. Instead the loop is
    started again at once and `main` runs on, with an error logged each time.
    """
    task: asyncio.Task[T] | None = None

    async def tracked() -> T:
        nonlocal task
        task = asyncio.current_task()
        return await main

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        try:
            return runner.run(tracked())
        except RuntimeError:
            if task is None or task.done():
                raise
        while True:  # the loop was stopped under `main`
            log.error("something running on the event loop stopped it (a handler calling "
                      "loop.stop()?); started it again")
            try:
                return runner.get_loop().run_until_complete(task)
            except RuntimeError:
                if task.done():
                    raise
