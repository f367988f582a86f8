"""Token buckets per (tenant, kind) and per provider (spec "Rate-Limiting").

A bucket holds up to `burst` tokens and gains `rps` tokens per second. A job may start when
every bucket it needs (its tenant's limit for its kind, and its kind's provider cap) holds a
whole token; then one token is taken from each. Otherwise nothing is taken and the job waits
`retry_after` seconds, the time until every needed bucket holds a token again.

Pure: callers pass `now` (seconds on a monotonic clock) and store the buckets returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

WILDCARD_KIND = "*"
"""Key in a tenant's `rate_limit` object that limits every kind without its own entry."""

LimitScope = Literal["tenant", "provider"]


@dataclass(frozen=True)
class RateLimit:
    """Sustained `rps` tokens per second (> 0), at most `burst` (>= 1) saved up."""

    rps: float
    burst: int

    def __post_init__(self) -> None:
        if not (isinstance(self.rps, int | float) and math.isfinite(self.rps) and self.rps > 0):
            raise ValueError(f"rps must be a number > 0, got {self.rps!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"burst must be an integer >= 1, got {self.burst!r}")


def parse_rate_limit(raw: Any, where: str) -> RateLimit:
    """A RateLimit from `{"rps": r, "burst": b}`; burst defaults to ceil(rps).

    Raises ValueError naming `where` (e.g. `providers.ses`) and the bad field.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object {{rps, burst}}, got {raw!r}")
    unknown = sorted(set(raw) - {"rps", "burst"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: rps, burst)")
    rps = raw.get("rps")
    if isinstance(rps, bool) or not isinstance(rps, int | float):
        raise ValueError(f"{where}.rps: expected a number > 0, got {rps!r}")
    burst = raw.get("burst", max(1, math.ceil(rps)) if math.isfinite(rps) else 1)
    if isinstance(burst, float) and burst.is_integer():
        burst = int(burst)
    try:
        return RateLimit(float(rps), burst)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class TokenBucket:
    """Tokens saved up at monotonic time `updated` (seconds)."""

    tokens: float
    updated: float


def full_bucket(limit: RateLimit, now: float) -> TokenBucket:
    """A new bucket starts full: a quiet tenant may burst at once."""
    return TokenBucket(float(limit.burst), now)


def refill(bucket: TokenBucket, limit: RateLimit, now: float) -> TokenBucket:
    """The bucket at `now`: gained rps * elapsed tokens, capped at burst."""
    elapsed = max(0.0, now - bucket.updated)
    return TokenBucket(min(float(limit.burst), bucket.tokens + elapsed * limit.rps),
                       max(now, bucket.updated))


def wait_for_token(bucket: TokenBucket, limit: RateLimit, now: float) -> float:
    """Seconds from `now` until the bucket holds a whole token (0 when it does)."""
    tokens = refill(bucket, limit, now).tokens
    return 0.0 if tokens >= 1.0 else (1.0 - tokens) / limit.rps


@dataclass(frozen=True)
class Need:
    """One bucket a job draws from: its key, limit, current state (None: not yet used)."""

    key: str
    scope: LimitScope
    limit: RateLimit
    bucket: TokenBucket | None


@dataclass(frozen=True)
class Granted:
    """The job may start; store `buckets` (one token taken from each)."""

    buckets: Mapping[str, TokenBucket]


@dataclass(frozen=True)
class Denied:
    """No token: requeue the job for `retry_after` seconds; `scope` names the empty bucket.

    Nothing was taken from any bucket.
    """

    retry_after: float
    scope: LimitScope


Decision = Granted | Denied


def take_token(needs: Sequence[Need], now: float) -> Decision:
    """Take one token from every needed bucket, or none if any of them is empty.

    retry_after is the longest wait among the empty buckets; scope is the bucket that
    waits longest (tenant first on a tie).
    """
    current = {need.key: _current(need, now) for need in needs}
    waits = [(wait_for_token(current[n.key], n.limit, now), n.scope) for n in needs]
    longest = max(waits, key=lambda item: item[0], default=(0.0, "tenant"))
    if longest[0] > 0:
        return Denied(retry_after=longest[0], scope=longest[1])
    return Granted({key: TokenBucket(b.tokens - 1.0, b.updated) for key, b in current.items()})


def wait_time(needs: Sequence[Need], now: float) -> float:
    """Seconds until a job with these needs could start (0: now)."""
    return max((wait_for_token(_current(n, now), n.limit, now) for n in needs), default=0.0)


def _current(need: Need, now: float) -> TokenBucket:
    if need.bucket is None:
        return full_bucket(need.limit, now)
    return refill(need.bucket, need.limit, now)


# -- configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's `metadata.rate_limit`: limits per kind, `*` for every other kind."""

    kinds: Mapping[str, RateLimit]

    def for_kind(self, kind: str) -> RateLimit | None:
        """The kind's own limit, else the tenant's `*` limit, else None (unlimited)."""
        return self.kinds.get(kind, self.kinds.get(WILDCARD_KIND))


def parse_tenant_limits(raw: Any, tenant: str) -> tuple[TenantLimits, list[str]]:
    """Parse `metadata.rate_limit` leniently: bad entries are dropped and reported.

    Returns the valid limits and one problem message per dropped entry (a bad limit in
    the database must not stop a worker; the worker logs them).
    """
    if raw is None:
        return TenantLimits({}), []
    if not isinstance(raw, Mapping):
        return TenantLimits({}), [f"tenant {tenant}: rate_limit must be an object, got {raw!r}"]
    kinds: dict[str, RateLimit] = {}
    problems: list[str] = []
    for kind, value in raw.items():
        try:
            kinds[str(kind)] = parse_rate_limit(value, f"tenant {tenant}: rate_limit.{kind}")
        except ValueError as exc:
            problems.append(str(exc))
    return TenantLimits(kinds), problems


@dataclass(frozen=True)
class ProviderCaps:
    """Global caps per provider and the provider each kind uses (platform configuration).

    The `JOBPOOL_RATE_LIMITS` contract:
    `{"providers": {"<name>": {"rps": r, "burst": b}}, "kinds": {"<kind>": "<name>"}}`.
    """

    providers: Mapping[str, RateLimit]
    kinds: Mapping[str, str]

    def for_kind(self, kind: str) -> tuple[str, RateLimit] | None:
        """(provider name, cap) of the provider `kind` uses, or None."""
        name = self.kinds.get(kind)
        return None if name is None else (name, self.providers[name])


NO_CAPS = ProviderCaps({}, {})


def parse_provider_caps(raw: Any) -> ProviderCaps:
    """Validate the provider-caps document; raises ValueError naming the bad entry."""
    if raw is None:
        return NO_CAPS
    if not isinstance(raw, Mapping):
        raise ValueError(f"rate limits: expected an object {{providers, kinds}}, got {raw!r}")
    unknown = sorted(set(raw) - {"providers", "kinds"})
    if unknown:
        raise ValueError(f"rate limits: unknown key(s) {', '.join(unknown)} "
                         "(allowed: providers, kinds)")
    providers_raw = raw.get("providers") or {}
    kinds_raw = raw.get("kinds") or {}
    if not isinstance(providers_raw, Mapping) or not isinstance(kinds_raw, Mapping):
        raise ValueError("rate limits: providers and kinds must be objects")
    providers = {str(name): parse_rate_limit(value, f"providers.{name}")
                 for name, value in providers_raw.items()}
    for kind, provider in kinds_raw.items():
        if provider not in providers:
            raise ValueError(f"kinds.{kind}: provider {provider!r} is not declared in providers "
                             f"(declared: {', '.join(sorted(providers)) or 'none'})")
    return ProviderCaps(providers, {str(kind): str(name) for kind, name in kinds_raw.items()})
