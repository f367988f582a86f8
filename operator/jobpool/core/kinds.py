"""Per-kind defaults: priority, attempts, stale TTL, backoff and timeout."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jobpool.core.retry import BackoffPolicy

KIND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

DEFAULT_PRIORITY = 100
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_STALE_TTL = 15 * 60.0
"""Seconds; the spec's recovery interval, used for any kind that sets none."""
DEFAULT_TIMEOUT = 30 * 60.0

HEAVY_KINDS = frozenset({"index_sync", "gin_backfill"})
"""Online index builds: long, low priority, few attempts; served by a lane of their own."""


MIN_SECONDS = 0.001
MAX_SECONDS = 10 * 365 * 86400.0
"""Bounds of `stale_ttl` and `timeout`: PostgreSQL's interval holds neither 0 (a microsecond
rounds away below it) nor infinity, and beyond ten years a bound bounds nothing."""


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
        for name, value, low, high in (("priority", self.priority, -32768, 32767),
                                       ("max_attempts", self.max_attempts, 1, 2**31 - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, "
                                 f"got {value!r}")
        for name, seconds in (("stale_ttl", self.stale_ttl), ("timeout", self.timeout)):
            if not MIN_SECONDS <= seconds <= MAX_SECONDS:
                raise ValueError(f"{name} must be from {MIN_SECONDS:g} to {MAX_SECONDS:g} "
                                 f"seconds, got {seconds!r}")


_HEAVY = KindDefaults(
    priority=200, max_attempts=3, stale_ttl=2 * 3600.0, timeout=6 * 3600.0,
    backoff=BackoffPolicy(base=60.0, max_delay=3600.0),
)

BUILTIN_DEFAULTS: dict[str, KindDefaults] = {
    "email_send": KindDefaults(stale_ttl=5 * 60.0, timeout=60.0),
    "cleanup_jobs": KindDefaults(max_attempts=3, stale_ttl=10 * 60.0, timeout=5 * 60.0),
    "bulk_import": KindDefaults(stale_ttl=3600.0, timeout=4 * 3600.0),
    "reindex": KindDefaults(priority=150, stale_ttl=3600.0, timeout=4 * 3600.0),
    "outbox_dispatch": KindDefaults(stale_ttl=5 * 60.0, timeout=120.0),
    "virus_scan": KindDefaults(stale_ttl=15 * 60.0, timeout=10 * 60.0),
    "index_sync": _HEAVY,
    "gin_backfill": _HEAVY,
}
"""The spec's per-kind defaults; a registration may override any of them."""


def defaults_for(kind: str) -> KindDefaults:
    """The built-in defaults of `kind`, or the generic ones for a kind the platform adds."""
    return BUILTIN_DEFAULTS.get(kind, KindDefaults())


def check_kind_name(name: str) -> str:
    """Return `name` if it is a valid kind name (lower-case identifier), else raise ValueError."""
    if not KIND_NAME.fullmatch(name):
        raise ValueError(
            f"invalid job kind name {name!r}: use lower-case letters, digits and '_', "
            "starting with a letter, at most 63 characters"
        )
    return name
