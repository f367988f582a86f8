"""Leader election for operator replicas: the I/O around the pure rules of k8s.lease."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime

from jobpool.k8s.client import ApiError, KubeApi
from jobpool.k8s.lease import LEASE_NAME, LeaseTiming, lease_body, next_move, released

log = logging.getLogger(__name__)


class Leader:
    """Holds (or waits for) the Lease `jobpool-operator` in `namespace` as `identity`.

    `leading()` is true while this replica renewed the Lease less than
    `timing.renew_deadline` seconds ago; the operator acts only then.
    """

    def __init__(
        self, api: KubeApi, namespace: str, identity: str, *,
        clock: Callable[[], datetime], timing: LeaseTiming,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity
        self.clock = clock
        self.timing = timing
        self._renewed_at: float | None = None

    def leading(self) -> bool:
        """Whether this replica may act now."""
        return (self._renewed_at is not None
                and time.monotonic() - self._renewed_at < self.timing.renew_deadline)

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
        """One read and, unless another replica holds the Lease, one write; the seconds to
        wait before the next attempt."""
        was_leading = self.leading()
        try:
            lease = await self.api.read_lease(self.namespace, LEASE_NAME)
            now = self.clock()
            move = next_move(lease, self.identity, now)
            if move == "wait":
                self._renewed_at = None
                return self.timing.retry_every
            body = lease_body(lease, name=LEASE_NAME, namespace=self.namespace,
                              me=self.identity, now=now, timing=self.timing, move=move)
            started = time.monotonic()
            if move == "create":
                await self.api.create_lease(body)
            else:
                await self.api.replace_lease(body)
            self._renewed_at = started
        except ApiError as exc:  # 409: another replica wrote first; else the API is unwell
            log.warning("leader election: %s", exc)
            if not self.leading() and was_leading:
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
            lease = await self.api.read_lease(self.namespace, LEASE_NAME)
            if lease is not None and (lease.get("spec") or {}).get(
                "holderIdentity"
            ) == self.identity:
                await self.api.replace_lease(released(lease))
        except ApiError as exc:
            log.warning("could not release the Lease: %s", exc)
