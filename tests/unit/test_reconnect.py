"""The one wait for a database that does not answer (`jobpool.db.reconnect`), on tries that
fail when told to: what is retried, what is reported, what ends the wait."""

from __future__ import annotations

import logging
import random

import psycopg
import pytest

from jobpool.db import reconnect
from jobpool.db.reconnect import RECONNECT_FIRST, RECONNECT_MAX, until_answered
from jobpool.errors import SchemaNotMigratedError

DOWN = psycopg.OperationalError("connection refused")


class Tries:
    """Raises what `failures` holds, first first, then answers "pool"; records each call."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.seen: list[int] = []

    async def __call__(self, failed: int) -> str:
        self.seen.append(failed)
        if self.failures:
            raise self.failures.pop(0)
        return "pool"


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses between tries, taken (not slept)."""
    taken: list[float] = []

    async def sleep(seconds: float) -> None:
        taken.append(seconds)

    monkeypatch.setattr(reconnect.asyncio, "sleep", sleep)
    return taken


async def test_an_away_database_is_tried_again_with_growing_capped_pauses(
    pauses: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    missing = SchemaNotMigratedError("the database is not migrated: run `jobpool migrate`")
    tries, reasons = Tries(DOWN, DOWN, missing, *[DOWN] * 6), []
    with caplog.at_level(logging.INFO):
        result = await until_answered(tries, rng=random.Random(1),
                                      log=logging.getLogger("test"), report=reasons.append)

    assert result == "pool"
    assert tries.seen == list(range(10))  # each try knows how many failed before it
    assert reasons[:3] == ["database unreachable: connection refused",
                           "database unreachable: connection refused", str(missing)]
    assert len(pauses) == 9
    assert RECONNECT_FIRST / 2 <= pauses[0] <= RECONNECT_FIRST
    assert all(RECONNECT_MAX / 2 <= p <= RECONNECT_MAX for p in pauses[-3:])
    messages = [r.getMessage() for r in caplog.records]
    assert sum("trying again" in m for m in messages) == 1  # not one line per try
    assert any(m.startswith("database answers after") for m in messages)


async def test_a_try_that_answers_at_once_logs_nothing(
    pauses: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert await until_answered(Tries(), rng=random.Random(1),
                                    log=logging.getLogger("test"), report=print) == "pool"
    assert pauses == [] and caplog.records == []


async def test_failures_carried_in_count_for_the_next_try_and_the_pause(
    pauses: list[float]
) -> None:
    tries = Tries(DOWN)
    await until_answered(tries, rng=random.Random(1), log=logging.getLogger("test"),
                         report=lambda _: None, failures=7)
    assert tries.seen == [7, 8]
    assert pauses[0] >= RECONNECT_MAX / 2  # the eighth failure waits the capped pause


async def test_other_errors_end_the_wait(pauses: list[float]) -> None:
    tries = Tries(DOWN, ValueError("a bad DSN"))
    with pytest.raises(ValueError, match="a bad DSN"):
        await until_answered(tries, rng=random.Random(1), log=logging.getLogger("test"),
                             report=lambda _: None)
    assert tries.seen == [0, 1]
