"""When a worker's claims are bounded, and where each pair's bound lies (pure decisions)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobpool.core.claim_bounds import (
    FULL_CLAIM_EVERY,
    SLOW_CLAIM,
    SLOW_PAIR,
    ClaimBounds,
    claim_pairs,
)

A, B = uuid.UUID(int=1), uuid.UUID(int=2)
T0 = datetime(2026, 12, 4, tzinfo=UTC)
SLOW = timedelta(seconds=SLOW_CLAIM * 2)
FAST = timedelta(seconds=SLOW_CLAIM / 10)


def row(job_id: int, tenant: uuid.UUID = A, *, took: timedelta = SLOW, priority: int = 100,
        kind: str = "k", pairs: int = 2) -> dict[str, Any]:
    return {"job_kind": kind, "tenant_id": tenant, "priority": priority,
            "available_at": T0 + timedelta(seconds=job_id), "id": job_id, "claim_time": took,
            "pairs_read": pairs}


def bound(job_id: int, priority: int = 100) -> tuple[int, datetime, int]:
    return (priority, T0 + timedelta(seconds=job_id), job_id)


def slow_bounds(*rows: dict[str, Any], now: float = 0.0) -> ClaimBounds:
    """Bounds after two slow full claims, the second taking `rows`."""
    bounds = ClaimBounds()
    bounds.claimed([row(1)], full=True, now=now)
    bounds.claimed(list(rows), full=True, now=now)
    return bounds


def test_claims_are_full_until_two_full_claims_in_a_row_were_slow() -> None:
    bounds = ClaimBounds()
    assert bounds.next_bounds(0.0) is None
    assert bounds.claimed([row(1)], full=True, now=0.0) is None
    assert bounds.next_bounds(0.0) is None  # one slow claim may be the plan or the load
    assert bounds.claimed([row(2), row(3), row(4, B)], full=True, now=0.0) == "bounded"
    assert bounds.next_bounds(0.5) == {("k", A): bound(3), ("k", B): bound(4)}
    assert bounds.claimed([row(5)], full=False, now=0.5) is None
    assert bounds.claimed([row(6)], full=True, now=1.0) is None  # still slow: no news
    assert bounds.claimed([row(7, took=FAST)], full=True, now=2.0) == "full"
    assert bounds.claimed([row(8, took=FAST)], full=True, now=2.0) is None


def test_a_claim_long_for_the_many_pairs_it_read_is_not_slow() -> None:
    bounds = ClaimBounds()
    many = int(SLOW.total_seconds() / SLOW_PAIR) + 1  # under SLOW_PAIR seconds per pair
    for job_id in (1, 2, 3):
        assert bounds.claimed([row(job_id, pairs=many)], full=True, now=0.0) is None
    assert bounds.next_bounds(0.0) is None
    bounds.claimed([row(4, pairs=many - 2)], full=True, now=0.0)
    assert bounds.claimed([row(5, pairs=many - 2)], full=True, now=0.0) == "bounded"


def test_a_fast_full_claim_ends_bounded_claims() -> None:
    bounds = slow_bounds(row(2))
    bounds.claimed([row(3, took=FAST)], full=True, now=FULL_CLAIM_EVERY)
    assert bounds.next_bounds(FULL_CLAIM_EVERY) is None
    bounds.claimed([row(4)], full=True, now=FULL_CLAIM_EVERY)  # the streak starts again
    assert bounds.next_bounds(FULL_CLAIM_EVERY) is None


def test_the_next_full_claim_comes_after_the_interval_or_ten_times_its_own_time() -> None:
    bounds = slow_bounds(row(2))
    assert bounds.next_bounds(FULL_CLAIM_EVERY - 0.01) is not None
    assert bounds.next_bounds(FULL_CLAIM_EVERY) is None
    long = slow_bounds(row(2, took=timedelta(seconds=0.5)))
    assert long.next_bounds(4.9) is not None
    assert long.next_bounds(5.0) is None


def test_a_bounded_claim_moves_its_pairs_bounds_on_and_never_back() -> None:
    bounds = slow_bounds(row(5))
    bounds.claimed([row(6), row(9), row(2, B)], full=False, now=0.1)
    assert bounds.next_bounds(0.1) == {("k", A): bound(9), ("k", B): bound(2)}
    bounds.claimed([row(7)], full=False, now=0.2)  # claimed behind by a claim in between
    assert bounds.next_bounds(0.2) == {("k", A): bound(9), ("k", B): bound(2)}


def test_the_index_order_puts_priority_first() -> None:
    bounds = slow_bounds(row(9, priority=100), row(3, priority=200))
    assert bounds.next_bounds(0.0) == {("k", A): bound(3, priority=200)}


def test_a_slow_full_claim_restarts_the_bounds_from_what_it_took() -> None:
    bounds = slow_bounds(row(5))
    # it began at the pair's head, so a job behind the old bound is the new bound
    bounds.claimed([row(3)], full=True, now=FULL_CLAIM_EVERY)
    assert bounds.next_bounds(FULL_CLAIM_EVERY) == {("k", A): bound(3)}


def test_a_pair_not_claimed_from_for_a_whole_interval_is_dropped() -> None:
    bounds = slow_bounds(row(5), row(6, B))
    bounds.claimed([], full=True, now=1.0)  # found nothing: both were claimed from since
    assert bounds.next_bounds(1.0) == {("k", A): bound(5), ("k", B): bound(6)}
    bounds.claimed([row(7)], full=False, now=1.5)  # A claimed from since, B not
    bounds.claimed([], full=True, now=2.0)
    assert bounds.next_bounds(2.0) == {("k", A): bound(7)}
    bounds.claimed([], full=True, now=3.0)
    assert bounds.next_bounds(3.0) is None


def test_a_full_claim_that_took_nothing_tells_nothing_before_the_streak() -> None:
    bounds = ClaimBounds()
    bounds.claimed([row(1)], full=True, now=0.0)
    bounds.claimed([], full=True, now=0.0)
    bounds.claimed([row(2)], full=True, now=0.0)  # the second slow one that took jobs
    assert bounds.next_bounds(0.0) == {("k", A): bound(2)}


def test_pairs_of_every_tenant_are_left_to_the_claims_walk() -> None:
    assert claim_pairs(["k"], None) is None


def test_pairs_of_a_bounded_claim_are_its_bounds() -> None:
    pairs = json.loads(claim_pairs(["k"], None, {("k", A): bound(3)}) or "")
    assert pairs == [{"job_kind": "k", "tenant_id": str(A), "priority": 100,
                      "available_at": (T0 + timedelta(seconds=3)).isoformat(), "id": 3}]


def test_pairs_of_own_tenants_start_at_each_bound_else_before_every_job() -> None:
    pairs = json.loads(claim_pairs(["k", "m", "k"], [A, B, A], {("k", B): bound(3)}) or "")
    assert [(p["job_kind"], p["tenant_id"]) for p in pairs] == [
        ("k", str(A)), ("k", str(B)), ("m", str(A)), ("m", str(B))]
    start = {"priority": -32768, "available_at": "-infinity", "id": 0}
    assert {key: pairs[0][key] for key in start} == start
    assert pairs[1]["id"] == 3
