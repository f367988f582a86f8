import random

import pytest

from jobpool.core.backoff import BackoffPolicy, backoff_delay

NO_JITTER = BackoffPolicy(base=10.0, max_delay=3600.0, jitter=0.0)


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


def test_spec_defaults() -> None:
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
