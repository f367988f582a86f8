"""Handler timeouts of one worker: one loop timer for every running handler, not one each.

`asyncio.timeout` arms a loop timer per job and cancels it again, which at full speed costs a
worker more CPU per no-op job than running the handler does. Handlers with the same timeout
reach their deadlines in the order they started, so the deadlines are kept in one
insertion-ordered group per timeout: a group's first entry is its earliest, a handler that
ends leaves its group at once, and a single timer is armed for the earliest first entry of
all groups. When it fires, the handlers past their deadline are cancelled and their
`Deadline` marked expired, which the executor turns into the TimeoutError a timeout raises.
"""

from __future__ import annotations

import asyncio
import itertools
import math

EARLY = 0.001
"""Seconds a timer may fire before the deadline it was armed for and still count it as
reached (event loops round their timers)."""


class Deadline:
    """The deadline of one running handler (`Deadlines.arm`): `when` in the loop's time
    (seconds), the task it cancels, and whether it did (`expired`)."""

    __slots__ = ("expired", "key", "seconds", "settled", "task", "when")

    def __init__(self, key: int, seconds: float, when: float, task: asyncio.Task[object]) -> None:
        self.key = key
        self.seconds = seconds
        self.when = when
        self.task = task
        self.expired = False
        self.settled = False


class Deadlines:
    """The deadlines of the handlers running on one event loop."""

    def __init__(self) -> None:
        self._groups: dict[float, dict[int, Deadline]] = {}
        self._keys = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def arm(self, seconds: float) -> Deadline:
        """Cancel the current task `seconds` from now unless `finish`ed before (an infinite
        `seconds` never cancels it). Raises RuntimeError outside a task."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a running task")
        loop = task.get_loop()
        deadline = Deadline(next(self._keys), seconds, loop.time() + seconds, task)
        group = self._groups.get(seconds)
        if group is None:
            group = self._groups[seconds] = {}
        group[deadline.key] = deadline
        if deadline.when < self._timer_at:
            self._arm_timer(loop, deadline.when)
        return deadline

    def finish(self, deadline: Deadline) -> bool:
        """The handler under `deadline` ended (returned, raised, or was cancelled): forget
        its deadline. True when the deadline had cancelled it and nothing else is cancelling
        its task, i.e. its CancelledError is the timeout's (its cancellation request is
        withdrawn then, as `asyncio.timeout` does). May be called more than once."""
        group = self._groups.get(deadline.seconds)
        if group is not None and group.pop(deadline.key, None) is not None and not group:
            del self._groups[deadline.seconds]
        if not deadline.expired or deadline.settled:
            return False
        deadline.settled = True
        return deadline.task.uncancel() == 0

    def _arm_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(when, self._expire, loop), when

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel every handler past its deadline; arm the timer for the next deadline."""
        self._timer, self._timer_at = None, math.inf
        now = loop.time() + EARLY
        earliest = math.inf
        for seconds, group in list(self._groups.items()):
            while group:
                deadline = next(iter(group.values()))
                if deadline.when > now:
                    earliest = min(earliest, deadline.when)
                    break
                del group[deadline.key]
                deadline.expired = True
                deadline.task.cancel()
            if not group:
                del self._groups[seconds]
        if earliest < math.inf:
            self._arm_timer(loop, earliest)
