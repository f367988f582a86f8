"""virus_scan: stream an attachment to clamd (INSTREAM) and patch `virus_scan_status`.

Payload: `ScanPayload`, `{"attachment_id": n, "sha256": hex}` (enqueued by
`jobpool.commit_upload`).

`clean` if and only if clamd answered `stream: OK` for exactly the committed bytes (size and
sha256 checked on the way). A signature hit is `infected`; an object past clamd's stream
limit, or whose bytes are not the committed ones, is `unscannable` (terminal, no retry).
A daemon that is down, times out or answers an error is a transient failure: the job
retries and the attachment stays `pending`. The object is streamed chunk by chunk, never
held in memory whole; `https://` objects by the fetcher defined here (aiohttp, a worker's
dependency, which the uploads module leaves to this one so that services committing uploads
need not install it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, assert_never

import aiohttp
import msgspec
from psycopg import AsyncConnection

from jobpool.db.queries import One
from jobpool.errors import FetchError, JobpoolError, PermanentError
from jobpool.job import Job, JobContext
from jobpool.kinds.attachments.clamd import (
    END_OF_STREAM,
    INSTREAM,
    REPLY_LIMIT,
    ClamdAddress,
    Clean,
    Infected,
    Transient,
    Unscannable,
    Verdict,
    after_cut_stream,
    frame,
    parse_clamd_url,
    parse_reply,
    status_of,
    with_integrity,
)
from jobpool.kinds.attachments.uploads import CHUNK_SIZE, fetcher_for, file_fetcher, redact
from jobpool.registry import Fetcher, kind

ATTACHMENT_TO_SCAN = One("attachment_to_scan")
RECORD_SCAN_RESULT = One("record_scan_result")

CONNECT_TIMEOUT = 10.0
"""Seconds to connect to clamd."""
SEND_TIMEOUT = 60.0
"""Seconds clamd may take to accept one chunk."""
REPLY_TIMEOUT = 180.0
"""Seconds clamd may take to answer once the stream ended (its scan time)."""
CUT_REPLY_TIMEOUT = 5.0
"""Seconds to wait for a reply after clamd stopped reading mid-stream."""
HTTP_CONNECT_TIMEOUT = 10.0
HTTP_READ_TIMEOUT = 60.0
"""Seconds without a byte from the object store before a fetch counts as failed."""


class ScanFailed(JobpoolError):
    """No verdict this time (clamd down, timed out, errored): retry, stay pending."""


class ScanPayload(msgspec.Struct, frozen=True, omit_defaults=True):
    """A virus_scan payload: the attachment, and the SHA-256 (hex) of the bytes committed with
    the job (None: whatever the row holds); a row whose sha256 differs was re-uploaded since."""

    attachment_id: Annotated[int, msgspec.Meta(ge=1)]
    sha256: str | None = None


# -- clamd I/O -----------------------------------------------------------------------------


def _where(address: ClamdAddress) -> str:
    return f"unix://{address.path}" if address.path else f"tcp://{address.host}:{address.port}"


async def connect_clamd(address: ClamdAddress) -> socket.socket:
    """A connected non-blocking socket to clamd; raises OSError or TimeoutError."""
    loop = asyncio.get_running_loop()
    if address.path is not None:
        targets: list[tuple[int, int, int, Any]] = [
            (socket.AF_UNIX, socket.SOCK_STREAM, 0, address.path)]
    else:
        infos = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        targets = [(family, socktype, proto, sockaddr)
                   for family, socktype, proto, _, sockaddr in infos]
    error: OSError | TimeoutError = OSError(f"no address for {_where(address)}")
    for family, socktype, proto, sockaddr in targets:
        sock = socket.socket(family, socktype, proto)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):  # not wait_for: see `event_loop`
                await loop.sock_connect(sock, sockaddr)
        except (OSError, TimeoutError) as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error


def _reply_waiting(sock: socket.socket) -> bytes | None:
    """What clamd already sent (b"" = it closed), or None when it has said nothing yet."""
    try:
        return sock.recv(REPLY_LIMIT)
    except BlockingIOError:
        return None
    except OSError:
        return b""


async def read_reply(sock: socket.socket, prefix: bytes, timeout: float) -> bytes:
    """Read up to the terminating NUL, EOF or REPLY_LIMIT bytes; raises TimeoutError."""
    loop = asyncio.get_running_loop()
    data = bytearray(prefix)
    async with asyncio.timeout(timeout):
        while b"\0" not in data and len(data) < REPLY_LIMIT:
            try:
                chunk = await loop.sock_recv(sock, REPLY_LIMIT)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    return bytes(data).split(b"\0", 1)[0]


async def _early_verdict(sock: socket.socket, early: bytes, sent: int, limit: int) -> Verdict:
    """clamd spoke (or hung up) before the stream ended: never a clean verdict."""
    if not early:
        return after_cut_stream(sent, limit, "connection closed")
    try:
        verdict = parse_reply(await read_reply(sock, early, CUT_REPLY_TIMEOUT))
    except TimeoutError:
        verdict = Transient(f"incomplete clamd reply {early[:100]!r}")
    if isinstance(verdict, Clean):
        return Transient("clamd answered OK before the end of the stream")
    return verdict


@dataclass
class _Stream:
    """Bytes of the object sent so far, their digest, and the first integrity problem."""

    size: int
    sent: int = 0
    mismatch: str | None = None

    def __post_init__(self) -> None:
        self.digest = hashlib.sha256()

    def take(self, chunk: bytes) -> bytes:
        """The part of `chunk` to send; notes an object longer than its committed size."""
        room = self.size - self.sent
        if len(chunk) > room:
            self.mismatch = f"the object is larger than its committed size of {self.size} bytes"
            chunk = chunk[:room]
        self.digest.update(chunk)
        return chunk

    def check(self, sha256: str) -> str | None:
        """The integrity problem of the whole object, if any."""
        if self.mismatch is None and self.sent != self.size:
            return f"the object has {self.sent} bytes, its committed size is {self.size}"
        if self.mismatch is None and self.digest.hexdigest() != sha256:
            return f"the object's sha256 is {self.digest.hexdigest()}, committed {sha256}"
        return self.mismatch


async def instream(
    sock: socket.socket, chunks: AsyncIterator[bytes], *, size: int, sha256: str,
    stream_limit: int,
) -> Verdict:
    """Stream `chunks` (at most `size` bytes) to clamd and judge its reply."""
    loop = asyncio.get_running_loop()
    stream = _Stream(size)
    try:
        async with asyncio.timeout(SEND_TIMEOUT):  # not wait_for: see `event_loop`
            await loop.sock_sendall(sock, INSTREAM)
        async for chunk in chunks:
            early = _reply_waiting(sock)
            if early is not None:
                return await _early_verdict(sock, early, stream.sent, stream_limit)
            piece = stream.take(chunk)
            if piece:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await loop.sock_sendall(sock, frame(piece))
                stream.sent += len(piece)
            if stream.mismatch:
                break
        async with asyncio.timeout(SEND_TIMEOUT):
            await loop.sock_sendall(sock, END_OF_STREAM)
    except (BrokenPipeError, ConnectionResetError) as exc:
        with contextlib.suppress(TimeoutError):
            reply = await read_reply(sock, b"", CUT_REPLY_TIMEOUT)
            if reply:
                return await _early_verdict(sock, reply + b"\0", stream.sent, stream_limit)
        return after_cut_stream(stream.sent, stream_limit, type(exc).__name__)
    except TimeoutError:
        return Transient(f"clamd did not read the stream within {SEND_TIMEOUT:g}s")
    except OSError as exc:
        return Transient(f"clamd connection failed after {stream.sent} bytes: {exc}")
    try:
        reply = await read_reply(sock, b"", REPLY_TIMEOUT)
    except TimeoutError:
        return Transient(f"clamd did not answer within {REPLY_TIMEOUT:g}s")
    return with_integrity(parse_reply(reply), stream.check(sha256))


async def scan(
    address: ClamdAddress, chunks: AsyncIterator[bytes], *, size: int, sha256: str,
    stream_limit: int,
) -> Verdict:
    """Scan one object with clamd at `address`; errors of the fetcher propagate."""
    try:
        sock = await connect_clamd(address)
    except (OSError, TimeoutError) as exc:
        return Transient(f"cannot reach clamd at {_where(address)}: {exc or type(exc).__name__}")
    try:
        return await instream(sock, chunks, size=size, sha256=sha256, stream_limit=stream_limit)
    finally:
        sock.close()
        closer = getattr(chunks, "aclose", None)
        if closer is not None:
            await closer()


# -- the https:// fetcher ------------------------------------------------------------------


def _http_failure(status: int, uri: str) -> Exception:
    message = f"GET {redact(uri)} answered HTTP {status}"
    if status in (404, 408, 429) or status >= 500:
        return FetchError(message)
    return PermanentError(message + " (an expired or wrong pre-signed URL?)")


def https_fetcher(ssl_context: ssl.SSLContext | None = None) -> Fetcher:
    """A fetcher of `https://` objects (e.g. pre-signed GET URLs); no redirects followed.

    ssl_context: trust for the object store (None: the system's CAs, hostname checked).
    404, 408, 429, 5xx and network errors are FetchError; other non-200 answers are
    PermanentError.
    """
    verify: ssl.SSLContext | bool = True if ssl_context is None else ssl_context

    async def fetch_https(uri: str) -> AsyncIterator[bytes]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_CONNECT_TIMEOUT,
                                        sock_read=HTTP_READ_TIMEOUT)
        try:
            async with aiohttp.ClientSession(timeout=timeout, trust_env=False,
                                             auto_decompress=False) as session, session.get(
                    uri, allow_redirects=False, ssl=verify) as response:
                if response.status != 200:
                    raise _http_failure(response.status, uri)
                async for chunk in response.content.iter_chunked(CHUNK_SIZE):
                    yield chunk
        except TimeoutError as exc:
            raise FetchError(f"GET {redact(uri)} timed out") from exc
        except aiohttp.ClientError as exc:
            raise FetchError(f"GET {redact(uri)} failed: {type(exc).__name__}: {exc}") from exc

    return fetch_https


HTTPS = https_fetcher()
"""The built-in `https://` fetcher: the system's CAs."""


def fetchers_of(context: JobContext) -> dict[str, Fetcher]:
    """The fetchers a scan in `context` uses: the built-in `file://` (under its settings'
    attachment file root) and `https://`, then its registry's, which replace them."""
    file = file_fetcher(context.settings.attachment_file_root)
    return {"file": file, "https": HTTPS, **context.registry.fetchers()}


# -- the kind ------------------------------------------------------------------------------


async def _attachment(tx: AsyncConnection[Any], attachment_id: int) -> Mapping[str, Any] | None:
    return await ATTACHMENT_TO_SCAN(tx, {"id": attachment_id})


def _clamd_address(url: str | None) -> ClamdAddress:
    if not url:
        raise PermanentError("JOBPOOL_CLAMD_URL is not set: no clamd to scan with")
    try:
        return parse_clamd_url(url)
    except ValueError as exc:
        raise PermanentError(str(exc)) from None


async def _record(
    tx: AsyncConnection[Any], job: Job, row: Mapping[str, Any],
    verdict: Clean | Infected | Unscannable,
) -> bool:
    """Patch the verdict onto the attachment; False if it was re-committed meanwhile."""
    changed = await RECORD_SCAN_RESULT(tx, {
        "id": row["id"], "sha256": row["sha256"], "storage_uri": row["storage_uri"],
        "status": status_of(verdict), "job_id": job.id,
        "signature": verdict.signature if isinstance(verdict, Infected) else None,
        "detail": verdict.reason if isinstance(verdict, Unscannable) else None,
        "actor": job.context.actor,
    })
    return bool(changed and changed["changed"])


@kind("virus_scan", priority=100, max_attempts=20, stale_ttl=15 * 60, timeout=10 * 60,
      backoff_base=30, backoff_max=24 * 3600, backoff_jitter=0.1, payload=ScanPayload)
async def virus_scan(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Scan one attachment and patch its status; retry (still pending) when clamd cannot say."""
    request: ScanPayload = job.payload
    row = await _attachment(tx, request.attachment_id)
    if row is None:
        raise PermanentError(f"attachment {request.attachment_id} does not exist")
    result: dict[str, Any] = {"attachment_id": row["id"]}
    if request.sha256 is not None and request.sha256 != row["sha256"]:
        return {**result, "status": "superseded"}
    if row["virus_scan_status"] != "pending":
        return {**result, "status": row["virus_scan_status"], "already": True}
    config = job.context.settings
    address = _clamd_address(config.clamd_url)
    fetch = fetcher_for(row["storage_uri"], fetchers_of(job.context))
    verdict = await scan(address, fetch(row["storage_uri"]), size=row["size_bytes"],
                         sha256=row["sha256"], stream_limit=config.clamd_stream_max_length)
    match verdict:
        case Transient(reason=reason):
            raise ScanFailed(f"{redact(row['storage_uri'])}: {reason}")
        case Clean() | Infected() | Unscannable():
            if not await _record(tx, job, row, verdict):
                return {**result, "status": "superseded"}
            status = status_of(verdict)
            if isinstance(verdict, Infected):
                return {**result, "status": status, "signature": verdict.signature}
            if isinstance(verdict, Unscannable):
                return {**result, "status": status, "reason": verdict.reason}
            return {**result, "status": status}
        case _:
            assert_never(verdict)
