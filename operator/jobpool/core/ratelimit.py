"""Cluster-wide token buckets per (tenant, kind) and per provider, leased in small batches.

A bucket holds up to `burst` tokens and gains `rps` tokens per second. There is one bucket
per limit for the whole pool: a row in PostgreSQL whose balance is refilled from the time
elapsed when a process leases from it (no ticker). A process leases `lease_size(limit)`
tokens at once; the lease is always granted, and the bucket's balance may go below zero: each
leased token is then due when the refill covers it (`leased`), so processes line up for the
tokens instead of asking again and again. A leased token may be used from its due time for
TOKEN_LIFETIME seconds; an unused one expires (it is never handed out twice).

A job may start when every bucket it needs (its tenant's limit for its kind, and its kind's
provider cap) has a leased token due; then one is taken from each. Otherwise nothing is taken
and the job waits `retry_after` seconds, until every needed bucket has a token due. So that
this stays rare, a claim takes no more jobs of a limited (tenant, kind) pair than could start
now (`pair_cap`), judged by the leases held and the balance each bucket had at this process's
last lease (`tokens_now`, `bucket_wait`).

Pure: callers pass `now` (seconds on a monotonic clock) and store the leases returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from jobpool.core.jsondata import expect_text

WILDCARD_KIND = "*"
"""Key in a tenant's `rate_limit` object that limits every kind without its own entry."""

MIN_RPS = 0.00001
"""One token in about 28 hours: a slower "limit" is a stop (`jobpool jobs stop`), and the
waits it computes (up to 1 / rps seconds) must stay schedulable."""
MAX_RPS = 100_000
"""Tokens per second; ten times what one worker process can run, so a higher rate limits
nothing and is a typo."""
MAX_BURST = 100_000
"""Tokens a bucket may save up; as for MAX_RPS, more means no limit at all."""

LimitScope = Literal["tenant", "provider"]


@dataclass(frozen=True)
class RateLimit:
    """Sustained `rps` tokens per second (MIN_RPS..MAX_RPS), at most `burst` (1..MAX_BURST)
    saved up."""

    rps: float
    burst: int

    def __post_init__(self) -> None:
        for name, problem in (("rps", _rps_problem(self.rps)),
                              ("burst", _burst_problem(self.burst))):
            if problem:
                raise ValueError(f"{name}: {problem}")


def _is_number(value: Any) -> bool:
    """A JSON number: int or float, not bool (a bool is an int to Python, not to JSON)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rps_problem(rps: Any) -> str | None:
    # compared as is, not as float(): an int of 400 digits does not fit a float (nan and
    # infinity fail the comparison)
    if _is_number(rps) and MIN_RPS <= rps <= MAX_RPS:
        return None
    return (f"must be a number of tokens per second from {MIN_RPS:.5f} to {MAX_RPS}, "
            f"got {_shown(rps)}")


def _burst_problem(burst: Any) -> str | None:
    if isinstance(burst, int) and not isinstance(burst, bool) and 1 <= burst <= MAX_BURST:
        return None
    return f"must be a whole number from 1 to {MAX_BURST}, got {_shown(burst)}"


def _shown(value: Any) -> str:
    """The value for an error message, cut short (a number may have thousands of digits)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"a number of about {int(value.bit_length() * math.log10(2))} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_rate_limit(raw: Any, where: str) -> RateLimit:
    """A RateLimit from `{"rps": r, "burst": b}`; burst defaults to ceil(rps).

    rps: tokens per second, a number from MIN_RPS to MAX_RPS; burst: a whole number from 1 to
    MAX_BURST (4.0 counts as 4). Booleans, strings, nan and infinity are refused. Raises
    ValueError naming `where` (e.g. `providers.ses`) and the bad field.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected an object {{rps, burst}}, got {_shown(raw)}")
    unknown = sorted(str(key) for key in set(raw) - {"rps", "burst"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: rps, burst)")
    rps: Any = raw.get("rps")
    problem = _rps_problem(rps)
    if problem:
        raise ValueError(f"{where}.rps: {problem}")
    burst = raw.get("burst", max(1, math.ceil(rps)))
    if isinstance(burst, float) and burst.is_integer():
        burst = int(burst)
    problem = _burst_problem(burst)
    if problem:
        raise ValueError(f"{where}.burst: {problem}")
    return RateLimit(float(rps), burst)


LEASE_SECONDS = 0.2
"""A lease holds about this many seconds of a bucket's rate: the store sees one statement
per lease, so its cost grows with the rate (1 per 10 tokens from 50 tokens/s on), not with
the number of jobs or processes."""

TOKEN_LIFETIME = 1.0
"""Seconds a leased token stays usable after it is due. A token used late was counted by
the bucket when due: in a window of t seconds at most burst + rps * (t + TOKEN_LIFETIME)
jobs start, and more than burst + rps * t only when tokens are used late."""

STORE_RETRY = 1.0
"""Seconds a bucket is not asked again after the token store failed to answer."""


def lease_size(limit: RateLimit) -> int:
    """Tokens to lease at once: LEASE_SECONDS of the rate, at least 1, at most burst."""
    return max(1, min(limit.burst, math.floor(limit.rps * LEASE_SECONDS)))


@dataclass(frozen=True)
class Lease:
    """The tokens a process holds from one bucket.

    due: monotonic seconds from which each token may be used, ascending. retry_at: when the
    store failed, the time before which the bucket is not asked again (0: it answered).
    balance: the bucket's balance once this lease was taken (negative: tokens owed), at
    `leased_at` (monotonic seconds); None: this process never leased from it.
    """

    due: tuple[float, ...] = ()
    retry_at: float = 0.0
    balance: float | None = None
    leased_at: float = 0.0

    def live(self, now: float) -> Lease:
        """The lease without its expired tokens."""
        return replace(self, due=tuple(d for d in self.due if d + TOKEN_LIFETIME >= now))

    def wait(self, now: float) -> float | None:
        """Seconds until a token is due (0: one is), or None: lease again first."""
        live = self.live(now)
        if live.due:
            return max(0.0, live.due[0] - now)
        if self.retry_at > now:
            return self.retry_at - now
        return None


NO_LEASE = Lease()


def leased(balance_after: float, taken: int, rps: float, now: float) -> Lease:
    """The lease of `taken` tokens from a bucket whose balance is `balance_after` once they
    are taken (negative: some are owed). Token i (1..taken) is due when the bucket's refill
    covers it: (i - balance before) / rps seconds from `now`, or now."""
    before = balance_after + taken
    return Lease(tuple(now + max(0.0, i - before) / rps for i in range(1, taken + 1)),
                 balance=balance_after, leased_at=now)


def store_failed(now: float) -> Lease:
    """The lease of a bucket whose store did not answer: no token for STORE_RETRY seconds.

    The jobs that need it wait (their attempt not used) while every other job runs: running
    them unlimited could break a provider's cap, and stopping every kind would let one slow
    row stop the pool.
    """
    return Lease((), now + STORE_RETRY)


@dataclass(frozen=True)
class Need:
    """One bucket a job draws from: its key, scope and limit."""

    key: str
    scope: LimitScope
    limit: RateLimit


@dataclass(frozen=True)
class Granted:
    """The job may start; store `leases` (one token taken from each needed bucket)."""

    leases: Mapping[str, Lease]


@dataclass(frozen=True)
class Denied:
    """No token: requeue the job for `retry_after` seconds; `scope` names the bucket waited for.

    Nothing was taken from any lease.
    """

    retry_after: float
    scope: LimitScope


@dataclass(frozen=True)
class LeaseFirst:
    """Some needed buckets have no lease: lease from them, then decide again."""

    needs: tuple[Need, ...]


Decision = Granted | Denied | LeaseFirst


def take_token(needs: Sequence[Need], leases: Mapping[str, Lease], now: float) -> Decision:
    """Take one due token from the lease of every needed bucket, or none if any has none due.

    retry_after is the longest wait among the buckets; scope is the bucket that waits longest
    (tenant first on a tie).
    """
    waits: list[tuple[float, LimitScope]] = []
    missing: list[Need] = []
    for need in needs:
        wait = leases.get(need.key, NO_LEASE).wait(now)
        if wait is None:
            missing.append(need)
        else:
            waits.append((wait, need.scope))
    if missing:
        return LeaseFirst(tuple(missing))
    longest = max(waits, key=lambda item: item[0], default=(0.0, "tenant"))
    if longest[0] > 0:
        return Denied(retry_after=longest[0], scope=longest[1])
    taken = {}
    for need in needs:
        live = leases[need.key].live(now)
        taken[need.key] = replace(live, due=live.due[1:])
    return Granted(taken)


def wait_time(needs: Sequence[Need], leases: Mapping[str, Lease], now: float) -> float:
    """Seconds until a job with these needs could start by the leases held and the buckets'
    balances last seen (0: now, or a lease is needed first; `bucket_wait`)."""
    return max((bucket_wait(need.limit, leases.get(need.key, NO_LEASE), now)
                for need in needs), default=0.0)


def bucket_wait(limit: RateLimit, lease: Lease, now: float) -> float:
    """Seconds until a job could take a token of this bucket (0: now, or lease to know).

    With a token held, until it is due. With none, until the balance the bucket had after
    this process's last lease, refilled at `limit.rps` since, reaches one token: the pool's
    bucket holds at most that (other processes only take from it), so a lease before then
    would owe its token and the job go back to pending. Never leased here: 0 (unknown).
    """
    live = lease.live(now)
    if live.due:
        return max(0.0, live.due[0] - now)
    if lease.retry_at > now:
        return lease.retry_at - now
    if lease.balance is None:
        return 0.0
    return max(0.0, (1.0 - lease.balance) / limit.rps - (now - lease.leased_at))


CAP_ROUNDING = 1e-9
"""Tokens added before rounding the refilled balance down, so that a token due now by
`bucket_wait` (a float sum) counts as one."""


def tokens_now(limit: RateLimit, lease: Lease, now: float) -> int:
    """Jobs that could take a token of this bucket now: the held tokens that are due; with
    none held, the tokens a lease now would bring due (a lease's worth, at most the balance
    last seen refilled since, as in `bucket_wait`; a lease's worth when never leased here).
    0 while the store failed."""
    live = lease.live(now)
    if live.due:
        return sum(1 for due in live.due if due <= now)
    if lease.retry_at > now:
        return 0
    size = lease_size(limit)
    if lease.balance is None:
        return size
    refilled = min(float(limit.burst), lease.balance + limit.rps * (now - lease.leased_at))
    return max(0, min(size, math.floor(refilled + CAP_ROUNDING)))


def pair_cap(needs: Sequence[Need], leases: Mapping[str, Lease], promised: Mapping[str, int],
             now: float) -> int | None:
    """The most jobs of a (tenant, kind) pair with these needs that a claim should take now:
    the fewest `tokens_now` among its buckets, less the jobs already `promised` a token of
    each bucket (claimed, not yet started: by bucket key), at least 0. None: unlimited.

    A claim that takes more of a limited pair than it can start sends the rest back to
    pending, one transaction each, for want of a token."""
    if not needs:
        return None
    return max(0, min(tokens_now(need.limit, leases.get(need.key, NO_LEASE), now)
                      - promised.get(need.key, 0) for need in needs))


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

    Returns the valid limits and one problem message per dropped entry, naming the tenant
    and the field (a bad limit in the database must not stop a worker, nor disable the
    tenant's other limits; the worker logs the problems).
    """
    if raw is None:
        return TenantLimits({}), []
    if not isinstance(raw, Mapping):
        return TenantLimits({}), [
            f"tenant {tenant}: rate_limit must be an object, got {_shown(raw)}"]
    kinds: dict[str, RateLimit] = {}
    problems: list[str] = []
    for kind, value in raw.items():
        try:
            kinds[_key(kind, f"tenant {tenant}: rate_limit")] = parse_rate_limit(
                value, f"tenant {tenant}: rate_limit.{kind}")
        except ValueError as exc:
            problems.append(str(exc))
    return TenantLimits(kinds), problems


def parse_tenant_limits_json(text: str | None, tenant: str) -> tuple[TenantLimits, list[str]]:
    """parse_tenant_limits of `metadata -> 'rate_limit'` as PostgreSQL prints it (JSON text).

    Decoded here rather than by the driver, so that a value Python's JSON decoder cannot
    take (a number of thousands of digits, nesting deeper than its recursion limit) costs
    only this tenant's limits, reported like any other bad entry.
    """
    if text is None:
        return TenantLimits({}), []
    try:
        raw = json.loads(text, parse_int=_json_int)
    except (ValueError, RecursionError) as exc:
        return TenantLimits({}), [f"tenant {tenant}: rate_limit is not readable JSON: {exc}"]
    return parse_tenant_limits(raw, tenant)


def _json_int(text: str) -> int | float:
    """A JSON integer; a very long one as a float (inf when huge) so that decoding never fails."""
    return int(text) if len(text) <= 30 else float(text)


@dataclass(frozen=True)
class ProviderCaps:
    """Global caps per provider and the provider each kind uses (platform configuration).

    The one model of a lane's `rateLimits` (pool spec) and of `JOBPOOL_RATE_LIMITS` (the
    worker's environment): `{"providers": {"<name>": {"rps": r, "burst": b}}, "kinds":
    {"<kind>": "<name>"}}`. `to_json` writes it, `parse_provider_caps` (a document) and
    `provider_caps_from_text` (its text) read it back unchanged.
    """

    providers: Mapping[str, RateLimit]
    kinds: Mapping[str, str]

    def for_kind(self, kind: str) -> tuple[str, RateLimit] | None:
        """(provider name, cap) of the provider `kind` uses, or None."""
        name = self.kinds.get(kind)
        return None if name is None else (name, self.providers[name])

    def to_json(self) -> str:
        """The `JOBPOOL_RATE_LIMITS` value: compact JSON, names sorted."""
        return json.dumps(
            {
                "providers": {name: {"rps": limit.rps, "burst": limit.burst}
                              for name, limit in sorted(self.providers.items())},
                "kinds": dict(sorted(self.kinds.items())),
            },
            separators=(",", ":"),
        )


NO_CAPS = ProviderCaps({}, {})


def parse_provider_caps(raw: Any, where: str = "") -> ProviderCaps:
    """Validate a provider-caps document (parsed JSON or YAML); None means no caps.

    `where` is the document's path for messages (`spec.lanes[0].rateLimits` in a pool spec;
    empty for `JOBPOOL_RATE_LIMITS`, whose reader names the variable). Raises ValueError
    naming the bad field, e.g. `providers.ses.rps: ...` or `kinds.email_send: provider 'ses'
    is not declared in providers`.
    """
    if raw is None:
        return NO_CAPS
    document = where or "rate limits"
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"{document}: expected an object {{providers, kinds}}, got {_shown(raw)}")
    unknown = sorted(str(key) for key in set(raw) - {"providers", "kinds"})
    if unknown:
        raise ValueError(f"{document}: unknown key(s) {', '.join(unknown)} "
                         "(allowed: providers, kinds)")
    providers_raw = raw.get("providers") or {}
    kinds_raw = raw.get("kinds") or {}
    if not isinstance(providers_raw, Mapping) or not isinstance(kinds_raw, Mapping):
        raise ValueError(f"{document}: providers and kinds must be objects")
    providers_path = _field(where, "providers")
    providers = {_key(name, providers_path): parse_rate_limit(value, f"{providers_path}.{name}")
                 for name, value in providers_raw.items()}
    for kind, provider in kinds_raw.items():
        _key(kind, _field(where, "kinds"))
        kind_path = _field(where, f"kinds.{kind}")
        if not isinstance(provider, str):
            raise ValueError(f"{kind_path}: expected a provider name, got {_shown(provider)}")
        if provider not in providers:
            declared = ", ".join(sorted(providers)) or "none"
            raise ValueError(f"{kind_path}: provider {provider!r} is not declared in "
                             f"{providers_path} (declared: {declared})")
    return ProviderCaps(providers, dict(kinds_raw))


def _key(key: Any, path: str) -> str:
    """A key of the mapping at `path` (a provider's or a kind's name), refused unless it is
    text: YAML reads `5:` as a number, never the name "5"."""
    return expect_text(key, f"a key of {path}")


def _field(where: str, name: str) -> str:
    """The path of field `name` inside the document at `where` (may be empty)."""
    return f"{where}.{name}" if where else name
