"""A worker process's side of the cluster-wide token buckets.

Tenant limits live in `mdm.aa_tenant.metadata -> 'rate_limit'` and are re-read every
`refresh_every` seconds, so a change applies within seconds without a restart. Provider caps
come from `JOBPOOL_RATE_LIMITS` (JSON, or `@/path/file.yaml|json`). The buckets are rows of
`mdm.aa_rate_bucket`, one per limit for the whole pool; this process leases small batches
of tokens from them (`lease_tokens`) and decides with the pure `jobpool.core.ratelimit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, assert_never

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from jobpool.configfile import read_config_file
from jobpool.core.ratelimit import (
    NO_CAPS,
    NO_LEASE,
    STORE_RETRY,
    Denied,
    Granted,
    Lease,
    LeaseFirst,
    Need,
    ProviderCaps,
    TenantLimits,
    lease_size,
    leased,
    pair_cap,
    parse_tenant_limits_json,
    store_failed,
    take_token,
    wait_time,
)
from jobpool.core.suggestions import did_you_mean
from jobpool.core.yamlfile import provider_caps_from_text
from jobpool.db.queries import Many
from jobpool.settings import Settings

LEASE_TOKENS = Many("lease_tokens")
TENANT_RATE_LIMITS = Many("tenant_rate_limits")

log = logging.getLogger("jobpool.ratelimit")

REFRESH_EVERY = 2.0
"""Seconds between reloads of the tenants' limits."""

MAX_REQUEUE_DELAY = 60.0
"""Cap on the delay written to `available_at`, so a relaxed limit reaches parked jobs soon."""

LEASE_TIMEOUT = 1.0
"""Seconds a lease may take before the token store counts as not answering."""

WAKE_SLACK = 0.05
"""Seconds after a token is due at which the fetch loop is woken to claim again."""

PROMISE_LIFETIME = 2.0
"""Seconds a claimed job of a limited pair counts as promised a token until it asks for one.
A claimed job starts at once or waits in the prefetch buffer, which is handed back once its
oldest job has waited a second for a slot; a job that never asks (handed back, stopped,
its payload refused) so holds a token from the next claims for this long at most."""


def warn_uncapped_kinds(capped: Iterable[str], registered: Iterable[str]) -> None:
    """Warn about each kind of JOBPOOL_RATE_LIMITS's `kinds` no module registered: a misspelt
    one caps nothing, and the kind meant runs past its provider's cap (a local pool refuses
    it at start; a pod's worker has only its own registry to tell)."""
    known = tuple(registered)
    for kind in sorted(set(capped) - set(known)):
        log.warning("JOBPOOL_RATE_LIMITS caps job kind %r%s, which no module registered: it "
                    "caps nothing here", kind, did_you_mean(kind, known))


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
                             "{providers: ..., kinds: ...}, see docs/rate-limits.md); "
                             "its content is not shown") from None
        raise ValueError(f"{source}: {exc}") from None


EVERY_TENANT = "*"
"""The tenant part of a claim cap on a kind's jobs of every tenant (`*/kind`)."""


def pair_key(tenant_id: uuid.UUID | str, kind: str) -> str:
    """The claim's `tenant-uuid/kind` form of a (tenant, kind) pair (`*/kind`: every tenant)."""
    return f"{tenant_id}/{kind}"


class TokenStore:
    """The leases of one worker process on the pool's token buckets.

    `acquire` decides whether a claimed job may start (leasing tokens when it holds none);
    `claim_caps` says how many jobs of each limited pair the next claim may take (`claimed`
    counts the jobs it took, until they ask for their token); `refresh` reloads the
    tenants' limits (the worker calls it every `refresh_every` seconds). `lease_statements`
    counts the statements sent to the buckets.
    """

    def __init__(
        self, caps: ProviderCaps = NO_CAPS, *, refresh_every: float = REFRESH_EVERY,
        lease_timeout: float = LEASE_TIMEOUT, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.caps = caps
        self.refresh_every = refresh_every
        self.lease_timeout = lease_timeout
        self.clock = clock
        self.tenants: dict[str, TenantLimits] = {}
        self.tenant_keys: dict[str, str] = {}
        self.leases: dict[str, Lease] = {}
        self.pairs: set[tuple[str, str]] = set()
        self.promised: dict[tuple[str, str], list[float]] = {}
        """Claim times of the claimed jobs of each limited pair that have not asked for their
        token yet (oldest first)."""
        self.lease_statements = 0
        self._leasing: dict[str, asyncio.Lock] = {}
        self._reported: list[str] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenStore:
        """A store with the provider caps of `settings.rate_limits`; raises ValueError."""
        return cls(load_provider_caps(settings.rate_limits))

    # -- decisions -------------------------------------------------------------------------

    async def acquire(self, pool: AsyncConnectionPool[Any], tenant_id: uuid.UUID | str,
                      kind: str) -> Denied | None:
        """Take a token for a job of (tenant, kind): None means go, Denied means requeue.

        Leases from the buckets it holds no token of first. A bucket whose store does not
        answer within `lease_timeout` seconds (or fails) is not asked again for STORE_RETRY
        seconds, and its jobs are denied meanwhile (`store_failed`). The job's promise
        (`claimed`) is kept until the decision, so that a claim meanwhile counts its token.
        """
        if not self._may_limit(kind):
            return None
        tenant = str(tenant_id)
        needs = self._needs(tenant, kind)
        if not needs:
            return None
        self.pairs.add((tenant, kind))
        try:
            return await self._decide(pool, needs)
        finally:
            promises = self.promised.get((tenant, kind))
            if promises:
                promises.pop(0)

    async def _decide(self, pool: AsyncConnectionPool[Any], needs: list[Need]) -> Denied | None:
        decision = take_token(needs, self.leases, self.clock())
        if isinstance(decision, LeaseFirst):
            await self._lease(pool, decision.needs)
            decision = take_token(needs, self.leases, self.clock())
        match decision:
            case Granted(leases=taken):
                self.leases.update(taken)
                return None
            case Denied():
                return decision
            case LeaseFirst(needs=missing):  # leased tokens already expired: a stalled loop
                return Denied(STORE_RETRY, missing[0].scope)
            case _:
                assert_never(decision)

    def claimed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Count the claimed jobs (rows with `tenant_id` and `job_kind`) of limited pairs as
        promised a token until they ask for it (`acquire`), or for PROMISE_LIFETIME."""
        now = self.clock()
        for row in rows:
            if not self._may_limit(row["job_kind"]):
                continue
            pair = (str(row["tenant_id"]), str(row["job_kind"]))
            if self._needs(*pair):
                self.pairs.add(pair)
                self.promised.setdefault(pair, []).append(now)

    def claim_caps(self, kinds: Iterable[str]) -> dict[str, int]:
        """The most jobs of each limited pair the next claim may take, by `tenant-uuid/kind`
        (0: leave the pair out): the pairs met so far and each pair of `kinds` that a
        tenant's own limit covers (`pair_cap`: its tokens due or to be had now, less those
        promised); and by `*/kind` the most of each pair of a provider-capped kind, those
        of tenants not met yet included (a claim meeting several such tenants may take that
        many of each). A pair not listed is unlimited."""
        now = self.clock()
        promised = self._promised_tokens(now)
        pairs = self.pairs | {(tenant, kind) for tenant, limits in self.tenants.items()
                              for kind in kinds if limits.for_kind(kind) is not None}
        caps: dict[str, int] = {}
        for tenant, kind in pairs:
            cap = pair_cap(self._needs(tenant, kind), self.leases, promised, now)
            if cap is not None:
                caps[pair_key(tenant, kind)] = cap
        for kind in kinds:
            provider = self._provider_need(kind)
            if provider is not None:
                caps[pair_key(EVERY_TENANT, kind)] = pair_cap(
                    [provider], self.leases, promised, now) or 0
        return caps

    def _promised_tokens(self, now: float) -> dict[str, int]:
        """Tokens promised to claimed jobs, by bucket key; forgets the expired promises."""
        tokens: dict[str, int] = {}
        for pair, times in list(self.promised.items()):
            live = [t for t in times if t + PROMISE_LIFETIME >= now]
            if not live:
                del self.promised[pair]
                continue
            self.promised[pair] = live
            for need in self._needs(*pair):
                tokens[need.key] = tokens.get(need.key, 0) + len(live)
        return tokens

    def next_token_in(self) -> float | None:
        """Seconds until the first token of a throttled pair is due (by the leases held and
        the buckets' balances last seen); None: none is throttled."""
        now = self.clock()
        waits = (wait_time(self._needs(tenant, kind), self.leases, now)
                 for tenant, kind in self.pairs)
        return min((wait for wait in waits if wait > 0), default=None)

    def tenant_label(self, tenant_id: uuid.UUID | str) -> str:
        """The tenant's key for metric labels (its id until the next refresh knows it)."""
        return self.tenant_keys.get(str(tenant_id), str(tenant_id))

    def _may_limit(self, kind: str) -> bool:
        """Whether any limit may cover a job of `kind`: some tenant has limits, or a provider
        caps the kind. Asked first, per job, because the answer is mostly no, and the tenant's
        id as text (`_needs`' key) costs more than the question."""
        return bool(self.tenants) or kind in self.caps.kinds

    def _needs(self, tenant: str, kind: str) -> list[Need]:
        needs: list[Need] = []
        limits = self.tenants.get(tenant)
        limit = limits.for_kind(kind) if limits else None
        if limit is not None:
            needs.append(Need(f"tenant/{tenant}/{kind}", "tenant", limit))
        provider = self._provider_need(kind)
        if provider is not None:
            needs.append(provider)
        return needs

    def _provider_need(self, kind: str) -> Need | None:
        provider = self.caps.for_kind(kind)
        return None if provider is None else Need(f"provider/{provider[0]}", "provider",
                                                  provider[1])

    # -- leasing ---------------------------------------------------------------------------

    async def _lease(self, pool: AsyncConnectionPool[Any], needs: Sequence[Need]) -> None:
        """Lease from `needs`' buckets in one statement, one lease in flight per bucket."""
        async with contextlib.AsyncExitStack() as held:
            for need in sorted(needs, key=lambda n: n.key):
                await held.enter_async_context(self._leasing.setdefault(need.key, asyncio.Lock()))
            now = self.clock()
            wanted = [n for n in needs if self.leases.get(n.key, NO_LEASE).wait(now) is None]
            if not wanted:
                return  # another job of this process leased them meanwhile
            try:
                async with asyncio.timeout(self.lease_timeout):
                    rows = await self._lease_statement(pool, wanted)
            except (TimeoutError, psycopg.Error) as exc:
                log.warning("token store did not answer (%s); jobs limited by %s wait %gs",
                            str(exc) or "timed out", ", ".join(n.key for n in wanted),
                            STORE_RETRY)
                failed = store_failed(self.clock())
                self.leases.update({n.key: failed for n in wanted})
                return
            now = self.clock()
            limits = {n.key: n.limit for n in wanted}
            for row in rows:
                self.leases[row["key"]] = leased(row["tokens"], row["taken"],
                                                 limits[row["key"]].rps, now)

    async def _lease_statement(
        self, pool: AsyncConnectionPool[Any], needs: Sequence[Need]
    ) -> list[dict[str, Any]]:
        """One statement in a transaction of its own, sent with its BEGIN and COMMIT in one
        pipeline (one round trip, at the pool's READ COMMITTED whatever the database's
        default): a lease commits at once, so a peer waits on the bucket's row for this
        statement only."""
        self.lease_statements += 1
        params = {
            "keys": [n.key for n in needs],
            "rps": [n.limit.rps for n in needs],
            "bursts": [n.limit.burst for n in needs],
            "wants": [lease_size(n.limit) for n in needs],
        }
        async with pool.connection() as conn:
            async with conn.pipeline():
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(LEASE_TOKENS.text, params)
                await conn.commit()
            rows: list[dict[str, Any]] = await cur.fetchall()
            return rows

    # -- tenant limits ---------------------------------------------------------------------

    def set_tenant_limits(self, rows: Iterable[Mapping[str, Any]]) -> list[str]:
        """Replace the tenants' limits from `tenant_rate_limits` rows; return the problems.

        `rate_limit` is JSON text or None. An invalid entry is left out and reported (naming
        the tenant and field); the tenant's other entries and other tenants still apply.
        Leased tokens stay valid across a change; the buckets take the new rps and burst at
        the next lease.
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
        self.promised = {pair: times for pair, times in self.promised.items()
                         if pair in self.pairs}
        live = {need.key for t, k in self.pairs for need in self._needs(t, k)}
        self.leases = {key: lease for key, lease in self.leases.items() if key in live}
        self._leasing = {key: lock for key, lock in self._leasing.items() if key in live}

    async def refresh(self, pool: AsyncConnectionPool[Any]) -> None:
        """Reload the tenants' limits; log (once per change) entries that are invalid."""
        async with pool.connection() as conn:
            rows = await TENANT_RATE_LIMITS(conn)
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

