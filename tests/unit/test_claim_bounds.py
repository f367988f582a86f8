"""When a worker's claims are bounded, and where each pair's bound lies (pure decisions)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobpool.core.claim_bounds import (
    FULL_CLAIM_SHARE,
    SLOW_CLAIM,
    SLOW_PAIR,
    SLOW_STREAK,
    ClaimBounds,
    bounds_json,
    pairs_read,
)

A, B, C = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)
T0 = datetime(2026, 12, 4, tzinfo=UTC)
SLOW = timedelta(seconds=SLOW_CLAIM * 2)
FAST = timedelta(seconds=SLOW_CLAIM / 10)
SPAN = SLOW.total_seconds() / FULL_CLAIM_SHARE
"""Seconds of bounded claims after a full claim that took SLOW."""


def row(job_id: int, tenant: uuid.UUID = A, *, took: timedelta = SLOW, priority: int = 100,
        kind: str = "k") -> dict[str, Any]:
    return {"job_kind": kind, "tenant_id": tenant, "priority": priority,
            "available_at": T0 + timedelta(seconds=job_id), "id": job_id,
            "took": took.total_seconds()}


def bound(job_id: int, priority: int = 100) -> tuple[int, datetime, int]:
    return (priority, T0 + timedelta(seconds=job_id), job_id)


def full(bounds: ClaimBounds, rows: list[dict[str, Any]], now: float = 0.0,
         pairs: int = 2) -> str | None:
    return bounds.claimed(rows, full=True, pairs_read=pairs, now=now)


def bounded(bounds: ClaimBounds, rows: list[dict[str, Any]], now: float = 0.0) -> str | None:
    return bounds.claimed(rows, full=False, pairs_read=0, now=now)


def slow_bounds(*rows: dict[str, Any], now: float = 0.0) -> ClaimBounds:
    """Bounds after SLOW_STREAK slow full claims, the last taking `rows`."""
    bounds = ClaimBounds()
    for _ in range(SLOW_STREAK - 1):
        full(bounds, [row(1)], now)
    full(bounds, list(rows), now)
    return bounds


def test_claims_are_full_until_some_full_claims_in_a_row_were_slow() -> None:
    assert SLOW_STREAK > 1  # one slow claim may be the plan or the load
    bounds = ClaimBounds()
    assert bounds.next_bounds(0.0) is None
    for _ in range(SLOW_STREAK - 1):
        assert full(bounds, [row(1)]) is None
        assert bounds.next_bounds(0.0) is None
    assert full(bounds, [row(2), row(3), row(4, B)]) == "bounded"
    assert bounds.next_bounds(SPAN / 2) == {("k", A): bound(3), ("k", B): bound(4)}
    assert bounded(bounds, [row(5)], SPAN / 2) is None
    assert full(bounds, [row(6)], SPAN) is None  # still slow: no news
    assert full(bounds, [row(7, took=FAST)], 2 * SPAN) == "full"
    assert bounds.next_bounds(2 * SPAN) is None
    assert full(bounds, [row(8, took=FAST)], 2 * SPAN) is None


def test_a_claim_long_for_the_many_pairs_it_read_is_not_slow() -> None:
    bounds = ClaimBounds()
    many = int(SLOW.total_seconds() / SLOW_PAIR) + 1  # under SLOW_PAIR seconds per pair
    for job_id in range(SLOW_STREAK + 1):
        assert full(bounds, [row(job_id)], pairs=many) is None
    assert bounds.next_bounds(0.0) is None
    for _ in range(SLOW_STREAK - 1):
        full(bounds, [row(4)], pairs=many - 2)
    assert full(bounds, [row(5)], pairs=many - 2) == "bounded"


def test_a_fast_full_claim_ends_bounded_claims_and_the_streak() -> None:
    bounds = slow_bounds(row(2))
    full(bounds, [row(3, took=FAST)], SPAN / 2)
    assert bounds.next_bounds(SPAN / 2) is None
    full(bounds, [row(4)], SPAN / 2)  # the streak starts again
    assert bounds.next_bounds(SPAN / 2) is None


def test_the_next_full_claim_comes_after_ten_times_the_last_ones_time() -> None:
    long = slow_bounds(row(2, took=timedelta(seconds=0.5)))
    assert long.next_bounds(4.9) is not None
    assert long.next_bounds(5.0) is None


def test_a_bounded_claim_moves_its_pairs_bounds_on_and_never_back() -> None:
    bounds = slow_bounds(row(5), row(1, B))
    bounded(bounds, [row(6), row(9), row(2, B)], SPAN / 4)
    assert bounds.next_bounds(SPAN / 4) == {("k", A): bound(9), ("k", B): bound(2)}
    bounded(bounds, [row(7)], SPAN / 2)  # claimed behind by a full claim's lock in between
    assert bounds.next_bounds(SPAN / 2) == {("k", A): bound(9), ("k", B): bound(2)}


def test_the_index_order_puts_priority_first() -> None:
    bounds = slow_bounds(row(9, priority=100), row(3, priority=200))
    assert bounds.next_bounds(0.0) == {("k", A): bound(3, priority=200)}


def test_a_slow_full_claim_makes_its_own_pairs_the_bounds() -> None:
    bounds = slow_bounds(row(5), row(6, B))
    # it began at A's head, so a job behind A's old bound is the new bound; B lost its turn
    # there, so bounded claims leave B to the next full claim, which starts at its head
    full(bounds, [row(3), row(4, C)], SPAN)
    assert bounds.next_bounds(SPAN) == {("k", A): bound(3), ("k", C): bound(4)}


def test_a_full_claim_that_took_nothing_keeps_claims_bounded() -> None:
    bounds = slow_bounds(row(5))
    assert full(bounds, [], SPAN) is None  # nothing lay behind the bound
    shortest = SLOW_CLAIM / FULL_CLAIM_SHARE
    assert bounds.next_bounds(SPAN + shortest / 2) == {("k", A): bound(5)}
    assert bounds.next_bounds(SPAN + shortest) is None
    fresh = ClaimBounds()
    for _ in range(SLOW_STREAK - 1):
        full(fresh, [row(1)])
        full(fresh, [])  # tells nothing of its speed
    assert full(fresh, [row(2)]) == "bounded"


def test_pairs_read_by_a_full_claim() -> None:
    assert pairs_read(["k", "m"], None, heads=5) == 7  # the heads, and one more per kind
    assert pairs_read(["k", "m"], [A, B, C], heads=1) == 6  # every pair, found or not


def test_bounds_travel_as_json_in_the_index_order() -> None:
    assert json.loads(bounds_json({("k", A): bound(3)})) == [
        {"job_kind": "k", "tenant_id": str(A), "priority": 100,
         "available_at": (T0 + timedelta(seconds=3)).isoformat(), "id": 3}]
