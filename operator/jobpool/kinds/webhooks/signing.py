"""Standard Webhooks signing and what a receiver's HTTP answer means (outbox_dispatch).

Signing follows https://www.standardwebhooks.com: headers `webhook-id`, `webhook-timestamp`
(Unix seconds) and `webhook-signature` = `v1,` + base64(HMAC-SHA256(key, "id.timestamp.body")),
where the key is the base64 part of a `whsec_...` secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from jobpool.core.retry import truncate_error
from jobpool.errors import JobpoolError

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"
TIMESTAMP_TOLERANCE = 300
"""Seconds a receiver accepts between `webhook-timestamp` and its own clock (both ways)."""
MAX_RETRY_AFTER = 86_400.0
"""Seconds: a longer Retry-After is cut to this (the spec's backoff cap)."""
RETRYABLE_STATUSES = frozenset({408, 429})
EXCERPT_CHARS = 300
"""Characters of a response body (and of a redirect's Location) quoted in `last_error`."""
REASON_CHARS = 1000
"""Characters of an HTTP client, TLS or DNS error message kept in `last_error`."""


class WebhookVerificationError(JobpoolError, ValueError):
    """A webhook request whose headers or signature do not verify."""


def signing_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret; raises ValueError for another shape."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError("a webhook secret must be whsec_ followed by base64") from None
    if len(key) < 16:
        raise ValueError("a webhook secret must hold at least 16 bytes of key")
    return key


def encode_secret(key: bytes) -> str:
    """The `whsec_<base64>` form of a raw key."""
    return SECRET_PREFIX + base64.b64encode(key).decode("ascii")


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 signature>` of `msg_id.timestamp.body` with `secret`'s key."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(signing_key(secret), content, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode('ascii')}"


def signed_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt (timestamp: Unix seconds)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify_webhook(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: int,
    tolerance: int = TIMESTAMP_TOLERANCE,
) -> str:
    """Check a received webhook; return its `webhook-id`.

    headers: the request's headers (looked up case-insensitively). now: the receiver's clock,
    Unix seconds. Raises WebhookVerificationError for a missing header, a timestamp outside
    `tolerance` seconds, or no matching `v1` signature.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        msg_id = lowered["webhook-id"]
        stamp = lowered["webhook-timestamp"]
        signatures = lowered["webhook-signature"]
    except KeyError as exc:
        raise WebhookVerificationError(f"missing header {exc.args[0]}") from None
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp is not an integer: {stamp!r}") from None
    if abs(now - timestamp) > tolerance:
        raise WebhookVerificationError(f"webhook-timestamp {timestamp} is too far from {now}")
    expected = sign(secret, msg_id, timestamp, body).partition(",")[2]
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version == SIGNATURE_VERSION and hmac.compare_digest(value, expected):
            return msg_id
    raise WebhookVerificationError("no webhook-signature matches")


def event_body(event_type: str, timestamp: str, data_json: str) -> bytes:
    """The request body of an event: `{"data":…,"timestamp":…,"type":…}` as UTF-8.

    data_json: the payload as PostgreSQL renders the stored jsonb (`payload::text`), placed
    as is, so numbers arrive digit for digit (jsonb keeps numerics exactly; a float would
    not: 12345678901234567890.12 must not become 1.2345678901234567e+19). timestamp: the
    event's RFC 3339 UTC time. Computed once per event and stored, so every attempt sends
    the same bytes.
    """
    return (f'{{"data":{data_json},"timestamp":{json.dumps(timestamp)},'
            f'"type":{json.dumps(event_type, ensure_ascii=False)}}}').encode()


@dataclass(frozen=True)
class Delivered:
    """2xx: the receiver has the event."""

    status: int


@dataclass(frozen=True)
class Transient:
    """A failure that may pass (408, 429, 5xx, no answer): the delivery is tried again after
    `delay` seconds (the receiver's Retry-After), or after the kind's backoff when None.

    status: the HTTP status, None when no answer came (timeout, connection or DNS error).
    Named like clamd's verdict of the same meaning (`jobpool.kinds.attachments.clamd.Transient`).
    """

    reason: str
    delay: float | None = None
    status: int | None = None


@dataclass(frozen=True)
class Gone:
    """410: the receiver asks to stop; the subscription is deactivated."""

    reason: str


@dataclass(frozen=True)
class Rejected:
    """Retrying cannot help (4xx other than 408/410/429, a redirect): the delivery fails."""

    reason: str
    status: int


@dataclass(frozen=True)
class Undeliverable:
    """Nothing was sent and retrying cannot help: a bad URL or secret, a refused address."""

    reason: str


DeliveryOutcome = Delivered | Transient | Gone | Rejected | Undeliverable


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or HTTP-date), capped at
    MAX_RETRY_AFTER; None when absent or unreadable. `now` must be timezone-aware."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return min(float(text), MAX_RETRY_AFTER)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def response_excerpt(body: bytes) -> str:
    """The start of a response body for `last_error`: whitespace collapsed, undecodable
    bytes, NUL and control characters escaped, at most EXCERPT_CHARS characters."""
    text = " ".join(body.decode("utf-8", errors="backslashreplace").split())
    return truncate_error(text, EXCERPT_CHARS)


def failure_reason(message: str) -> str:
    """A client, TLS or DNS error message made storable and bounded (REASON_CHARS)."""
    return truncate_error(message, REASON_CHARS)


def classify_response(
    status: int, *, now: datetime, body: bytes = b"", retry_after: str | None = None,
    location: str | None = None,
) -> DeliveryOutcome:
    """What an HTTP answer means for a delivery.

    2xx delivered; 408, 429 and 5xx retry (honouring Retry-After); 410 gone; 3xx (never
    followed) and every other status rejected. body: the start of the response body, quoted
    in the reason; location: the Location header, quoted for a redirect. The reason is
    storable (see `response_excerpt`), whatever the receiver sent.
    """
    excerpt = response_excerpt(body)
    detail = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
    if 200 <= status <= 299:
        return Delivered(status)
    if status == 410:
        return Gone(detail)
    if status in RETRYABLE_STATUSES or 500 <= status <= 599:
        return Transient(detail, parse_retry_after(retry_after, now), status)
    if 300 <= status <= 399:
        target = f"; Location: {truncate_error(location, EXCERPT_CHARS)}" if location else ""
        return Rejected(f"{detail} (redirects are not followed{target})", status)
    return Rejected(detail, status)
