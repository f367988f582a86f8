"""A worker's background tasks (listener, lease renewal, limits refresh, ...), supervised.

A task that raises is logged with its traceback, shown as a readiness problem and started
again after a pause that grows with its failures in a row (1 s doubling to 30 s), so an
unexpected exception never ends a task silently. A task that returns has finished its work.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

from jobpool.core.retry import error_text, retry_pause
from jobpool.errors import JobpoolError

log = logging.getLogger("jobpool.worker")

RESTART_FIRST = 1.0
"""Seconds before a task that failed once is started again."""

RESTART_MAX = 30.0
"""Cap on the pause before a restart, seconds."""

RECANCEL_EVERY = 1.0
"""Seconds a stopping task has to end after its cancellation before it is cancelled again."""


class BackgroundTasks:
    """Named tasks of one worker, each restarted whenever it raises.

    A task calls `healthy(name)` after each round of work that succeeded: that clears its
    readiness problem and its count of failures in a row.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.failing: dict[str, str] = {}
        self._failures: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `run()` as task `name` under supervision, unless `name` is running already."""
        task = self._tasks.get(name)
        if task is None or task.done():
            self._tasks[name] = asyncio.create_task(self._supervise(name, run), name=name)

    def running(self, name: str) -> bool:
        """Whether task `name` is running (or waiting to be restarted)."""
        task = self._tasks.get(name)
        return task is not None and not task.done()

    def healthy(self, name: str) -> None:
        """Task `name` completed a round of its work."""
        self._failures.pop(name, None)
        if self.failing.pop(name, None) is not None:
            log.info("background task %s works again", name)

    def failed(self, name: str, exc: BaseException) -> float:
        """Record a failure of task `name` (log and readiness); return the pause before retrying."""
        failures = self._failures.get(name, 0) + 1
        self._failures[name] = failures
        self.failing[name] = error_text(exc)  # also when the exception's str() raises
        pause = retry_pause(failures, first=RESTART_FIRST, cap=RESTART_MAX, rng=self.rng)
        # a traceback only where it helps: a bug or a library's error, once per run of
        # failures (jobpool's own errors name the problem, e.g. a schedule another pool owns)
        traceback = failures == 1 and not isinstance(exc, JobpoolError)
        log.error("background task %s failed (%s); restarting it in %.1fs",
                  name, self.failing[name], pause, exc_info=exc if traceback else None)
        return pause

    def problems(self) -> list[str]:
        """Readiness problems: one per failing task, naming it and its last error."""
        return [f"background task {name} failing: {error}"
                for name, error in sorted(self.failing.items())]

    async def stop(self) -> None:
        """Cancel every task and wait for them to end.

        A task still running `RECANCEL_EVERY` seconds after its cancellation is cancelled
        again: a cancellation can be lost below us (a library that turns it into an error the
        task handles, or that drops it while handing over a connection), and a worker that
        never ends its shutdown would hold its pod until it is killed."""
        tasks = list(self._tasks.values())
        while pending := [task for task in tasks if not task.done()]:
            for task in pending:
                task.cancel()
            _, still = await asyncio.wait(pending, timeout=RECANCEL_EVERY)
            if still:
                log.warning("background task(s) %s did not end when cancelled; cancelling "
                            "again", ", ".join(sorted(task.get_name() for task in still)))
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    async def _supervise(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            try:
                await run()
            except Exception as exc:
                await asyncio.sleep(self.failed(name, exc))
            else:
                self.healthy(name)
                return
