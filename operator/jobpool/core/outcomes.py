"""What happens to a running job when its handler returns or raises (spec "Lebenszyklus")."""

from __future__ import annotations

from dataclasses import dataclass

from jobpool.core.jsondata import storable_text

LAST_ERROR_LIMIT = 4000
"""Characters kept of an error message in `aa_job.last_error` (the column allows 4096)."""


@dataclass(frozen=True)
class Retry:
    """Back to pending, runnable again after `delay` seconds."""

    delay: float
    error: str


@dataclass(frozen=True)
class DeadLetter:
    """Parked in the DLQ for an admin to replay or discard."""

    error: str


Failure = Retry | DeadLetter


def decide_failure(
    *, attempts: int, max_attempts: int, error: str, delay: float, permanent: bool
) -> Failure:
    """Retry with `delay`, or dead-letter a job that is permanent or out of attempts.

    attempts: claims so far, including the one that failed. delay: seconds, from the backoff
    or the handler's own retry-after.
    """
    message = truncate_error(error)
    if permanent or attempts >= max_attempts:
        return DeadLetter(message)
    return Retry(delay, message)


def truncate_error(error: str, limit: int = LAST_ERROR_LIMIT) -> str:
    """Cut `error` to `limit` characters, marking the cut, with NUL characters and lone
    surrogates escaped (`\\x00`, `\\ud800`): PostgreSQL text cannot hold them, and the real
    message must be stored whatever a handler put in it."""
    text = storable_text(error)
    if len(text) <= limit:
        return text
    marker = " …[truncated]"
    return text[: limit - len(marker)] + marker
