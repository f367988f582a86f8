"""Waiting for a database that does not answer: the one reconnect loop of workers and the API.

`until_answered` tries `attempt` until it works. A try that finds the database unreachable
(psycopg.OperationalError) or not migrated yet (SchemaNotMigratedError) is reported and
tried again after a pause that grows from `RECONNECT_FIRST` to `RECONNECT_MAX` seconds,
jittered (`jobpool.core.retry.retry_pause`): short while the outage is short, a second at
most once it answers again, and processes that lost it together do not retry in step. While
the database stays away a line is logged every `STILL_DOWN_LOG_EVERY` seconds, not one per
try. Anything else `attempt` raises ends the wait (the caller decides).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from jobpool.core.retry import retry_pause
from jobpool.errors import SchemaNotMigratedError

T = TypeVar("T")

RECONNECT_FIRST = 0.1
"""Seconds between the first tries at a database that stopped answering."""

RECONNECT_MAX = 1.0
"""Cap on the pause between tries, seconds: work resumes within about this long after the
database answers again."""

PROBE_TIMEOUT = 10.0
"""Seconds a probe (or opening a fresh pool) may take before it counts as failed."""

STILL_DOWN_LOG_EVERY = 30.0
"""Seconds between log lines while the database stays unreachable."""

AWAY = (psycopg.OperationalError, SchemaNotMigratedError)
"""What a try raises when the database is away for now: tried again."""


def away_reason(exc: BaseException) -> str:
    """What /readyz says while the database is away with `exc`."""
    return (f"database unreachable: {exc}" if isinstance(exc, psycopg.OperationalError)
            else str(exc))


async def until_answered(
    attempt: Callable[[int], Awaitable[T]], *, rng: random.Random, log: logging.Logger,
    report: Callable[[str], None], failures: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`await attempt(failures)` until it returns, its result; `failures`: failed tries so
    far (a caller that waits again after a failure of its own passes it on, so the next
    try knows the database was away).

    Each failed try is reported (`report(reason)`, see `away_reason`) and logged on `log`
    (the first, then every `STILL_DOWN_LOG_EVERY` seconds); once it answers after failures,
    how long that took is logged. Raises whatever `attempt` raises other than `AWAY`.
    """
    lost_at = logged = clock()
    tried = failures
    while True:
        try:
            result = await attempt(failures)
        except AWAY as exc:
            failures += 1
            reason = away_reason(exc)
            report(reason)
            now = clock()
            if failures == tried + 1 or now - logged >= STILL_DOWN_LOG_EVERY:
                logged = now
                log.warning("%s; trying again (%.0fs so far)", reason, now - lost_at)
            await asyncio.sleep(retry_pause(failures, first=RECONNECT_FIRST, cap=RECONNECT_MAX,
                                            rng=rng))
            continue
        if failures > tried:
            log.info("database answers after %.1fs", clock() - lost_at)
        return result
