"""Rate limits in a worker process: tenant limits from the database, provider caps from config.

Tenant limits live in `mdm.aa_tenant.metadata -> 'rate_limit'` and are re-read every
`refresh_every` seconds, so a change applies within seconds without a restart. Provider caps
come from `JOBPOOL_RATE_LIMITS` (JSON, or `@/path/file.yaml|json`). The buckets themselves
are the pure ones of `jobpool.core.ratelimit`; each worker process keeps its own, so N
processes give a tenant up to N x its rate.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from jobpool.configfile import read_config_file
from jobpool.core.ratelimit import (
    NO_CAPS,
    Denied,
    Granted,
    Need,
    ProviderCaps,
    TenantLimits,
    TokenBucket,
    parse_tenant_limits_json,
    take_token,
    wait_time,
)
from jobpool.core.yamlfile import provider_caps_from_text
from jobpool.settings import Settings
from jobpool.sql import QUERIES

log = logging.getLogger("jobpool.ratelimit")

REFRESH_EVERY = 2.0
"""Seconds between reloads of the tenants' limits."""

MAX_REQUEUE_DELAY = 60.0
"""Cap on the delay written to `available_at`, so a relaxed limit reaches parked jobs soon."""

WAKE_SLACK = 0.05
"""Seconds after a token is due at which the fetch loop is woken to claim again."""


def load_provider_caps(value: str | None) -> ProviderCaps:
    """Provider caps from a `JOBPOOL_RATE_LIMITS` value: JSON or YAML text, or `@path` to a
    YAML or JSON file (read by `jobpool.core.yamlfile.provider_caps_from_text`).

    None or blank: no caps. Raises ValueError naming the variable, the file and the problem
    (bad YAML, a document too large or too deep to be configuration, a bad field); for a
    file, read at most its limit + 1 bytes, the problem never quotes the file's content.
    """
    if not value or not value.strip():
        return NO_CAPS
    source = "JOBPOOL_RATE_LIMITS"
    text = value
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        source = f"JOBPOOL_RATE_LIMITS file {path}"
        try:
            text = read_config_file(path)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    try:
        return provider_caps_from_text(text)
    except ValueError as exc:
        if source != "JOBPOOL_RATE_LIMITS":  # the path may name any file: never show it
            raise ValueError(f"{source}: not usable rate limits (YAML or JSON of the form "
                             "{providers: ..., kinds: ...}, see the README's Rate limits); "
                             "its content is not shown") from None
        raise ValueError(f"{source}: {exc}") from None


def pair_key(tenant_id: uuid.UUID | str, kind: str) -> str:
    """The claim's `tenant-uuid/kind` form of a (tenant, kind) pair."""
    return f"{tenant_id}/{kind}"


class RateLimiter:
    """The token buckets of one worker process.

    `acquire` decides whether a claimed job may start; `throttled` lists the pairs the next
    claim should leave out; `refresh` reloads the tenants' limits (the worker calls it every
    `refresh_every` seconds).
    """

    def __init__(
        self, caps: ProviderCaps = NO_CAPS, *, refresh_every: float = REFRESH_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.caps = caps
        self.refresh_every = refresh_every
        self.clock = clock
        self.tenants: dict[str, TenantLimits] = {}
        self.tenant_keys: dict[str, str] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.pairs: set[tuple[str, str]] = set()
        self._reported: list[str] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimiter:
        """A limiter with the provider caps of `settings.rate_limits`; raises ValueError."""
        return cls(load_provider_caps(settings.rate_limits))

    # -- decisions -------------------------------------------------------------------------

    def acquire(self, tenant_id: uuid.UUID | str, kind: str) -> Denied | None:
        """Take a token for a job of (tenant, kind): None means go, Denied means requeue."""
        tenant = str(tenant_id)
        needs = self._needs(tenant, kind)
        if not needs:
            return None
        self.pairs.add((tenant, kind))
        decision = take_token(needs, self.clock())
        if isinstance(decision, Granted):
            self.buckets.update(decision.buckets)
            return None
        return decision

    def throttled(self) -> list[str]:
        """`tenant-uuid/kind` pairs whose next token is not yet due (for the claim)."""
        now = self.clock()
        return [pair_key(tenant, kind) for tenant, kind in sorted(self.pairs)
                if wait_time(self._needs(tenant, kind), now) > 0]

    def tenant_label(self, tenant_id: uuid.UUID | str) -> str:
        """The tenant's key for metric labels (its id until the next refresh knows it)."""
        return self.tenant_keys.get(str(tenant_id), str(tenant_id))

    def _needs(self, tenant: str, kind: str) -> list[Need]:
        needs: list[Need] = []
        limits = self.tenants.get(tenant)
        limit = limits.for_kind(kind) if limits else None
        if limit is not None:
            key = f"tenant/{tenant}/{kind}"
            needs.append(Need(key, "tenant", limit, self.buckets.get(key)))
        provider = self.caps.for_kind(kind)
        if provider is not None:
            key = f"provider/{provider[0]}"
            needs.append(Need(key, "provider", provider[1], self.buckets.get(key)))
        return needs

    # -- tenant limits ---------------------------------------------------------------------

    def set_tenant_limits(self, rows: Iterable[Mapping[str, Any]]) -> list[str]:
        """Replace the tenants' limits from `tenant_rate_limits` rows; return the problems.

        `rate_limit` is JSON text or None. An invalid entry is left out and reported (naming
        the tenant and field); the tenant's other entries and other tenants still apply.
        Buckets keep their tokens across a change; the new rps and burst apply at once.
        """
        tenants: dict[str, TenantLimits] = {}
        keys: dict[str, str] = {}
        problems: list[str] = []
        for row in rows:
            tenant = str(row["id"])
            keys[tenant] = str(row["key"])
            limits, bad = parse_tenant_limits_json(row["rate_limit"], str(row["key"]))
            problems += bad
            if limits.kinds:
                tenants[tenant] = limits
        self.tenants, self.tenant_keys = tenants, keys
        self._forget_unlimited()
        return problems

    def _forget_unlimited(self) -> None:
        self.pairs = {(t, k) for t, k in self.pairs if self._needs(t, k)}
        live = {need.key for t, k in self.pairs for need in self._needs(t, k)}
        self.buckets = {key: b for key, b in self.buckets.items() if key in live}

    async def refresh(self, pool: AsyncConnectionPool[Any]) -> None:
        """Reload the tenants' limits; log (once per change) entries that are invalid."""
        async with pool.connection() as conn:
            cur = await conn.execute(QUERIES["tenant_rate_limits"].text)
            rows = await cur.fetchall()
        problems = self.set_tenant_limits(rows)
        if problems != self._reported:
            for problem in problems:
                log.warning("ignoring invalid rate limit: %s", problem)
        self._reported = problems


def requeue_delay(denied: Denied) -> float:
    """Seconds until the requeued job becomes available: retry_after, capped."""
    return min(denied.retry_after, MAX_REQUEUE_DELAY)


def describe(denied: Denied) -> str:
    """Log text of a denial."""
    return f"{denied.scope} rate limit, next token in {denied.retry_after:.2f}s"

