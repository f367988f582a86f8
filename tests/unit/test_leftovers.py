"""What a stopping worker may have left claimed under its id (worker/leftovers.py)."""

from __future__ import annotations

from jobpool.worker.leftovers import Leftovers


def test_a_claimed_job_is_in_doubt_until_its_outcome_is_written() -> None:
    leftovers = Leftovers()
    assert not leftovers.in_doubt
    leftovers.claimed([{"id": 1}, {"id": 2}])
    leftovers.ended(1, "done", stopping=False)
    assert leftovers.in_doubt
    leftovers.ended(2, "lost_claim", stopping=False)
    assert not leftovers.in_doubt


def test_a_refused_write_and_a_hand_back_at_the_grace_periods_end_stay_in_doubt() -> None:
    leftovers = Leftovers()
    leftovers.claimed([{"id": 1}, {"id": 2}, {"id": 3}])
    leftovers.ended(1, "error", stopping=False)
    leftovers.ended(2, "released", stopping=True)  # its hand-back may have failed unseen
    leftovers.ended(3, "released", stopping=False)  # handed back after a dropped connection
    assert leftovers.jobs == {1, 2}


def test_a_claim_without_an_answer_is_in_doubt_until_the_unrun_claims_are_handed_back() -> None:
    leftovers = Leftovers()
    leftovers.claimed([{"id": 1}, {"id": 2}])
    leftovers.claim_unanswered = True
    leftovers.settled([2])  # job 2 runs on
    assert (leftovers.claim_unanswered, leftovers.jobs) == (False, {2})


def test_a_claim_taken_away_is_no_leftover() -> None:
    leftovers = Leftovers()
    leftovers.claimed([{"id": 1}])  # buffered, then stopped before it started
    leftovers.lost(1)
    assert not leftovers.in_doubt
