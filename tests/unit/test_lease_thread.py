"""The lease thread's own health: what it reports while the database is away."""

from __future__ import annotations

import logging

import psycopg
import pytest

from jobpool.worker.leases import LeaseKeeper


def test_a_renewal_with_nothing_to_send_does_not_say_the_database_works_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """During an outage the heartbeat failed while a renewal with no job held (nothing sent)
    succeeded: the log said "works again" every few seconds, and /readyz flickered."""
    keeper = LeaseKeeper("postgresql://unused@127.0.0.1:1/x", worker_id="w", actor="w",
                         lease=30.0, recover=False)

    def fails() -> None:
        raise psycopg.OperationalError("connection refused")

    with caplog.at_level(logging.INFO, logger="jobpool.worker"):
        assert not keeper._attempt(fails)
        assert keeper._attempt(keeper.renew)  # nothing held: nothing sent
        assert keeper.problem == "lease thread failing: OperationalError: connection refused"
        assert keeper._attempt(lambda: None)  # a work that reached the database
        assert keeper.problem is None
    said = [r.getMessage() for r in caplog.records]
    assert said.count("lease thread works again") == 1, said
