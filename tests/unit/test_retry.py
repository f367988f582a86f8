"""The retry decision: backoff policy, delays, error text, and `decide_retry` as a table."""

from __future__ import annotations

import random

import pytest

from jobpool.core.retry import (
    LAST_ERROR_LIMIT,
    BackoffPolicy,
    DeadLetter,
    Retry,
    RetryDecision,
    backoff_delay,
    decide_retry,
    error_text,
    truncate_error,
)
from jobpool.errors import MAX_RETRY_DELAY, PermanentError, RetryAfter

NO_JITTER = BackoffPolicy(base=10.0, max_delay=3600.0, jitter=0.0)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class NotForRetrying(PermanentError):
    pass


# -- decide_retry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "exc", "expected"),
    [
        # the kind's backoff while attempts are left
        (1, 3, ValueError("boom"), Retry(10, "ValueError: boom")),
        (2, 3, ValueError("boom"), Retry(20, "ValueError: boom")),
        (9, 20, ValueError("boom"), Retry(2560, "ValueError: boom")),
        (12, 20, ValueError("boom"), Retry(3600, "ValueError: boom")),
        (1, 3, TimeoutError("handler exceeded its timeout of 5s"),
         Retry(10, "TimeoutError: handler exceeded its timeout of 5s")),
        # out of attempts: the DLQ
        (3, 3, ValueError("boom"), DeadLetter("ValueError: boom")),
        (4, 3, ValueError("boom"), DeadLetter("ValueError: boom")),
        (100, 3, ValueError("boom"), DeadLetter("ValueError: boom")),
        # PermanentError and its subclasses: the DLQ at once
        (1, 20, PermanentError("bad"), DeadLetter("PermanentError: bad")),
        (1, 20, NotForRetrying("bad"), DeadLetter("NotForRetrying: bad")),
        # RetryAfter: its own delay (cut to what can be stored), and the attempt counts
        (1, 3, RetryAfter(5, "later"), Retry(5.0, "RetryAfter: later")),
        (2, 3, RetryAfter(-1, "later"), Retry(0.0, "RetryAfter: later")),
        (2, 3, RetryAfter(float("nan"), "later"), Retry(0.0, "RetryAfter: later")),
        (2, 3, RetryAfter(10**400, "later"), Retry(MAX_RETRY_DELAY, "RetryAfter: later")),
        (2, 3, RetryAfter(-(10**400), "later"), Retry(0.0, "RetryAfter: later")),
        (3, 3, RetryAfter(5, "later"), DeadLetter("RetryAfter: later")),
        # the error text is built even when str() raises, and made storable
        (1, 3, Unprintable(),
         Retry(10, "Unprintable: (its message could not be built: RuntimeError)")),
        (3, 3, ValueError("a\x00b\udcff"), DeadLetter("ValueError: a\\x00b\\xff")),
    ],
)
def test_decide_retry(
    attempts: int, max_attempts: int, exc: Exception, expected: RetryDecision
) -> None:
    decision = decide_retry(attempts=attempts, max_attempts=max_attempts, exc=exc,
                            policy=NO_JITTER, rng=random.Random(1))
    assert decision == expected


def test_decide_retry_draws_the_jitter_from_the_given_rng() -> None:
    policy = BackoffPolicy(base=30.0, max_delay=86_400.0, jitter=0.5)
    decision = decide_retry(attempts=2, max_attempts=5, exc=ValueError("x"), policy=policy,
                            rng=random.Random(42))
    assert decision == Retry(backoff_delay(2, policy, random.Random(42)), "ValueError: x")


@pytest.mark.parametrize("exc", [ValueError("x" * 100_000), RetryAfter(1, "y" * 100_000)])
def test_decide_retry_cuts_a_long_error_to_the_column(exc: Exception) -> None:
    for attempts in (1, 3):
        decision = decide_retry(attempts=attempts, max_attempts=3, exc=exc, policy=NO_JITTER,
                                rng=random.Random(1))
        assert len(decision.error) == LAST_ERROR_LIMIT
        assert decision.error.endswith("[truncated]")


# -- backoff -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempts", "expected"),
    [(1, 10), (2, 20), (3, 40), (9, 2560), (10, 3600), (40, 3600), (10_000, 3600)],
)
def test_exponential_with_cap(attempts: int, expected: float) -> None:
    assert backoff_delay(attempts, NO_JITTER, random.Random(1)) == expected


@pytest.mark.parametrize("attempts", [0, -5, 1023, 1024, 10**9, 2**63])
def test_any_attempt_count_gives_a_finite_bounded_delay(attempts: int) -> None:
    delay = backoff_delay(attempts, NO_JITTER, random.Random(1))
    assert 10 <= delay <= 3600


def test_jitter_is_bounded_after_the_cap() -> None:
    policy = BackoffPolicy(base=30.0, max_delay=86_400.0, jitter=0.1)
    rng = random.Random(7)
    delays = [backoff_delay(50, policy, rng) for _ in range(2000)]
    assert min(delays) >= 86_400.0
    assert max(delays) <= 86_400.0 * 1.1
    assert len(set(delays)) > 1000  # really random


def test_default_policy() -> None:
    policy = BackoffPolicy()
    assert (policy.base, policy.max_delay, policy.jitter) == (30.0, 86_400.0, 0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"base": -1}, "base"), ({"base": 10, "max_delay": 5}, "max_delay"),
     ({"jitter": 1.5}, "jitter"), ({"base": float("nan")}, "base")],
)
def test_bad_policies_name_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BackoffPolicy(**kwargs)


# -- error text --------------------------------------------------------------------------


def test_error_text_is_type_and_message() -> None:
    assert error_text(KeyError("k")) == "KeyError: 'k'"
    assert error_text(Unprintable()) == (
        "Unprintable: (its message could not be built: RuntimeError)")


class ExitInStr(Exception):
    def __str__(self) -> str:
        raise SystemExit(1)


class InterruptInStr(BaseException):
    def __str__(self) -> str:
        raise KeyboardInterrupt


def test_error_text_never_raises_what_formatting_raises() -> None:
    """A handler's exception whose str() raises SystemExit or KeyboardInterrupt fails only
    its job: the worker that formats it goes on."""
    assert error_text(ExitInStr()) == "ExitInStr: (its message could not be built: SystemExit)"
    assert error_text(InterruptInStr()) == (
        "InterruptInStr: (its message could not be built: KeyboardInterrupt)")


def test_errors_are_truncated_and_marked() -> None:
    text = truncate_error("x" * 100_000)
    assert len(text) == LAST_ERROR_LIMIT
    assert text.endswith("[truncated]")
    assert truncate_error("short") == "short"


def test_unstorable_characters_are_escaped_not_lost() -> None:
    text = truncate_error("a\x00b\udcffc\ud800d\x1b[0m\x85e\tf\ng\rh")
    assert text == "a\\x00b\\xffc\\ud800d\\x1b[0m\\u0085e\tf\ng\\x0dh"
    text.encode()  # PostgreSQL takes it: no NUL, valid UTF-8


def test_nul_characters_and_lone_surrogates_are_escaped_not_lost() -> None:
    assert truncate_error("a\x00b") == "a\\x00b"
    assert truncate_error("x\ud800y") == "x\\ud800y"
    assert truncate_error("é\U0001f600") == "é\U0001f600"
    truncate_error("\udfff" * 10_000).encode("utf-8")  # storable after the cut too
