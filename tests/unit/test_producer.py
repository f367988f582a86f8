"""The fetch loop over the slots, on fakes of the completer's and executor's protocols.

Claims from a real queue, LISTEN wake-ups and outages are in tests/integration
(test_lifecycle.py, test_wakeups.py, test_outages.py); here the claim answers what the
test says, so that the loop's own decisions (how many to claim, when to stop, the grace
period) are driven on purpose.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from jobpool.core.kinds import KindDefaults
from jobpool.core.prefetch import FIRST_ROOM
from jobpool.db.store import Completion, Row
from jobpool.job import Job, JobContext
from jobpool.metrics import JobOutcome
from jobpool.registry import KindSpec
from jobpool.worker import producer as producer_module
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
        self.waiting = 0

    async def gather(self) -> None:
        return None

    def take(self) -> list[Pending]:
        return []

    def overdue(self) -> bool:
        return False

    async def send(
        self, batch: list[Pending], *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None,
        limit: int, caps: Callable[[], Mapping[str, int]],
    ) -> list[Row]:
        self.limits.append(limit)
        claimed, self.queue = self.queue[:max(limit, 0)], self.queue[max(limit, 0):]
        return claimed

    async def flush(self) -> None:
        self.flushing = True
        await asyncio.Event().wait()


class Returns:
    """Hand-backs of unstarted claims: records the running jobs each one left out."""

    def __init__(self) -> None:
        self.unrun: list[list[int]] = []

    async def release_unrun_claims(self, running: Sequence[int]) -> list[Row]:
        self.unrun.append(sorted(running))
        return []


class Runs:
    """Runs each job until `release` is set (at once when it is set already); records the
    most handlers that ran at once."""

    def __init__(self) -> None:
        self.releasing = False
        self.release = asyncio.Event()
        self.release.set()
        self.ran: list[int] = []
        self.running = 0
        self.most = 0

    async def execute(self, job: Job) -> JobOutcome:
        self.ran.append(job.id)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
            await asyncio.sleep(0)
        finally:
            self.running -= 1
        return "done"


class Leases:
    def __init__(self) -> None:
        self.held: list[int] = []
        self.timeouts: list[tuple[int, float]] = []
        self.released: list[int] = []

    def hold(self, job_id: int, kind: str, timeout: float) -> None:
        self.held.append(job_id)
        self.timeouts.append((job_id, timeout))

    def running(self, job_id: int, kind: str, timeout: float) -> None:
        self.timeouts.append((job_id, timeout))

    def release(self, job_id: int) -> None:
        self.released.append(job_id)


def producer(*, slots: int, until_empty: bool = True, grace: float = 0.01,
             observed: list[tuple[int, JobOutcome]] | None = None,
             leases: Leases | None = None, prefetch: int = 0) -> Producer:
    online = asyncio.Event()
    online.set()
    seen = observed if observed is not None else []
    return Producer(
        config=WorkerConfig(kinds=("k",), slots=slots, until_empty=until_empty, grace=grace,
                            prefetch=prefetch),
        kinds=("k",), specs={"k": KindSpec("k", _no_handler, KindDefaults(timeout=TIMEOUT))},
        wake=asyncio.Event(), online=online, leases=leases or Leases(), slots=lambda: slots,
        tenants=lambda: None, caps=dict, claimed=lambda rows: None,
        observe=lambda job, outcome, started: seen.append((job.id, outcome)),
        poll_interval=0.05, worker_id="w", job_context=JobContext(),
        stops=Stops(grace=1.0, finishing=lambda job_id: False, abandon=lambda job_id: None))


TIMEOUT = 7.0


async def _no_handler(job: Job, tx: Any) -> None:
    return None


async def test_until_empty_runs_every_claimed_job_then_returns() -> None:
    claims, runs, observed, leases = Claims(1, 2, 3), Runs(), [], Leases()
    p = producer(slots=2, observed=observed, leases=leases)

    await asyncio.wait_for(p.run(claims, runs, Returns()), 10.0)

    assert sorted(runs.ran) == [1, 2, 3]
    assert sorted(observed) == [(1, "done"), (2, "done"), (3, "done")]
    assert claims.limits[0] == 2  # never more than the free slots
    assert all(limit <= 2 for limit in claims.limits)
    assert sorted(set(leases.held)) == sorted(leases.released) == [1, 2, 3]
    assert p.in_flight == {}


async def test_a_full_slot_set_claims_nothing_more_until_a_job_finishes() -> None:
    claims, runs = Claims(1, 2), Runs()
    runs.release.clear()
    p = producer(slots=1, until_empty=False)
    loop = asyncio.create_task(p.run(claims, runs, Returns()))
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
    loop = asyncio.create_task(p.run(claims, runs, Returns()))
    while runs.ran != [1]:
        await asyncio.sleep(0.01)
    p.stopping.set()
    p.wake.set()
    await asyncio.wait_for(loop, 10.0)

    await asyncio.wait_for(p.drain(claims, runs, Returns()), 10.0)

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


# -- the prefetch buffer ----------------------------------------------------------------


async def test_buffered_jobs_run_in_claim_order_never_more_handlers_than_slots() -> None:
    claims, runs, leases = Claims(*range(1, 11)), Runs(), Leases()
    p = producer(slots=2, prefetch=3, leases=leases)

    await asyncio.wait_for(p.run(claims, runs, Returns()), 10.0)

    assert runs.ran == list(range(1, 11))  # FIFO by claim order
    assert runs.most <= 2
    assert claims.limits[0] == 5  # two free slots + three buffered
    assert max(claims.limits) <= 5
    assert sorted(leases.released) == list(range(1, 11)) and p.buffer == {}


class Gate:
    """Runs each job until the test lets one more finish (`permits`)."""

    def __init__(self) -> None:
        self.releasing = False
        self.permits = asyncio.Semaphore(0)

    async def execute(self, job: Job) -> JobOutcome:
        await self.permits.acquire()
        return "done"


class Flowing(Claims):
    """Claims whose every round also writes a `done`: jobs flow, so a full buffer is refilled.
    `late`: a queued `done` is overdue."""

    late = False

    def take(self) -> list[Pending]:
        return [(Completion(0, 1, None), asyncio.get_running_loop().create_future())]

    def overdue(self) -> bool:
        return self.late


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_first_claim_buffers_at_most_the_first_room() -> None:
    """Before any pace is known: a worker whose handlers run long would hold the whole bound
    for a second and hand it back."""
    claims, runs = Claims(*range(1, 300)), Runs()
    p = producer(slots=4, prefetch=512)

    await asyncio.wait_for(p.run(claims, runs, Returns()), 10.0)

    assert claims.limits[0] == 4 + FIRST_ROOM


async def test_no_claim_while_the_buffer_is_above_its_low_water_mark() -> None:
    """While the buffer holds more than half its room, the slots have work for the next
    claim's round trip: a claim then would take only the few jobs there is room for. At the
    mark it goes out, for the room the started jobs left."""
    claims, gate = Flowing(*range(1, 20)), Gate()
    p = producer(slots=4, prefetch=4, until_empty=False)
    loop = asyncio.create_task(p.run(claims, gate, Returns()))
    await settle()
    assert claims.limits == [8] and len(p.buffer) == 4  # four free slots + the room of four

    gate.permits.release()  # job 1 ends, job 5 starts: three buffered, above the mark of two
    await settle()
    assert claims.limits == [8] and len(p.buffer) == 3

    gate.permits.release()  # job 6 starts: two buffered, the mark
    await settle()
    assert claims.limits == [8, 2] and len(p.buffer) == 4

    p.stopping.set()
    p.wake.set()
    await asyncio.wait_for(loop, 10.0)


async def test_an_overdue_done_sends_the_claim_above_the_low_water_mark() -> None:
    claims, gate = Flowing(*range(1, 20)), Gate()
    p = producer(slots=4, prefetch=4, until_empty=False)
    loop = asyncio.create_task(p.run(claims, gate, Returns()))
    await settle()
    assert claims.limits == [8]

    claims.late = True
    gate.permits.release()  # three buffered, above the mark, but a `done` is overdue
    await settle()
    assert claims.limits[:2] == [8, 1]

    p.stopping.set()
    p.wake.set()
    await asyncio.wait_for(loop, 10.0)


async def test_a_buffered_job_is_leased_from_its_claim_and_timed_from_its_start() -> None:
    claims, runs, leases = Claims(1, 2), Runs(), Leases()
    runs.release.clear()
    p = producer(slots=1, prefetch=1, until_empty=False, leases=leases)
    loop = asyncio.create_task(p.run(claims, runs, Returns()))
    try:
        while runs.ran != [1]:
            await asyncio.sleep(0.01)
        assert list(p.buffer) == [2]
        assert (2, math.inf) in leases.timeouts  # held while buffered, with no deadline
        assert (2, TIMEOUT) not in leases.timeouts
        runs.release.set()
        while runs.ran != [1, 2]:
            await asyncio.sleep(0.01)
        assert (2, TIMEOUT) in leases.timeouts  # its timeout counts from its start
    finally:
        p.stopping.set()
        p.wake.set()
        await asyncio.wait_for(loop, 10.0)


async def _running_with_buffer(p: Producer, claims: Claims, runs: Runs, returns: Returns,
                               ) -> asyncio.Task[None]:
    """Run `p` (two slots, a buffer of two) until jobs 1 and 2 run and 3 and 4 wait."""
    runs.release.clear()
    loop = asyncio.create_task(p.run(claims, runs, returns))
    while not (runs.ran == [1, 2] and list(p.buffer) == [3, 4]):
        await asyncio.sleep(0.01)
    return loop


async def test_at_shutdown_the_buffer_is_handed_back_at_once_and_never_runs() -> None:
    claims, runs, returns, leases = Claims(1, 2, 3, 4), Runs(), Returns(), Leases()
    p = producer(slots=2, prefetch=2, until_empty=False, grace=5.0, leases=leases)
    loop = await _running_with_buffer(p, claims, runs, returns)
    p.stopping.set()
    p.wake.set()
    await asyncio.wait_for(loop, 10.0)

    drained = asyncio.create_task(p.drain(claims, runs, returns))
    while not returns.unrun:
        await asyncio.sleep(0.01)
    assert returns.unrun == [[1, 2]]  # everything but the running jobs, before their grace ends
    assert p.buffer == {} and 3 in leases.released and 4 in leases.released
    runs.release.set()
    await asyncio.wait_for(drained, 10.0)
    assert runs.ran == [1, 2]


async def test_a_stopped_or_lost_buffered_job_is_dropped_unrun() -> None:
    claims, runs, returns, leases = Claims(1, 2, 3, 4), Runs(), Returns(), Leases()
    p = producer(slots=2, prefetch=2, until_empty=False, leases=leases)
    loop = await _running_with_buffer(p, claims, runs, returns)
    try:
        p.stop_notified("3")
        p.claim_lost(4, False)
        assert p.buffer == {} and {3, 4} <= set(leases.released)
        runs.release.set()
        await asyncio.sleep(0.2)
        assert runs.ran == [1, 2]
    finally:
        p.stopping.set()
        p.wake.set()
        await asyncio.wait_for(loop, 10.0)


async def test_a_buffer_behind_long_handlers_is_handed_back_and_not_refilled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(producer_module, "BUFFER_WAIT", 0.05)
    claims, runs, returns, leases = Claims(1, 2, 3, 4, 5), Runs(), Returns(), Leases()
    claims.queue = claims.queue[:4]  # job 5 arrives once the buffer has been handed back
    p = producer(slots=2, prefetch=2, until_empty=False, leases=leases)
    loop = await _running_with_buffer(p, claims, runs, returns)
    try:
        while not returns.unrun:
            await asyncio.sleep(0.01)
        assert returns.unrun == [[1, 2]]  # all but the running jobs
        assert p.buffer == {} and {3, 4} <= set(leases.released)
        claims.queue = [row(5)]
        p.wake.set()
        await asyncio.sleep(0.2)  # the slots are still busy and no done flows: no claim
        assert claims.limits[-1] == 0 and [r["id"] for r in claims.queue] == [5]
        runs.release.set()
        while 5 not in runs.ran:  # the slots freed: claiming again
            await asyncio.sleep(0.01)
    finally:
        p.stopping.set()
        p.wake.set()
        await asyncio.wait_for(loop, 10.0)
    assert runs.ran == [1, 2, 5]
