"""The retry decision: what a failed attempt leads to, how long it waits, what it records.

One pure function, `decide_retry`, turns a failed attempt (the job's attempt counts, the
exception its handler raised, the kind's backoff policy) into `Retry(delay, error)` or
`DeadLetter(error)`; the worker only carries the decision out. `retry_pause` is the shorter,
unbounded backoff of the worker's own infrastructure (reconnecting, restarting a task).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from jobpool.core.jsondata import storable_text
from jobpool.errors import PermanentError, RetryAfter

LAST_ERROR_LIMIT = 4000
"""Characters kept of an error message in `aa_job.last_error` (the column allows 4096)."""


@dataclass(frozen=True)
class BackoffPolicy:
    """How long a failed job waits before its next attempt.

    base: delay after the first attempt, seconds (default 30 s).
    max_delay: cap on the exponential part, seconds (default 24 h).
    jitter: fraction of the capped delay added at random, 0..1 (default 10 %).
    Raises ValueError for a negative base, a cap below the base, or jitter outside 0..1.
    """

    base: float = 30.0
    max_delay: float = 86_400.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (self.base >= 0 and math.isfinite(self.base)):
            raise ValueError(f"backoff base must be a finite number >= 0, got {self.base!r}")
        if not (self.max_delay >= self.base and math.isfinite(self.max_delay)):
            raise ValueError(
                f"backoff max_delay must be finite and >= base ({self.base}), "
                f"got {self.max_delay!r}"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be between 0 and 1, got {self.jitter!r}")


@dataclass(frozen=True)
class Retry:
    """Back to pending, runnable again after `delay` seconds; `error` goes to last_error."""

    delay: float
    error: str


@dataclass(frozen=True)
class DeadLetter:
    """Parked in the DLQ for an admin to replay or discard; `error` goes to last_error."""

    error: str


RetryDecision = Retry | DeadLetter


def decide_retry(
    *, attempts: int, max_attempts: int, exc: BaseException, policy: BackoffPolicy,
    rng: random.Random,
) -> RetryDecision:
    """What the failed attempt numbered `attempts` (1-based, claims so far including this
    one) of a job allowed `max_attempts` leads to.

    PermanentError: the DLQ at once, since retrying cannot help. Out of attempts: the DLQ,
    also for RetryAfter, so that a handler cannot retry forever. Else a retry after
    RetryAfter's own delay, or after `backoff_delay` of `policy` (jitter drawn from `rng`).
    The error recorded is `error_text(exc)`, made storable and cut to LAST_ERROR_LIMIT.
    """
    error = truncate_error(error_text(exc))
    if isinstance(exc, PermanentError) or attempts >= max_attempts:
        return DeadLetter(error)
    if isinstance(exc, RetryAfter):
        return Retry(exc.delay, error)
    return Retry(backoff_delay(attempts, policy, rng), error)


def backoff_delay(attempts: int, policy: BackoffPolicy, rng: random.Random) -> float:
    """Seconds to wait after the attempt numbered `attempts` (1-based) failed.

    delay(a) = min(base * 2^(a-1), max_delay) + uniform(0, jitter * that); never overflows,
    whatever `attempts` is (values below 1 count as 1).
    """
    exponent = min(max(attempts, 1) - 1, 1023)
    if exponent >= 64:
        capped = policy.max_delay
    else:
        capped = min(policy.base * 2.0**exponent, policy.max_delay)
    return capped + rng.uniform(0.0, policy.jitter * capped)


def retry_pause(failures: int, *, first: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after `failures` failed tries in a row of something that may work again
    any moment (reaching the database, restarting a background task).

    first * 2^(failures-1), capped at `cap`, times uniform(0.5, 1): the pause stays short while
    the outage is short, and processes that failed together do not retry in step.
    """
    exponent = min(max(failures, 1) - 1, 64)
    return min(first * 2.0**exponent, cap) * rng.uniform(0.5, 1.0)


def error_text(exc: BaseException) -> str:
    """`Type: message` of `exc`, also when its str() raises."""
    return f"{type(exc).__name__}: {safe_str(exc, what='its message')}"


def safe_str(value: object, *, what: str = "its text") -> str:
    """str(value), or "(<what> could not be built: <Type>)" when that raises anything.

    Anything includes SystemExit, KeyboardInterrupt and CancelledError: the value comes from
    a handler (its exception, its result), and formatting it must fail only its own job,
    never stop the worker that formats it.
    """
    try:
        return str(value)
    except BaseException as inner:  # a handler's object raised it, not a real exit
        return f"({what} could not be built: {type(inner).__name__})"


def truncate_error(error: str, limit: int = LAST_ERROR_LIMIT) -> str:
    """`error` made storable (`storable_text`: NUL, control characters and lone surrogates
    escaped, so the real message is kept whatever a handler or a receiver put in it), cut to
    `limit` characters with the cut marked `…[truncated]`."""
    text = storable_text(error)
    if len(text) <= limit:
        return text
    marker = " …[truncated]"
    return text[: limit - len(marker)] + marker
