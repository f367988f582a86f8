"""Leader election for operator replicas: the I/O around the pure rules of k8s.lease."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from jobpool.errors import JobpoolError
from jobpool.k8s.client import ApiError, KubeApi
from jobpool.k8s.lease import (
    LEASE_NAME,
    LeaseTiming,
    Observation,
    lease_body,
    may_act,
    next_move,
    observe,
    released,
    write_budget,
)

log = logging.getLogger(__name__)


class NotLeadingError(JobpoolError):
    """A write was about to go out from a replica that does not (or no longer) lead."""


class Leader:
    """Holds (or waits for) the Lease `jobpool-operator` in `namespace` as `identity`.

    `leading()` is true while this replica renewed the Lease less than
    `timing.renew_deadline` seconds ago by `monotonic` (seconds, never set back); the
    operator writes only then, and each write within `write_budget()` seconds. `clock`
    gives the times written into the Lease for people to read; no decision uses it.
    """

    def __init__(
        self, api: KubeApi, namespace: str, identity: str, *,
        clock: Callable[[], datetime], timing: LeaseTiming,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.clock = clock
        self.timing = timing
        self.monotonic = monotonic
        self._renewed_at: float | None = None
        self._seen: Observation | None = None

    def leading(self) -> bool:
        """Whether this replica may act now."""
        return may_act(self._renewed_at, self.monotonic(), self.timing)

    def write_budget(self) -> float | None:
        """Seconds a write starting now may take (it ends before a standby may lead);
        None: this replica must not write."""
        return write_budget(self._renewed_at, self.monotonic(), self.timing)

    async def run(self) -> None:
        """Take and renew the Lease until cancelled."""
        while True:
            try:
                pause = await self.attempt()
            except Exception:  # an unreadable answer, a lost connection: stay in the race
                log.exception("leader election failed; trying again")
                pause = self.timing.retry_every
            await asyncio.sleep(pause)

    async def attempt(self) -> float:
        """One read and, unless another replica holds the Lease, one conditional write;
        the seconds to wait before the next attempt. Each request ends within
        `timing.request_timeout` seconds."""
        was_leading = self.leading()
        try:
            async with asyncio.timeout(self.timing.request_timeout):
                lease = await self.api.read_lease(self.namespace, LEASE_NAME)
            now = self.monotonic()
            self._seen = observe(self._seen, lease, now)
            move = next_move(lease, self.identity, self._seen, now)
            if move == "wait":
                self._renewed_at = None
                return self.timing.retry_every
            body = lease_body(lease, name=LEASE_NAME, namespace=self.namespace,
                              me=self.identity, now=self.clock(), timing=self.timing, move=move)
            started = self.monotonic()
            async with asyncio.timeout(self.timing.request_timeout):
                if move == "create":
                    await self.api.create_lease(body)
                else:
                    await self.api.replace_lease(body)
            self._renewed_at = started
        except (ApiError, TimeoutError) as exc:
            if isinstance(exc, ApiError) and exc.status == 409:
                self._renewed_at = None  # another replica wrote the Lease first: it leads
            log.warning("leader election: %s", exc or "no answer in time")
            if was_leading and not self.leading():
                log.warning("lost the Lease %s/%s: standing by", self.namespace, LEASE_NAME)
            return self.timing.retry_every
        if not was_leading:
            log.info("leading as %s (Lease %s/%s)", self.identity, self.namespace, LEASE_NAME)
        return self.timing.renew_every

    async def release(self) -> None:
        """Give the Lease up (on a clean stop), so that a standby takes over at once."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            async with asyncio.timeout(self.timing.request_timeout):
                lease = await self.api.read_lease(self.namespace, LEASE_NAME)
                if lease is not None and (lease.get("spec") or {}).get(
                    "holderIdentity"
                ) == self.identity:
                    await self.api.replace_lease(released(lease))
        except (ApiError, TimeoutError) as exc:
            log.warning("could not release the Lease: %s", exc or "no answer in time")
