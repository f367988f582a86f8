"""The event loop the `jobpool` command runs its coroutines on.

uvloop's loop where it is installed (the worker extra brings it, except on Windows, where
uvloop does not exist): a worker spent about 7 % less CPU per job on it than on
asyncio's own loop, whose scheduling of tasks, callbacks and timers is a large part of a
worker's work per job (bench/RESULTS.md, "The worker's CPU per job"). Without uvloop,
asyncio's own loop runs everything the same way.

A wait with a time limit is `async with asyncio.timeout(...)`, never `asyncio.wait_for`: on
Python 3.11 `wait_for` runs the awaited wait as a task of its own, and a cancellation that
arrives just as that wait completes is lost (`wait_for` returns the result), so a loop that
waits again runs on; the operator's loop did so when it was stopped while a watch event woke
it, and its process never ended. Python 3.12 builds `wait_for` on `timeout`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from jobpool.core.shutdown import LEFT_TASKS_WAIT

T = TypeVar("T")

log = logging.getLogger("jobpool")


YOUNG_COLLECTION_THRESHOLD = 10_000
"""Container objects allocated (net of those freed) before the collector looks at the youngest
generation; Python's default is 700."""
YOUNG_COLLECTION_EVERY = 1.0
"""Seconds between the collections `collect_young_garbage` makes, however few objects were
allocated."""


def collect_garbage_less_often() -> None:
    """Tune the cyclic garbage collector for a long-running worker; call once it has started,
    and run `collect_young_garbage` beside it.

    A worker allocates a few container objects per job (the claimed row, the job, its task
    and coroutine) that reference counting frees within milliseconds. At Python's default
    threshold the collector ran about 1,500 times in a drain of 60,000 no-op jobs and took
    about 15 % of the worker's CPU, scanning the claimed jobs that wait in the buffer over
    and over; at `YOUNG_COLLECTION_THRESHOLD` it ran about a dozen times (bench/RESULTS.md,
    "Garbage collection"). The objects alive at this point (modules, classes, what start-up
    built) are frozen first, once start-up's garbage is collected: most live as long as the
    process, and the rare full collections need not scan them.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


async def collect_young_garbage(every: float = YOUNG_COLLECTION_EVERY) -> None:
    """Collect the two younger generations every `every` seconds, until cancelled.

    The threshold counts objects, not bytes: a cycle of a few objects can hold megabytes
    (an exception a handler keeps references its traceback, whose frames hold their locals,
    a payload among them), and a few such cycles count for little towards 10,000 objects.
    This bounds the time cyclic garbage waits instead: about one second's worth of it,
    whatever its size. At the raised threshold a young collection took 2-4 ms in a busy
    worker (bench/RESULTS.md, "Garbage collection").
    """
    while True:
        await asyncio.sleep(every)
        gc.collect(1)


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

    runner = asyncio.Runner(loop_factory=loop_factory())
    try:
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
    finally:
        _close(runner)


def _close(runner: asyncio.Runner) -> None:
    """Close `runner` as `asyncio.Runner.close` does, but with a bound: the tasks left are
    cancelled and waited for `LEFT_TASKS_WAIT` seconds, and those that ignore their
    cancellation (a handler the worker gave up on) are left behind with the closed loop.
    asyncio would wait for them as long as they run, and the command would not exit."""
    loop = runner.get_loop()
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=LEFT_TASKS_WAIT))
    for t in left:
        if t.done() and not t.cancelled() and t.exception() is not None:
            loop.call_exception_handler({"message": "unhandled exception during shutdown",
                                         "exception": t.exception(), "task": t})
    stuck = [t for t in left if not t.done()]
    if not stuck:
        runner.close()
        return
    log.error("%d task(s) did not end after their cancellation (%s): exiting without them",
              len(stuck), ", ".join(sorted(t.get_name() for t in stuck)))
    loop.close()
