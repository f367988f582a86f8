"""The fetch loop over the slots, on fakes of the completer's and executor's protocols.

Claims from a real queue, LISTEN wake-ups and outages are in tests/integration
(test_lifecycle.py, test_wakeups.py, test_outages.py); here the claim answers what the
test says, so that the loop's own decisions (how many to claim, when to stop, the grace
period) are driven on purpose.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from jobpool.core.kinds import KindDefaults
from jobpool.db.store import Row
from jobpool.job import Job, JobContext
from jobpool.metrics import JobOutcome
from jobpool.registry import KindSpec
from jobpool.worker.completer import Pending
from jobpool.worker.config import WorkerConfig
from jobpool.worker.producer import Producer
from jobpool.worker.stops import Stops


def row(job_id: int) -> Row:
    now = datetime.now(UTC)
    return {"id": job_id, "tenant_id": uuid.uuid4(), "job_kind": "k", "payload": {},
            "status": "running", "priority": 0, "available_at": now, "created_at": now,
            "claimed_by": "w", "claimed_at": now, "attempts": 1, "max_attempts": 3,
            "last_error": None, "idempotency_key": None}


class Claims:
    """Claims from `queue`, recording each claim's limit."""

    def __init__(self, *ids: int) -> None:
        self.queue = [row(i) for i in ids]
        self.limits: list[int] = []
        self.flushing = False

    async def gather(self) -> None:
        return None

    def take(self) -> list[Pending]:
        return []

    async def send(
        self, batch: list[Pending], *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None,
        limit: int, throttled: Callable[[], list[str]],
    ) -> list[Row]:
        self.limits.append(limit)
        claimed, self.queue = self.queue[:max(limit, 0)], self.queue[max(limit, 0):]
        return claimed

    async def flush(self) -> None:
        self.flushing = True
        await asyncio.Event().wait()


class Runs:
    """Runs each job until `release` is set (at once when it is set already)."""

    def __init__(self) -> None:
        self.releasing = False
        self.release = asyncio.Event()
        self.release.set()
        self.ran: list[int] = []

    async def execute(self, job: Job) -> JobOutcome:
        self.ran.append(job.id)
        await self.release.wait()
        return "done"


class Leases:
    def __init__(self) -> None:
        self.held: list[int] = []
        self.released: list[int] = []

    def hold(self, job_id: int, kind: str, timeout: float) -> None:
        self.held.append(job_id)

    def release(self, job_id: int) -> None:
        self.released.append(job_id)


def producer(*, slots: int, until_empty: bool = True, grace: float = 0.01,
             observed: list[tuple[int, JobOutcome]] | None = None,
             leases: Leases | None = None) -> Producer:
    online = asyncio.Event()
    online.set()
    seen = observed if observed is not None else []
    return Producer(
        config=WorkerConfig(kinds=("k",), slots=slots, until_empty=until_empty, grace=grace),
        kinds=("k",), specs={"k": KindSpec("k", _no_handler, KindDefaults())},
        wake=asyncio.Event(), online=online, leases=leases or Leases(), slots=lambda: slots,
        tenants=lambda: None, throttled=list, claimed=lambda rows: None,
        observe=lambda job, outcome, started: seen.append((job.id, outcome)),
        poll_interval=0.05, worker_id="w", job_context=JobContext(),
        stops=Stops(grace=1.0, finishing=lambda job_id: False, abandon=lambda job_id: None))


async def _no_handler(job: Job, tx: Any) -> None:
    return None


async def test_until_empty_runs_every_claimed_job_then_returns() -> None:
    claims, runs, observed, leases = Claims(1, 2, 3), Runs(), [], Leases()
    p = producer(slots=2, observed=observed, leases=leases)

    await asyncio.wait_for(p.run(claims, runs), 10.0)

    assert sorted(runs.ran) == [1, 2, 3]
    assert sorted(observed) == [(1, "done"), (2, "done"), (3, "done")]
    assert claims.limits[0] == 2  # never more than the free slots
    assert all(limit <= 2 for limit in claims.limits)
    assert sorted(leases.held) == sorted(leases.released) == [1, 2, 3]
    assert p.in_flight == {}


async def test_a_full_slot_set_claims_nothing_more_until_a_job_finishes() -> None:
    claims, runs = Claims(1, 2), Runs()
    runs.release.clear()
    p = producer(slots=1, until_empty=False)
    loop = asyncio.create_task(p.run(claims, runs))
    try:
        while runs.ran != [1]:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # a few poll intervals with the one slot busy
        assert set(claims.limits[1:]) <= {0}
        runs.release.set()
        while runs.ran != [1, 2]:
            await asyncio.sleep(0.01)
    finally:
        p.stopping.set()
        p.wake.set()
        await asyncio.wait_for(loop, 10.0)


async def test_the_grace_period_over_the_running_jobs_are_cancelled_as_released() -> None:
    claims, runs, observed = Claims(1), Runs(), []
    runs.release.clear()
    p = producer(slots=1, until_empty=False, observed=observed)
    loop = asyncio.create_task(p.run(claims, runs))
    while runs.ran != [1]:
        await asyncio.sleep(0.01)
    p.stopping.set()
    p.wake.set()
    await asyncio.wait_for(loop, 10.0)

    await asyncio.wait_for(p.drain(claims, runs), 10.0)

    assert runs.releasing and claims.flushing
    assert observed == [(1, "released")]
    assert p.in_flight == {}


async def test_stop_before_the_database_answers_ends_the_wait() -> None:
    p = producer(slots=1)
    p.online.clear()
    waiting = asyncio.create_task(p.wait_online())
    await asyncio.sleep(0)
    p.stopping.set()
    p.wake.set()
    assert await asyncio.wait_for(waiting, 10.0) is False
