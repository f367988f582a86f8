"""What a clamd INSTREAM reply means for an attachment (virus_scan).

The rule that matters: `clean` if and only if clamd answered `stream: OK`. Everything
else is infected (a signature), unscannable (terminal, not clean), or transient (retry, the
attachment stays pending).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal, assert_never
from urllib.parse import unquote, urlsplit

from jobpool.core.jsondata import storable_text

ScanStatus = Literal["pending", "clean", "infected", "unscannable"]
"""`ddm_attachment.virus_scan_status` (pending until a scan decided)."""

INSTREAM = b"zINSTREAM\0"
"""The command; the `z` prefix makes clamd end its reply with NUL."""
END_OF_STREAM = struct.pack(">I", 0)
REPLY_LIMIT = 4096
"""Bytes of reply read at most; a longer one is not a clamd reply."""
LIMITS_EXCEEDED_PREFIX = "Heuristics.Limits.Exceeded"
"""Signatures clamd reports (with AlertExceedsMax) for an object it could not fully scan."""


@dataclass(frozen=True)
class Clean:
    """clamd answered `stream: OK`."""


@dataclass(frozen=True)
class Infected:
    """clamd found `signature`."""

    signature: str


@dataclass(frozen=True)
class Unscannable:
    """The object cannot be scanned as it is (too large, not the committed bytes): no retry."""

    reason: str


@dataclass(frozen=True)
class Transient:
    """No decision (daemon down, timed out, errored, odd reply): retry, stay pending."""

    reason: str


Verdict = Clean | Infected | Unscannable | Transient


@dataclass(frozen=True)
class ClamdAddress:
    """Where clamd listens: TCP `host`:`port`, or the Unix socket `path`."""

    host: str | None = None
    port: int | None = None
    path: str | None = None


def parse_clamd_url(url: str) -> ClamdAddress:
    """`tcp://host:port` or `unix:///path/to/clamd.sock`; raises ValueError naming the problem."""
    parts = urlsplit(url)
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise ValueError(f"JOBPOOL_CLAMD_URL must look like tcp://host:3310, got {url!r}")
        return ClamdAddress(host=parts.hostname, port=port)
    if parts.scheme == "unix":
        path = unquote(parts.path)
        if not path.startswith("/") or parts.netloc:
            raise ValueError(
                f"JOBPOOL_CLAMD_URL must look like unix:///path/to/clamd.sock, got {url!r}")
        return ClamdAddress(path=path)
    raise ValueError(f"JOBPOOL_CLAMD_URL must start with tcp:// or unix://, got {url!r}")


def frame(chunk: bytes) -> bytes:
    """One INSTREAM chunk: 4-byte big-endian length, then the bytes."""
    return struct.pack(">I", len(chunk)) + chunk


def parse_reply(raw: bytes) -> Verdict:
    """Map clamd's reply to an INSTREAM (`z` form, NUL-terminated) to a verdict.

    `stream: OK` → Clean; `stream: <name> FOUND` → Infected (Unscannable for
    `Heuristics.Limits.Exceeded.*`); `INSTREAM size limit exceeded. ERROR` → Unscannable;
    any other `... ERROR`, an empty or unknown reply → Transient. The reply is made storable
    first (`storable_text`: a NUL or control character inside a signature name is escaped),
    because the signature and the messages are written to PostgreSQL text columns.
    """
    text = storable_text(raw.rstrip(b"\0\n").decode("utf-8", errors="replace").strip())
    if not text:
        return Transient("clamd closed the connection without a reply")
    if text == "stream: OK":
        return Clean()
    if text == "INSTREAM size limit exceeded. ERROR":
        return Unscannable("larger than clamd's StreamMaxLength (INSTREAM size limit exceeded)")
    if text.startswith("stream: ") and text.endswith(" FOUND"):
        signature = text.removeprefix("stream: ").removesuffix(" FOUND").strip()
        if not signature:
            return Transient(f"clamd reply names no signature: {text!r}")
        if signature.startswith(LIMITS_EXCEEDED_PREFIX):
            return Unscannable(f"clamd could not scan it within its limits ({signature})")
        return Infected(signature)
    if text.endswith("ERROR"):
        return Transient(f"clamd error: {text}")
    return Transient(f"unexpected clamd reply: {text[:200]!r}")


def after_cut_stream(bytes_sent: int, stream_limit: int, error: str) -> Verdict:
    """Verdict when clamd dropped the connection mid-stream and no reply could be read.

    clamd stops reading at its StreamMaxLength and closes, so the client may see a broken
    pipe or a reset before the `size limit exceeded` reply: past `stream_limit` bytes that
    is the limit (Unscannable), before it the daemon failed (Transient).
    """
    if bytes_sent > stream_limit:
        return Unscannable(
            f"clamd closed the stream after {bytes_sent} bytes, past its StreamMaxLength "
            f"of {stream_limit} ({error})")
    return Transient(f"clamd closed the connection after {bytes_sent} bytes ({error})")


def with_integrity(verdict: Verdict, mismatch: str | None) -> Verdict:
    """Combine clamd's verdict with the size/sha256 check of the bytes that were streamed.

    A signature hit stands; a clean answer about bytes that are not the committed object is
    Unscannable, never Clean; Transient and Unscannable stand.
    """
    if mismatch is not None and isinstance(verdict, Clean):
        return Unscannable(mismatch)
    return verdict


def status_of(verdict: Clean | Infected | Unscannable) -> ScanStatus:
    """The `virus_scan_status` a final verdict writes."""
    match verdict:
        case Clean():
            return "clean"
        case Infected():
            return "infected"
        case Unscannable():
            return "unscannable"
        case _:
            assert_never(verdict)
