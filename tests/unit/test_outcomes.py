import pytest

from jobpool.core.outcomes import (
    LAST_ERROR_LIMIT,
    DeadLetter,
    Retry,
    decide_failure,
    truncate_error,
)


def test_transient_failure_with_attempts_left_retries() -> None:
    decision = decide_failure(attempts=1, max_attempts=3, error="boom", delay=30, permanent=False)
    assert decision == Retry(30, "boom")


@pytest.mark.parametrize("attempts", [3, 4, 100])
def test_out_of_attempts_goes_to_the_dlq(attempts: int) -> None:
    decision = decide_failure(attempts=attempts, max_attempts=3, error="boom", delay=30,
                              permanent=False)
    assert decision == DeadLetter("boom")


def test_permanent_error_goes_to_the_dlq_at_once() -> None:
    decision = decide_failure(attempts=1, max_attempts=20, error="bad", delay=30, permanent=True)
    assert isinstance(decision, DeadLetter)


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
