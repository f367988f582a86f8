"""The completer's batching and outage paths, on a fake of its own store protocol.

The store's SQL runs against PostgreSQL in tests/integration/test_batched_completion.py;
here the store only records what the completer sends and fails when told to, so that each
path (a lost connection mid-completion, a re-send, the one-by-one fallback, a claim failing
on a live connection) is driven on purpose.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Mapping, Sequence

import psycopg
import pytest

from jobpool.db.store import UNCAPPED, Completion, Row, Written
from jobpool.worker import completer as completer_module
from jobpool.worker.completer import Completer, ResultRefused


class FakeStore:
    """Records each `complete_and_claim` and `complete_alone`; raises what `fail` holds."""

    def __init__(self) -> None:
        self.sent: list[list[Completion]] = []
        self.alone: list[Completion] = []
        self.fail: list[BaseException] = []
        """Raised by the next `complete_and_claim` calls, first first."""
        self.refuse_alone: dict[int, BaseException] = {}
        """Job id -> what `complete_alone` raises for it."""
        self.lost_claims: set[int] = set()
        self.locked: set[int] = set()
        """Jobs whose rows another session holds locked (reported busy)."""
        self.claimable: list[Row] = []

    async def complete_and_claim(
        self, completions: Sequence[Completion], *, kinds: Sequence[str],
        tenants: Sequence[uuid.UUID] | None, limit: int, caps: Mapping[str, int] = UNCAPPED,
    ) -> Written:
        self.sent.append(list(completions))
        if self.fail:
            raise self.fail.pop(0)
        claimed, self.claimable = self.claimable[:limit], self.claimable[limit:]
        ids = {c.job_id for c in completions} - self.lost_claims
        return Written(ids - self.locked, claimed, ids & self.locked)

    async def complete_alone(self, completion: Completion) -> bool:
        self.alone.append(completion)
        if completion.job_id in self.refuse_alone:
            raise self.refuse_alone[completion.job_id]
        return completion.job_id not in self.lost_claims


class FakeLink:
    def __init__(self) -> None:
        self.lost_with: list[psycopg.Error] = []
        self.replaced: list[tuple[str, float]] = []

    def lost(self, exc: psycopg.Error) -> None:
        self.lost_with.append(exc)

    def replace_connections(self, problem: str, *, pause: float) -> None:
        self.replaced.append((problem, pause))


def completer(store: FakeStore, link: FakeLink, *, running: int = 4, slots: int = 4,
              delay: float = 60.0, claim_coming: bool = False) -> Completer:
    return Completer(store, link, wake=asyncio.Event(), running=lambda: running,
                     slots=lambda: slots, delay=delay, rng=random.Random(7),
                     claim_coming=lambda: claim_coming)


async def queued(c: Completer, *ids: int) -> list[asyncio.Task[bool]]:
    """Jobs `ids` queue their `done` (each on a task of its own, waiting for the answer)."""
    tasks = [asyncio.create_task(c.complete(Completion(i, 1, None))) for i in ids]
    await asyncio.sleep(0)
    return tasks


async def send(c: Completer, *, limit: int = 0) -> list[Row]:
    return await c.send(c.take(), kinds=("k",), tenants=None, limit=limit, caps=dict)


LOST = psycopg.OperationalError("server closed the connection unexpectedly")


async def test_the_queued_dones_go_in_one_transaction_with_the_claim() -> None:
    store, link = FakeStore(), FakeLink()
    store.claimable = [{"id": 10}, {"id": 11}]
    store.lost_claims = {2}
    c = completer(store, link)
    tasks = await queued(c, 1, 2)

    claimed = await send(c, limit=2)

    assert [[x.job_id for x in batch] for batch in store.sent] == [[1, 2]]
    assert claimed == [{"id": 10}, {"id": 11}]
    assert [await t for t in tasks] == [True, False]  # 2 lost its claim
    assert c.queue == []


async def test_a_done_whose_row_is_locked_elsewhere_waits_for_a_later_batch() -> None:
    """The claim's transaction passed over the row another session held: the job's `done`
    is not answered yet (neither written nor lost) and goes with the next batch."""
    store, link = FakeStore(), FakeLink()
    store.locked = {2}
    c = completer(store, link)
    tasks = await queued(c, 1, 2)

    await send(c, limit=0)
    await asyncio.sleep(0)
    assert tasks[0].done() and await tasks[0]
    assert not tasks[1].done()
    assert [x.job_id for x, _ in c.queue] == [2] and c.queued_at is not None

    store.locked = set()
    await send(c, limit=0)
    assert await tasks[1]
    assert [[x.job_id for x in batch] for batch in store.sent] == [[1, 2], [2]]
    assert c.locked_since == {}


async def test_a_done_held_back_by_a_lock_is_sent_again_while_the_worker_drains(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At shutdown only `flush` writes, woken when a `done` is queued: a `done` passed over
    for a lock wakes it again a moment later, else it would wait for the grace period's end
    and its job, finished, would be handed back and run again. One that waits long is
    named, once."""
    monkeypatch.setattr(completer_module, "LOCKED_RETRY", 0.01)
    monkeypatch.setattr(completer_module, "LOCKED_WARN_AFTER", 0.05)
    store, link = FakeStore(), FakeLink()
    store.locked = {2}
    c = completer(store, link)
    flusher = asyncio.create_task(c.flush())
    try:
        tasks = await queued(c, 1, 2)
        c.wake.set()
        assert await asyncio.wait_for(tasks[0], 5)
        await asyncio.sleep(0.2)
        assert not tasks[1].done() and len(store.sent) > 3  # tried again and again
        store.locked = set()
        assert await asyncio.wait_for(tasks[1], 5)
    finally:
        flusher.cancel()
    said = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("job 2: its done has waited"), said


async def test_half_the_slots_waiting_wake_the_fetch_loop_unless_a_claim_is_coming() -> None:
    """Buffered jobs take the freed slots, and the buffer's low-water mark sends the next claim
    with the queued `done`s: a wake-up per `done` would only send smaller claims."""
    for coming, woken in ((False, True), (True, False)):
        c = completer(FakeStore(), FakeLink(), running=4, slots=4, claim_coming=coming)
        await queued(c, 1, 2)
        assert c.wake.is_set() is woken, coming


async def test_while_a_claim_is_coming_a_done_waits_for_it_at_most_done_wait() -> None:
    """Slots that took long jobs keep the buffer above its mark: the `done` does not wait
    for the buffer's hand-back (a second) but wakes the loop once overdue."""
    c = completer(FakeStore(), FakeLink(), delay=0.0, claim_coming=True)
    await queued(c, 1)
    assert not c.overdue() and not c.wake.is_set()
    await asyncio.wait_for(c.wake.wait(), 5.0)
    assert c.overdue()
    c.take()
    assert not c.overdue()


async def test_nothing_to_write_and_no_slot_free_sends_nothing() -> None:
    store = FakeStore()
    c = completer(store, FakeLink())
    assert await send(c, limit=0) == []
    assert store.sent == []


async def test_a_connection_lost_mid_completion_queues_the_batch_again_marked_resent() -> None:
    store, link = FakeStore(), FakeLink()
    store.fail = [LOST]
    c = completer(store, link)
    tasks = await queued(c, 1, 2)

    assert await send(c, limit=3) == []

    assert link.lost_with == [LOST]
    assert [(x.job_id, x.resent) for x, _ in c.queue] == [(1, True), (2, True)]
    assert not any(t.done() for t in tasks)  # the jobs still wait for their answer

    await send(c, limit=3)  # the next claim writes them again, asking whether they committed
    assert [(x.job_id, x.resent) for x in store.sent[-1]] == [(1, True), (2, True)]
    assert [await t for t in tasks] == [True, True]


async def test_a_resent_batch_goes_ahead_of_dones_queued_meanwhile() -> None:
    store, link = FakeStore(), FakeLink()
    store.fail = [LOST]
    c = completer(store, link)
    first = await queued(c, 1)
    await send(c)
    later = await queued(c, 2)

    await send(c)

    assert [[(x.job_id, x.resent) for x in batch] for batch in store.sent] == [
        [(1, False)], [(1, True), (2, False)]]
    assert [await t for t in [*first, *later]] == [True, True]


async def test_a_refused_batch_is_written_one_by_one_and_only_the_refused_job_fails() -> None:
    store, link = FakeStore(), FakeLink()
    store.fail = [psycopg.errors.DataError("unsupported Unicode escape sequence")]
    store.refuse_alone = {2: psycopg.errors.DataError("unsupported Unicode escape sequence")}
    c = completer(store, link)
    tasks = await queued(c, 1, 2, 3)

    await send(c, limit=2)

    assert [x.job_id for x in store.alone] == [1, 2, 3]
    assert await tasks[0] is True
    with pytest.raises(ResultRefused, match="refused to record the job done"):
        await tasks[1]
    assert await tasks[2] is True
    assert link.lost_with == [] and link.replaced == [] and c.queue == []


async def test_a_connection_lost_one_by_one_queues_the_rest_again() -> None:
    store, link = FakeStore(), FakeLink()
    store.fail = [psycopg.errors.IntegrityError("violates check constraint")]
    store.refuse_alone = {2: LOST}
    c = completer(store, link)
    tasks = await queued(c, 1, 2, 3)

    await send(c)

    assert await tasks[0] is True
    assert [(x.job_id, x.resent) for x, _ in c.queue] == [(2, True), (3, True)]
    assert link.lost_with == [LOST]
    store.refuse_alone = {}
    await send(c)
    assert [await t for t in tasks[1:]] == [True, True]


async def test_another_refusal_one_by_one_replaces_the_connections() -> None:
    store, link = FakeStore(), FakeLink()
    store.fail = [psycopg.errors.DataError("bad value")]
    store.refuse_alone = {1: psycopg.errors.FeatureNotSupported("prepared statement")}
    c = completer(store, link)
    await queued(c, 1, 2)

    await send(c)

    assert [x.job_id for x, _ in c.queue] == [1, 2]
    assert len(link.replaced) == 1 and link.replaced[0][0].startswith("claim failed:")


async def test_a_claim_failing_on_a_live_connection_replaces_the_connections_ever_later() -> None:
    store, link = FakeStore(), FakeLink()
    store.fail = [RuntimeError("cannot read the claimed rows")] * 4
    c = completer(store, link)
    tasks = await queued(c, 1)

    for _ in range(4):
        assert await send(c, limit=1) == []

    assert [problem for problem, _ in link.replaced] == [
        "claim failed: RuntimeError: cannot read the claimed rows"] * 4
    pauses = [pause for _, pause in link.replaced]
    assert pauses[-1] > pauses[0]
    assert c.claim_failures == 4
    assert [(x.job_id, x.resent) for x, _ in c.queue] == [(1, True)]

    await send(c, limit=1)
    assert c.claim_failures == 0
    assert await tasks[0] is True


async def test_the_fetch_loop_is_woken_once_half_the_slots_wait_on_a_done() -> None:
    c = completer(FakeStore(), FakeLink(), running=4, slots=4)
    await queued(c, 1)
    assert not c.wake.is_set()
    await queued(c, 2)
    assert c.wake.is_set()


async def test_a_lone_done_wakes_the_fetch_loop_after_the_delay() -> None:
    c = completer(FakeStore(), FakeLink(), running=4, slots=8, delay=0.01)
    await queued(c, 1)
    assert not c.wake.is_set()
    await asyncio.wait_for(c.wake.wait(), 5.0)


async def test_flush_writes_what_finishing_jobs_queue_and_claims_nothing() -> None:
    store = FakeStore()
    store.claimable = [{"id": 10}]
    c = completer(store, FakeLink(), running=2, slots=2)
    flusher = asyncio.create_task(c.flush())
    try:
        tasks = await queued(c, 1, 2)
        assert await asyncio.wait_for(asyncio.gather(*tasks), 5.0) == [True, True]
    finally:
        flusher.cancel()
    assert store.claimable == [{"id": 10}]
