"""Commit uploaded attachments, and read their bytes for the virus scan.

How a service commits an upload (after the client PUT the object to its pre-signed URL):
`await commit_upload(conn, Upload(tenant_id, "cv.pdf", "application/pdf", size, sha256,
"https://bucket.../cv.pdf?X-Amz-..."))` inside its own transaction. The attachment row gets
`virus_scan_status = 'pending'` and a `virus_scan` job is enqueued in that same transaction.

Fetchers stream an object by URI scheme: `file://` (under the worker's
JOBPOOL_ATTACHMENT_FILE_ROOT, `file_fetcher`) is built in here, `https://` (e.g. a pre-signed
GET URL) by the virus_scan kind, which a worker loads (its HTTP client is the worker extra's,
and a service that only commits uploads does not install it); `jobpool.register_fetcher("s3",
fetch)` adds one to the registry (`jobpool.registry`), where it also replaces a built-in one.
A fetcher yields chunks and never holds the whole object; it raises FetchError for a
failure worth retrying and PermanentError for one that is not.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import AsyncConnection, Connection

from jobpool.core.jsondata import text_problem
from jobpool.core.tenants import tenant_uuid
from jobpool.db.queries import One
from jobpool.enqueue import NewJob, enqueue_many, enqueue_many_sync
from jobpool.errors import (
    AttachmentNotFoundError,
    FetchError,
    PermanentError,
    UnknownTenantError,
)
from jobpool.registry import Fetcher

INSERT_ATTACHMENT = One("insert_attachment")
RECOMMIT_ATTACHMENT = One("recommit_attachment")

CHUNK_SIZE = 64 * 1024
"""Bytes per chunk a built-in fetcher yields (and the scan streams to clamd)."""
SHA256 = re.compile(r"^[0-9a-f]{64}$")
URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")

@dataclass(frozen=True)
class Upload:
    """An uploaded object as the client declared it.

    size_bytes and sha256 (hex) are verified by the scan; storage_uri is what a fetcher reads
    (`https://...` pre-signed GET URL, `file:///...`, or a registered scheme).
    """

    tenant_id: uuid.UUID | str
    file_name: str
    content_type: str
    size_bytes: int
    sha256: str
    storage_uri: str


@dataclass(frozen=True)
class CommittedUpload:
    """The attachment's id and the id of its virus_scan job."""

    attachment_id: int
    job_id: int


def check_upload(upload: Upload) -> dict[str, Any]:
    """Validated query parameters of `upload`; raises ValueError naming the bad field."""
    tenant = tenant_uuid(upload.tenant_id)
    if not isinstance(upload.file_name, str) or not 1 <= len(upload.file_name) <= 255:
        raise ValueError("file_name must be 1 to 255 characters")
    if not isinstance(upload.content_type, str) or not 1 <= len(upload.content_type) <= 255:
        raise ValueError("content_type must be 1 to 255 characters")
    if (not isinstance(upload.size_bytes, int) or isinstance(upload.size_bytes, bool)
            or upload.size_bytes < 0):
        raise ValueError(f"size_bytes must be an integer >= 0, got {upload.size_bytes!r}")
    sha256 = upload.sha256.lower() if isinstance(upload.sha256, str) else ""
    if not SHA256.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 hex digits, got {upload.sha256!r}")
    if not isinstance(upload.storage_uri, str) or not URI.fullmatch(upload.storage_uri):
        raise ValueError(f"storage_uri must be an absolute URI, got {upload.storage_uri!r}")
    for name in ("file_name", "content_type", "storage_uri"):
        problem = text_problem(getattr(upload, name))
        if problem is not None:
            raise ValueError(f"{name} {problem}")
    return {"tenant_id": tenant, "file_name": upload.file_name,
            "content_type": upload.content_type, "size_bytes": upload.size_bytes,
            "sha256": sha256, "storage_uri": upload.storage_uri}


def _scan_job(params: dict[str, Any], attachment_id: int) -> NewJob:
    return NewJob(params["tenant_id"], "virus_scan",
                  {"attachment_id": attachment_id, "sha256": params["sha256"]})


async def commit_upload(
    conn: AsyncConnection[Any], upload: Upload, *, attachment_id: int | None = None,
    actor: str | None = None,
) -> CommittedUpload:
    """Commit an upload: the attachment becomes `pending` and its `virus_scan` job is enqueued,
    atomically (a savepoint inside the caller's transaction, or a transaction of its own).

    attachment_id: None adds an attachment; an id replaces that attachment's content (new
    scan, earlier verdict cleared). Raises ValueError (bad field), UnknownTenantError,
    AttachmentNotFoundError.
    """
    params = check_upload(upload)
    async with conn.transaction():
        try:
            if attachment_id is None:
                row = await INSERT_ATTACHMENT(conn, params)
            else:
                row = await RECOMMIT_ATTACHMENT(conn, {**params, "id": attachment_id})
        except psycopg.errors.ForeignKeyViolation as exc:
            raise UnknownTenantError(str(params["tenant_id"])) from exc
        if row is None:
            raise AttachmentNotFoundError(
                f"no attachment {attachment_id} of tenant {params['tenant_id']}")
        [job] = await enqueue_many(conn, [_scan_job(params, row["id"])], actor=actor)
    return CommittedUpload(row["id"], job.id)


def commit_upload_sync(
    conn: Connection[Any], upload: Upload, *, attachment_id: int | None = None,
    actor: str | None = None,
) -> CommittedUpload:
    """`commit_upload` for a synchronous psycopg connection."""
    params = check_upload(upload)
    with conn.transaction():
        try:
            if attachment_id is None:
                row = INSERT_ATTACHMENT.sync(conn, params)
            else:
                row = RECOMMIT_ATTACHMENT.sync(conn, {**params, "id": attachment_id})
        except psycopg.errors.ForeignKeyViolation as exc:
            raise UnknownTenantError(str(params["tenant_id"])) from exc
        if row is None:
            raise AttachmentNotFoundError(
                f"no attachment {attachment_id} of tenant {params['tenant_id']}")
        [job] = enqueue_many_sync(conn, [_scan_job(params, row["id"])], actor=actor)
    return CommittedUpload(row["id"], job.id)


# -- fetchers ------------------------------------------------------------------------------


def fetcher_for(uri: str, fetchers: Mapping[str, Fetcher]) -> Fetcher:
    """The fetcher of `uri`'s scheme among `fetchers` (by lower-case scheme); raises
    PermanentError when none is there."""
    scheme = urlsplit(uri).scheme.lower()
    try:
        return fetchers[scheme]
    except KeyError:
        raise PermanentError(
            f"no fetcher for {scheme or 'scheme-less'}:// attachments (known: "
            f"{', '.join(sorted(fetchers))}); add one with jobpool.register_fetcher"
        ) from None


def redact(uri: str) -> str:
    """`uri` without its query and credentials (a pre-signed URL's query is a credential)."""
    parts = urlsplit(uri)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def file_path(uri: str, root: str | None) -> Path:
    """The local path of a `file://` URI, which must lie under `root` (symlinks resolved).

    Raises PermanentError when `root` is unset, the URI names another host, or the path
    leaves `root`.
    """
    if not root:
        raise PermanentError("file:// attachments need JOBPOOL_ATTACHMENT_FILE_ROOT to be set")
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise PermanentError(f"file:// URI names another host: {uri!r}")
    path = Path(unquote(parts.path)).resolve()
    base = Path(root).resolve()
    if not path.is_relative_to(base):
        raise PermanentError(f"{path} is outside JOBPOOL_ATTACHMENT_FILE_ROOT ({base})")
    return path


def file_fetcher(root: str | None) -> Fetcher:
    """The fetcher of `file://` URIs under `root` (JOBPOOL_ATTACHMENT_FILE_ROOT; None: every
    `file://` URI is refused, PermanentError): a local file in CHUNK_SIZE pieces, a missing
    file a FetchError (retry)."""

    async def fetch_file(uri: str) -> AsyncIterator[bytes]:
        path = file_path(uri, root)
        try:
            handle = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError as exc:
            raise FetchError(f"{path} does not exist (yet)") from exc
        except OSError as exc:
            raise FetchError(f"cannot open {path}: {exc}") from exc
        try:
            while chunk := await asyncio.to_thread(handle.read, CHUNK_SIZE):
                yield chunk
        finally:
            handle.close()

    return fetch_file
