"""How many jobs a worker's claim takes: its free slots plus the room in its prefetch buffer.

The buffer holds claimed jobs that wait for a slot of this worker, so that a freed slot
starts the next job without waiting for a claim, and the next claim's round trip overlaps
the jobs still buffered. How much it holds follows the rate the worker's slots start jobs
at: about what they start in `LOOKAHEAD` seconds, never more than the worker's `prefetch`
(its bound, `JOBPOOL_PREFETCH`). Jobs of milliseconds get a buffer that covers a claim's
round trip; jobs of seconds get none, so none is claimed only to wait behind them.
"""

from __future__ import annotations

LOOKAHEAD = 0.05
"""Seconds of the slots' work the buffer holds at most (at the rate they start jobs): a few
claim round trips, so that the next claim, sent at the low-water mark, is back before the
buffer runs dry."""

RATE_WEIGHT = 0.5
"""Weight of the latest claim round in the smoothed start rate (`observed_rate`)."""


def observed_rate(previous: float, started: int, elapsed: float) -> float:
    """The start rate (jobs/s), smoothed over claim rounds: `previous` rate, `started` jobs
    since the last round, `elapsed` seconds since it. A round that took no time keeps the
    previous rate."""
    if elapsed <= 0:
        return previous
    return previous + RATE_WEIGHT * (started / elapsed - previous)


LONGEST_BUFFERED = 0.25
"""Seconds a job may take (on average) for the worker to buffer jobs behind it: a buffered job
can wait for a slot about as long as the jobs running in them take, and one that waits a
second (the producer's `BUFFER_WAIT`) is handed back, a write and a wake-up of every idle
worker for nothing."""


def buffer_room(rate: float, prefetch: int, busy: int) -> int:
    """Jobs the buffer may hold now: what the slots start in `LOOKAHEAD` seconds at `rate`
    (jobs/s), at most `prefetch` (0: no buffer); none while the `busy` slots' jobs take
    longer than `LONGEST_BUFFERED` seconds each (busy / rate, by Little's law)."""
    if rate <= 0 or busy > rate * LONGEST_BUFFERED:
        return 0
    return max(0, min(prefetch, int(rate * LOOKAHEAD)))


FIRST_ROOM = 128
"""Jobs the buffer may hold at the first claim, before any pace is known (`first_room`)."""


def first_room(prefetch: int) -> int:
    """Jobs the buffer may hold at the first claim: `prefetch`, at most `FIRST_ROOM`. A fast
    drain's first claim needs no more (the room grows with the measured pace from the next
    claim on), and a worker whose handlers run long holds them for a second, then hands
    them back (the producer's `BUFFER_WAIT`)."""
    return min(prefetch, FIRST_ROOM)


def low_water(room: int) -> int:
    """Buffered jobs at or below which the loop claims again while its slots are busy: half
    the buffer's room, so that the next claim's round trip overlaps the start of the other
    half."""
    return room // 2


def claim_limit(*, slots: int, busy: int, buffered: int, room: int, sending: bool) -> int:
    """Jobs the next claim may take: the free slots plus the `room` left in the buffer. With
    no slot free (every slot running or promised to a buffered job) the buffer is refilled
    only while jobs flow, i.e. while `done`s are `sending`: a worker whose handlers all run
    long claims nothing more to wait behind them."""
    free = max(slots - busy - buffered, 0)
    if free == 0 and not sending:
        return 0
    return max(slots + room - busy - buffered, 0)
