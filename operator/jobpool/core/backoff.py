"""Retry backoff: exponential with a cap and bounded jitter."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


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
