"""Which jobs a claim takes: priority across levels, turns between tenants within a level,
rate-limited pairs capped at their tokens (or left out), never one job twice."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import pytest

from integration.helpers import add_tenant
from jobpool.db.store import UNCAPPED, QueueStore

Conn = psycopg.AsyncConnection[dict[str, Any]]

KIND = "test_record"
OTHER = "test_fail"


async def _jobs(conn: Conn, tenant: uuid.UUID, count: int, *, kind: str = KIND,
                priority: int = 100, age: float = 30.0, later: float = 0.0) -> list[int]:
    """`count` pending jobs, the first available `age` seconds ago, each `later` after the
    previous one (seconds; all of them available by the time of the claim)."""
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, priority, available_at, max_attempts)"
        " SELECT %s, %s, %s, now() - make_interval(secs => %s) + make_interval(secs => %s * g),"
        " 5 FROM generate_series(0, %s - 1) g ORDER BY g RETURNING id",
        (tenant, kind, priority, age, later, count))
    return [int(row["id"]) for row in await cur.fetchall()]


async def _one_by_one(store: QueueStore, kinds: Sequence[str] = (KIND,),
                      caps: Mapping[str, int] = UNCAPPED) -> list[dict[str, Any]]:
    """Claim with one free slot until nothing is left; the rows in claim order."""
    claimed: list[dict[str, Any]] = []
    while rows := await store.claim(kinds=kinds, tenants=None, limit=1, caps=caps):
        claimed.extend(rows)
    return claimed


async def test_a_lower_priority_number_is_claimed_before_any_higher_one(
        conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    urgent_a = await _jobs(conn, a, 3, priority=50, later=0.001)
    bulk_b = await _jobs(conn, b, 3, priority=100, age=60, later=0.001)  # older, less urgent
    urgent_b = await _jobs(conn, b, 1, priority=10)
    order = [row["id"] for row in await _one_by_one(store)]
    assert order[0] == urgent_b[0]
    assert set(order[1:4]) == set(urgent_a)
    assert order[4:] == bulk_b


async def test_tenants_take_turns_within_a_priority_level(conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    flood = await _jobs(conn, a, 6, age=60, later=0.001)  # queued first
    few = await _jobs(conn, b, 2, later=0.001)
    order = [row["id"] for row in await _one_by_one(store)]
    assert order == [flood[0], few[0], flood[1], few[1], *flood[2:]]


async def test_one_claim_of_several_slots_serves_every_tenant_with_ready_work(
        conn: Conn, store: QueueStore) -> None:
    tenants = [await add_tenant(conn, key) for key in ("a", "b", "c")]
    await _jobs(conn, tenants[0], 50, age=60, later=0.001)
    for tenant in tenants[1:]:
        await _jobs(conn, tenant, 2, later=0.001)
    claimed = await store.claim(kinds=[KIND], tenants=None, limit=6)
    assert sorted(str(row["tenant_id"]) for row in claimed) == sorted(
        str(tenant) for tenant in tenants for _ in range(2))


async def test_a_tenant_takes_turns_once_across_its_kinds(conn: Conn, store: QueueStore) -> None:
    """A tenant with ready jobs of two kinds does not get two turns to the other's one."""
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    await _jobs(conn, a, 5, age=60, later=0.001)
    await _jobs(conn, a, 5, kind=OTHER, age=59, later=0.001)
    await _jobs(conn, b, 5, later=0.001)
    claimed = await store.claim(kinds=[KIND, OTHER], tenants=None, limit=4)
    assert sorted(str(row["tenant_id"]) for row in claimed) == sorted([str(a)] * 2 + [str(b)] * 2)


async def test_throttled_pairs_are_never_claimed(conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    throttled = await _jobs(conn, a, 5, age=60)
    other_kind = await _jobs(conn, a, 2, kind=OTHER)
    other_tenant = await _jobs(conn, b, 2)
    claimed = await _one_by_one(store, kinds=[KIND, OTHER], caps={f"{a}/{KIND}": 0})
    assert sorted(row["id"] for row in claimed) == sorted(other_kind + other_tenant)
    assert not {row["id"] for row in claimed} & set(throttled)


@pytest.mark.parametrize("cap", [1, 2])
async def test_a_claim_takes_no_more_of_a_limited_pair_than_its_cap(
        conn: Conn, store: QueueStore, cap: int) -> None:
    """A's turn comes first (queued first), and a claim of 8 could take 4 of its jobs: it
    takes `cap`, the rest of the claim goes to the other tenant and to A's other kind."""
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    limited = await _jobs(conn, a, 20, age=60, later=0.001)
    other_kind = await _jobs(conn, a, 2, kind=OTHER, age=50, later=0.001)
    other_tenant = await _jobs(conn, b, 20, later=0.001)
    claimed = [row["id"] for row in await store.claim(
        kinds=[KIND, OTHER], tenants=None, limit=8, caps={f"{a}/{KIND}": cap})]
    assert len(claimed) == 8
    assert sorted(set(claimed) & set(limited)) == limited[:cap]  # its first ones, in order
    assert set(other_kind) <= set(claimed)
    assert len(set(claimed) & set(other_tenant)) == 8 - cap - len(other_kind)
    # a cap at or above the claim's limit limits nothing: uncapped, A would take half
    again = await store.claim(kinds=[KIND], tenants=None, limit=4, caps={f"{a}/{KIND}": 99})
    assert len([row for row in again if row["id"] in set(limited)]) == 2


async def test_a_kinds_cap_bounds_each_of_its_pairs_also_of_tenants_without_one(
        conn: Conn, store: QueueStore) -> None:
    """A provider-capped kind (`*/kind`): its cap bounds every pair of the kind, those that
    carry no cap of their own too; a pair's own cap below it wins."""
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    first = await _jobs(conn, a, 6, age=60, later=0.001)
    second = await _jobs(conn, b, 6, later=0.001)
    claimed = {row["id"] for row in await store.claim(
        kinds=[KIND], tenants=None, limit=8, caps={f"*/{KIND}": 2, f"{b}/{KIND}": 1})}
    assert claimed == set(first[:2]) | set(second[:1])
    assert await store.claim(kinds=[KIND], tenants=None, limit=8, caps={f"*/{KIND}": 0}) == []


async def test_a_negative_cap_is_refused_before_anything_is_claimed(
        conn: Conn, store: QueueStore) -> None:
    a = await add_tenant(conn, "a")
    await _jobs(conn, a, 2)
    with pytest.raises(ValueError, match=f"claim caps must be >= 0 jobs, got -1 for {a}/{KIND}"):
        await store.claim(kinds=[KIND], tenants=None, limit=2, caps={f"{a}/{KIND}": -1})
    assert len(await store.claim(kinds=[KIND], tenants=None, limit=2)) == 2


async def test_jobs_not_yet_available_or_of_other_kinds_are_not_claimed(
        conn: Conn, store: QueueStore) -> None:
    a = await add_tenant(conn, "a")
    await _jobs(conn, a, 3, kind=OTHER, age=60)
    await _jobs(conn, a, 2, age=-3600)  # available in an hour
    assert await store.claim(kinds=[KIND], tenants=None, limit=4) == []
    ready = await _jobs(conn, a, 1)
    assert [row["id"] for row in await store.claim(kinds=[KIND], tenants=None, limit=4)] == ready


async def test_a_tenant_lane_claims_its_own_tenants_in_turns(conn: Conn, store: QueueStore) -> None:
    a, b, c = [await add_tenant(conn, key) for key in ("a", "b", "c")]
    await _jobs(conn, c, 20, age=120)  # not this lane's
    first = await _jobs(conn, a, 3, age=60, later=0.001)
    second = await _jobs(conn, b, 1)
    claimed = await store.claim(kinds=[KIND], tenants=[a, b], limit=2)
    assert sorted(row["id"] for row in claimed) == sorted([first[0], second[0]])


async def test_concurrent_claims_never_take_one_job_twice(
        conn: Conn, store: QueueStore) -> None:
    tenants = [await add_tenant(conn, f"t{n}") for n in range(4)]
    ids: list[int] = []
    for n, tenant in enumerate(tenants):
        ids += await _jobs(conn, tenant, 40, kind=(KIND, OTHER)[n % 2], later=0.001)
    stores = [QueueStore(store.pool, worker_id=f"host/{n}/w", actor="w") for n in range(6)]

    async def drain(claimer: QueueStore) -> list[int]:
        taken: list[int] = []
        while rows := await claimer.claim(kinds=[KIND, OTHER], tenants=None, limit=3):
            taken += [row["id"] for row in rows]
        return taken

    try:
        results = await asyncio.gather(*(drain(claimer) for claimer in stores))
    finally:
        for claimer in stores:
            await claimer.close()
    taken = [job_id for result in results for job_id in result]
    assert len(taken) == len(set(taken))
    assert sorted(taken) == sorted(ids)


async def _turn_version(conn: Conn, tenant: uuid.UUID) -> tuple[str, str]:
    """The tenant's turn row's version (ctid, xmin): it changes whenever the row is written."""
    cur = await conn.execute(
        "SELECT ctid::text AS ctid, xmin::text AS xmin FROM mdm.aa_tenant_turn"
        " WHERE tenant_id = %s", (tenant,))
    row = await cur.fetchone()
    assert row is not None
    return row["ctid"], row["xmin"]


async def test_a_tenant_served_alone_with_the_newest_turn_writes_no_turn(
        conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    await _jobs(conn, b, 1)
    assert len(await store.claim(kinds=[KIND], tenants=None, limit=1)) == 1  # b's turn, older
    await _jobs(conn, a, 12, later=0.001)
    assert len(await store.claim(kinds=[KIND], tenants=None, limit=4)) == 4  # a's first turn
    first = await _turn_version(conn, a)
    assert len(await store.claim(kinds=[KIND], tenants=None, limit=4)) == 4
    assert len(await store.claim(kinds=[KIND], tenants=None, limit=4)) == 4
    assert await _turn_version(conn, a) == first


async def test_a_tenant_back_after_another_drained_alone_goes_first(
        conn: Conn, store: QueueStore) -> None:
    """The tenant served alone had an older turn than the one coming back: its solo claim
    still moves it behind, so the returning tenant is not made to wait."""
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    await _jobs(conn, a, 1, age=60)
    await _jobs(conn, b, 1, age=50)
    assert [row["tenant_id"] for row in await _one_by_one(store)] == [a, b]
    later_a = await _jobs(conn, a, 3, age=40, later=0.001)
    assert [row["id"] for row in await store.claim(kinds=[KIND], tenants=None, limit=1)] == [
        later_a[0]]  # a alone
    back_b = await _jobs(conn, b, 1, age=10)  # available after a's remaining jobs
    order = [row["id"] for row in await _one_by_one(store)]
    assert order == [back_b[0], *later_a[1:]]
