"""The claim's size: free slots plus the buffer's room, which follows the jobs' pace
(core/prefetch.py)."""

from __future__ import annotations

from jobpool.core.prefetch import (
    FIRST_ROOM,
    LOOKAHEAD,
    buffer_room,
    claim_limit,
    first_room,
    low_water,
    observed_rate,
)


def test_a_claim_takes_the_free_slots_and_the_room_in_the_buffer() -> None:
    assert claim_limit(slots=4, busy=0, buffered=0, room=0, sending=False) == 4
    assert claim_limit(slots=4, busy=0, buffered=0, room=8, sending=False) == 12
    # every slot busy and no `done` flowing (handlers that run long): nothing to wait there
    assert claim_limit(slots=4, busy=4, buffered=0, room=8, sending=False) == 0
    assert claim_limit(slots=4, busy=4, buffered=4, room=8, sending=False) == 0
    assert claim_limit(slots=4, busy=2, buffered=1, room=8, sending=False) == 9
    # jobs flowing: the buffer is topped up with the `done`s that go anyway
    assert claim_limit(slots=4, busy=4, buffered=0, room=8, sending=True) == 8
    assert claim_limit(slots=4, busy=4, buffered=5, room=8, sending=True) == 3
    assert claim_limit(slots=4, busy=4, buffered=0, room=0, sending=True) == 0
    assert low_water(8) == 4 and low_water(1) == 0


def test_the_room_is_what_the_slots_start_in_the_lookahead_within_the_bound() -> None:
    assert buffer_room(1000.0, 128, busy=4) == int(1000 * LOOKAHEAD)
    assert buffer_room(100_000.0, 128, busy=32) == 128  # the bound holds at any pace
    assert buffer_room(2.0, 128, busy=1) == 0  # jobs of half a second: none claimed to wait
    assert buffer_room(1000.0, 0, busy=4) == 0  # no buffer at all
    assert buffer_room(0.0, 16, busy=0) == 0


def test_jobs_of_a_second_on_many_slots_get_no_buffer_to_hand_back() -> None:
    """32 slots of 1-second jobs start 32 jobs/s: a buffer of one job, which waited about a
    second for a slot and was handed back, round after round."""
    assert buffer_room(32.0, 128, busy=32) == 0
    assert buffer_room(320.0, 128, busy=32) == int(320 * LOOKAHEAD)  # jobs of 0.1 s
    assert buffer_room(320.0, 128, busy=0) == int(320 * LOOKAHEAD)


def test_the_rate_follows_the_rounds_and_decays_while_nothing_starts() -> None:
    rate = observed_rate(0.0, 100, 0.1)
    assert 0 < rate < 1000
    for _ in range(20):
        rate = observed_rate(rate, 100, 0.1)
    assert round(rate) == 1000
    for _ in range(20):
        rate = observed_rate(rate, 0, 0.5)  # idle polls
    assert rate < 1
    assert observed_rate(42.0, 5, 0.0) == 42.0  # a round that took no time changes nothing


def test_the_first_claim_holds_the_bound_up_to_the_first_room() -> None:
    assert first_room(4) == 4
    assert first_room(FIRST_ROOM) == FIRST_ROOM
    assert first_room(512) == FIRST_ROOM
    assert first_room(0) == 0  # no buffer at all
