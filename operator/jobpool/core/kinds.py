"""Kind names and the defaults a kind's declaration starts from.

Each kind declares its own defaults on `@jobpool.kind(...)`; KindDefaults holds the values
of any option a declaration leaves out.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field, replace
from typing import Any

from jobpool.core.retry import BackoffPolicy

KIND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

DEFAULT_PRIORITY = 100
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_STALE_TTL = 15 * 60.0
"""Seconds; the recovery interval of any kind that sets none."""
DEFAULT_TIMEOUT = 30 * 60.0

BUILTIN_KINDS = frozenset({
    "bulk_import", "cleanup_jobs", "email_send", "gin_backfill", "index_sync",
    "outbox_dispatch", "reindex", "virus_scan",
})
"""Names of the kinds `jobpool.kinds` declares (each with its defaults, on its decorator),
for what must know them without importing handlers: the pool spec's warnings about kinds no
lane serves, and `jobpool migrate`, which registers them (`jobpool.kinds.<name>`)."""

HEAVY_KINDS = frozenset({"index_sync", "gin_backfill"})
"""Online index builds: long, low priority, few attempts; served by a lane of their own."""


MIN_SECONDS = 0.001
MAX_SECONDS = 10 * 365 * 86400.0
"""Bounds of `stale_ttl` and `timeout`: PostgreSQL's interval holds neither 0 (a microsecond
rounds away below it) nor infinity, and beyond ten years a bound bounds nothing."""


PRIORITY_RANGE = (-32768, 32767)
"""A job's priority: the column is a smallint."""
MAX_ATTEMPTS_RANGE = (1, 2**31 - 1)
"""A job's max_attempts: the column is an integer."""


def check_whole(name: str, value: int | None, low: int, high: int) -> None:
    """Refuse a number its column cannot hold, naming `name` (None passes); bools and floats
    too, which PostgreSQL would refuse with an error that aborts the caller's transaction."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r:.80}")


@dataclass(frozen=True)
class KindDefaults:
    """Defaults a kind's jobs get unless the enqueue says otherwise.

    priority: lower runs first (smallint). max_attempts: claims before the DLQ (>= 1).
    stale_ttl: seconds without a lease renewal before recovery takes the claim back.
    timeout: seconds a handler may run before it is cancelled and retried.
    Raises ValueError for out-of-range values.
    """

    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    stale_ttl: float = DEFAULT_STALE_TTL
    timeout: float = DEFAULT_TIMEOUT
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)

    def __post_init__(self) -> None:
        check_whole("priority", self.priority, *PRIORITY_RANGE)
        check_whole("max_attempts", self.max_attempts, *MAX_ATTEMPTS_RANGE)
        for name, seconds in (("stale_ttl", self.stale_ttl), ("timeout", self.timeout)):
            if not MIN_SECONDS <= seconds <= MAX_SECONDS:
                raise ValueError(f"{name} must be from {MIN_SECONDS:g} to {MAX_SECONDS:g} "
                                 f"seconds, got {seconds!r}")


def kind_defaults(
    name: str, *, priority: int | None = None, max_attempts: int | None = None,
    stale_ttl: float | None = None, timeout: float | None = None,
    backoff_base: float | None = None, backoff_max: float | None = None,
    backoff_jitter: float | None = None,
) -> KindDefaults:
    """The defaults kind `name` declares: the options given, and `KindDefaults()`'s for those
    left None. Units as on `@jobpool.kind`: seconds, the jitter a fraction 0..1. Raises
    ValueError naming the kind and the option that is out of range (a whole number given as
    1.5 is refused, not cut)."""
    generic = KindDefaults()
    backoff = {"base": backoff_base, "max_delay": backoff_max, "jitter": backoff_jitter}
    try:
        given: dict[str, Any] = {
            "priority": priority, "max_attempts": max_attempts,
            "stale_ttl": _number("stale_ttl", stale_ttl), "timeout": _number("timeout", timeout),
        }
        return replace(
            generic, backoff=replace(generic.backoff, **{
                key: _seconds(f"backoff {key}", value) for key, value in backoff.items()
                if value is not None}),
            **{key: value for key, value in given.items() if value is not None})
    except ValueError as exc:
        raise ValueError(f"job kind {name!r}: {exc}") from None


def _number(name: str, value: Any) -> float | None:
    """`value` (a number of seconds, or a fraction) as a float; None stays None. Raises
    ValueError for anything else: `float()` would take the text "10", and a bool."""
    return None if value is None else _seconds(name, value)


def _seconds(name: str, value: Any) -> float:
    """`_number` of a value given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r:.40} "
                         f"({type(value).__name__})")
    return float(value)


def check_kind_name(name: str) -> str:
    """Return `name` if it is a valid kind name (lower-case identifier), else raise ValueError."""
    if not KIND_NAME.fullmatch(name):
        raise ValueError(
            f"invalid job kind name {name[:80]!r}: use lower-case letters, digits and '_', "
            "starting with a letter, at most 63 characters"
        )
    return name
