"""What happens to a running job when its handler returns or raises."""

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
    """`error` made storable (`storable_text`: NUL, control characters and lone surrogates
    escaped, so the real message is kept whatever a handler or a receiver put in it), cut to
    `limit` characters with the cut marked `…[truncated]`."""
    text = storable_text(error)
    if len(text) <= limit:
        return text
    marker = " …[truncated]"
    return text[: limit - len(marker)] + marker
