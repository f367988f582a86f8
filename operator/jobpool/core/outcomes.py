"""What happens to a running job when its handler returns or raises (spec "Lebenszyklus")."""

from __future__ import annotations

import re
from dataclasses import dataclass

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


_UNSTORABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""NUL and other control characters but tab and newline, and lone surrogates."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape carries it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def truncate_error(error: str, limit: int = LAST_ERROR_LIMIT) -> str:
    """`error` made storable in a PostgreSQL text column: escaped, at most `limit` characters.

    Error texts quote what other systems sent (response bodies, headers, client and DNS
    errors). PostgreSQL refuses NUL in text and UTF-8 cannot encode lone surrogates (how
    Python carries undecodable bytes), and control characters garble terminals; so those
    become escapes (`\\x00`, `\\xff` for an undecodable byte, `\\u0085`), keeping what was
    received visible. A longer text is cut, the cut marked `…[truncated]`.
    """
    text = _UNSTORABLE.sub(_escape, error)
    if len(text) <= limit:
        return text
    marker = " …[truncated]"
    return text[: limit - len(marker)] + marker
