"""virus_scan against a real clamd (Debian clamav-daemon, one custom EICAR signature).

clamd comes from JOBPOOL_TEST_CLAMD_* (exported by `.ci/run` from `.ci/start-clamd.sh`'s
clamd.env), else this module starts its own with that script. Without clamd the tests skip,
unless CI is set: then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trustme
from aiohttp import web

import jobpool.kinds.attachments.virus_scan as virus_scan
from jobpool import settings
from jobpool.errors import PermanentError, UnknownTenantError
from jobpool.job import JobContext
from jobpool.kinds.attachments import uploads as attachments
from jobpool.kinds.attachments.uploads import (
    AttachmentNotFoundError,
    Upload,
    commit_upload,
    commit_upload_sync,
)
from jobpool.kinds.attachments.virus_scan import https_fetcher
from jobpool.payloads import decode_payload
from jobpool.registry import REGISTRY, Registry
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]
SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "start-clamd.sh"
EICAR = rb"X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
SIGNATURE = "Jobpool-Test-EICAR.UNOFFICIAL"


# -- clamd ---------------------------------------------------------------------------------


def _parse_env(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def start_clamd(folder: Path) -> dict[str, str]:
    """Start a private clamd with the script; fail under CI, skip elsewhere, when it cannot."""
    try:
        done = subprocess.run(["bash", str(SCRIPT), "start", str(folder)], capture_output=True,
                              text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "timed out installing/starting clamd")
    if done.returncode != 0:
        reason = f"clamd could not be installed or started: {done.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason + " (install clamav-daemon; under CI=true this fails)")
    return _parse_env(done.stdout)


def stop_clamd(folder: Path) -> None:
    subprocess.run(["bash", str(SCRIPT), "stop", str(folder)], capture_output=True, check=False,
                   timeout=60)


@pytest.fixture(scope="session")
def clamd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """JOBPOOL_TEST_CLAMD_URL (tcp), _SOCKET (unix) and _STREAM_MAX_LENGTH of a running clamd."""
    if os.environ.get("JOBPOOL_TEST_CLAMD_URL"):
        yield {key: value for key, value in os.environ.items()
               if key.startswith("JOBPOOL_TEST_CLAMD_")}
        return
    folder = tmp_path_factory.mktemp("clamd")
    env = start_clamd(folder)
    yield env
    stop_clamd(folder)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "objects"
    folder.mkdir()
    return folder


@pytest.fixture
def scanner(dsn: str, clamd: dict[str, str], files: Path) -> Iterator[dict[str, str]]:
    """Settings pointing at clamd over TCP, with `files` as the file:// root."""
    previous = settings.current()
    settings.configure(replace(
        previous, dsn=dsn, clamd_url=clamd["JOBPOOL_TEST_CLAMD_URL"],
        clamd_stream_max_length=int(clamd["JOBPOOL_TEST_CLAMD_STREAM_MAX_LENGTH"]),
        attachment_file_root=str(files)))
    yield clamd
    settings.configure(previous)


def use_clamd(url: str) -> None:
    settings.configure(replace(settings.current(), clamd_url=url))


# -- helpers -------------------------------------------------------------------------------

RUNNABLE = ("SELECT count(*) FROM mdm.aa_job WHERE job_kind = 'virus_scan'"
            " AND status = 'pending' AND available_at <= now()")


async def run_worker(dsn: str, registry: Registry = REGISTRY) -> None:
    """Run an until-empty worker (again while scan jobs are runnable; see the outbox tests)."""
    config = WorkerConfig(kinds=("virus_scan",), until_empty=True, poll_interval=0.2)
    for _ in range(5):
        await Worker(dsn, registry, config, actor="test-worker").run()
        async with await psycopg.AsyncConnection.connect(dsn) as check:
            row = await (await check.execute(RUNNABLE)).fetchone()
        if not row or not row[0]:
            return


def put(files: Path, name: str, data: bytes) -> Upload:
    """Write an object under the file root and describe it as an upload."""
    path = files / name
    path.write_bytes(data)
    return Upload(uuid.UUID(int=0), name, "application/octet-stream", len(data),
                  hashlib.sha256(data).hexdigest(), path.as_uri())


async def commit(conn: Conn, tenant: uuid.UUID, upload: Upload, **overrides: Any) -> int:
    return (await commit_upload(conn, replace(upload, tenant_id=tenant, **overrides))
            ).attachment_id


async def state(conn: Conn, attachment_id: int) -> dict[str, Any]:
    """The attachment with its newest scan job's status, attempts and error."""
    cur = await conn.execute("""
        SELECT a.virus_scan_status::text AS status, a.virus_signature, a.scan_detail,
               a.scanned_at, j.status::text AS job_status, j.attempts, j.last_error, j.result
          FROM mdm.ddm_attachment a
          LEFT JOIN LATERAL (SELECT * FROM mdm.aa_job j WHERE j.job_kind = 'virus_scan'
                               AND (j.payload->>'attachment_id')::bigint = a.id
                             ORDER BY j.id DESC LIMIT 1) j ON true
         WHERE a.id = %s""", (attachment_id,))
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


# -- committing uploads --------------------------------------------------------------------


async def test_commit_sets_pending_and_enqueues_the_scan_atomically(
    conn: Conn, tenant: uuid.UUID, files: Path
) -> None:
    upload = replace(put(files, "a.txt", b"hello"), tenant_id=tenant)
    with pytest.raises(RuntimeError, match="abort"):
        async with conn.transaction():
            await commit_upload(conn, upload)
            raise RuntimeError("abort")
    cur = await conn.execute("SELECT (SELECT count(*) FROM mdm.ddm_attachment) AS a,"
                             " (SELECT count(*) FROM mdm.aa_job) AS j")
    assert await cur.fetchone() == {"a": 0, "j": 0}

    done = await commit_upload(conn, upload)
    row = await state(conn, done.attachment_id)
    assert (row["status"], row["job_status"]) == ("pending", "pending")
    cur = await conn.execute("SELECT payload FROM mdm.aa_job WHERE id = %s", (done.job_id,))
    assert await cur.fetchone() == {"payload": {"attachment_id": done.attachment_id,
                                                "sha256": upload.sha256}}


async def test_bad_uploads_are_refused_by_name(
    conn: Conn, tenant: uuid.UUID, files: Path
) -> None:
    upload = replace(put(files, "a.txt", b"hello"), tenant_id=tenant)
    with pytest.raises(ValueError, match="sha256 must be 64 hex digits"):
        await commit_upload(conn, replace(upload, sha256="abc"))
    with pytest.raises(ValueError, match="size_bytes"):
        await commit_upload(conn, replace(upload, size_bytes=-1))
    with pytest.raises(ValueError, match="storage_uri"):
        await commit_upload(conn, replace(upload, storage_uri="/tmp/x"))
    for field, value, problem in [
        ("file_name", "cv\ud800.pdf", r"file_name contains a lone surrogate \(U\+D800\)"),
        ("content_type", "text/\x00", "content_type contains a NUL character"),
        ("storage_uri", "https://x.example/\x00", "storage_uri contains a NUL character"),
        ("storage_uri", "https://x.example/\udc80", "storage_uri contains a lone surrogate"),
    ]:
        with pytest.raises(ValueError, match=problem):
            await commit_upload(conn, replace(upload, **{field: value}))
    with pytest.raises(UnknownTenantError):
        await commit_upload(conn, replace(upload, tenant_id=uuid.uuid4()))
    with pytest.raises(AttachmentNotFoundError):
        await commit_upload(conn, upload, attachment_id=999)


def test_commit_upload_sync(dsn: str, files: Path) -> None:
    with psycopg.connect(dsn) as sync_conn:
        row = sync_conn.execute(
            "INSERT INTO mdm.aa_tenant (key) VALUES ('sync') RETURNING id").fetchone()
        assert row is not None
        done = commit_upload_sync(sync_conn, replace(put(files, "s", b"s"), tenant_id=row[0]))
    with psycopg.connect(dsn) as check:
        job = check.execute("SELECT job_kind FROM mdm.aa_job WHERE id = %s",
                            (done.job_id,)).fetchone()
    assert job == ("virus_scan",)


# -- verdicts from the real clamd ----------------------------------------------------------


async def test_eicar_is_infected_over_tcp(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str]
) -> None:
    attachment = await commit(conn, tenant, put(files, "eicar.com", b"prefix " + EICAR + b"\n"))
    await run_worker(dsn)
    row = await state(conn, attachment)
    assert (row["status"], row["virus_signature"], row["job_status"]) == (
        "infected", SIGNATURE, "done")
    assert row["scanned_at"] is not None
    cur = await conn.execute("SELECT payload FROM mdm.aa_audit_log"
                             " WHERE action = 'attachment_scanned'")
    assert [r["payload"] for r in await cur.fetchall()] == [
        {"attachment_id": attachment, "status": "infected", "signature": SIGNATURE}]


async def test_clean_bytes_are_clean_over_the_unix_socket(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str]
) -> None:
    use_clamd(scanner["JOBPOOL_TEST_CLAMD_SOCKET"])
    data = os.urandom(300_000)  # several chunks
    attachment = await commit(conn, tenant, put(files, "random.bin", data))
    empty = await commit(conn, tenant, put(files, "empty.txt", b""))
    await run_worker(dsn)
    for attachment_id in (attachment, empty):
        row = await state(conn, attachment_id)
        assert (row["status"], row["virus_signature"], row["job_status"]) == (
            "clean", None, "done")


@pytest.mark.parametrize("factor", [1, 8], ids=["just-over", "far-over"])
async def test_an_object_over_the_stream_limit_is_unscannable_without_retry(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str], factor: int
) -> None:
    limit = int(scanner["JOBPOOL_TEST_CLAMD_STREAM_MAX_LENGTH"])
    attachment = await commit(conn, tenant, put(files, "big.bin", b"a" * (limit * factor + 1)))
    await run_worker(dsn)
    row = await state(conn, attachment)
    assert (row["status"], row["job_status"], row["attempts"]) == ("unscannable", "done", 1)
    assert "StreamMaxLength" in row["scan_detail"]


async def test_a_stopped_clamd_means_retry_and_the_attachment_stays_pending(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str],
    tmp_path: Path,
) -> None:
    own = start_clamd(tmp_path / "clamd")
    stop_clamd(tmp_path / "clamd")
    for url in (own["JOBPOOL_TEST_CLAMD_URL"], own["JOBPOOL_TEST_CLAMD_SOCKET"]):
        use_clamd(url)
        attachment = await commit(conn, tenant, put(files, "x.txt", b"harmless"))
        await run_worker(dsn)
        row = await state(conn, attachment)
        assert (row["status"], row["job_status"], row["attempts"]) == ("pending", "pending", 1)
        assert "cannot reach clamd" in row["last_error"]


@pytest.mark.parametrize("lie", ["size-short", "size-long", "sha256"])
async def test_bytes_that_are_not_the_committed_object_are_never_clean(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str], lie: str
) -> None:
    upload = put(files, "doc.txt", b"harmless text " * 1000)
    options: dict[str, dict[str, Any]] = {
        "size-short": {"size_bytes": upload.size_bytes - 1},
        "size-long": {"size_bytes": upload.size_bytes + 1},
        "sha256": {"sha256": hashlib.sha256(b"other").hexdigest()},
    }
    changes = options[lie]
    attachment = await commit(conn, tenant, upload, **changes)
    await run_worker(dsn)
    row = await state(conn, attachment)
    assert (row["status"], row["job_status"]) == ("unscannable", "done")
    assert "committed" in row["scan_detail"]


async def test_an_infected_object_stays_infected_whatever_its_checksum(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str]
) -> None:
    attachment = await commit(conn, tenant, put(files, "e.com", EICAR),
                              sha256=hashlib.sha256(b"x").hexdigest())
    await run_worker(dsn)
    assert (await state(conn, attachment))["status"] == "infected"


async def test_a_recommit_clears_the_verdict_and_scans_again(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str]
) -> None:
    attachment = await commit(conn, tenant, put(files, "v1.txt", b"fine"))
    await run_worker(dsn)
    assert (await state(conn, attachment))["status"] == "clean"
    await commit_upload(conn, replace(put(files, "v2.com", EICAR), tenant_id=tenant),
                        attachment_id=attachment)
    assert (await state(conn, attachment))["status"] == "pending"
    await run_worker(dsn)
    assert (await state(conn, attachment))["status"] == "infected"


async def test_file_uris_outside_the_root_are_refused(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str],
    tmp_path: Path,
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"secret")
    upload = put(files, "link.txt", b"secret")
    attachment = await commit(conn, tenant, upload, storage_uri=outside.as_uri())
    missing = await commit(conn, tenant, upload, storage_uri=(files / "nope").as_uri())
    await run_worker(dsn)
    row = await state(conn, attachment)
    assert (row["status"], row["job_status"]) == ("pending", "dlq")
    assert "outside JOBPOOL_ATTACHMENT_FILE_ROOT" in row["last_error"]
    row = await state(conn, missing)
    assert (row["status"], row["job_status"]) == ("pending", "pending")
    assert "does not exist" in row["last_error"]


async def test_https_objects_are_streamed(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str]
) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    data = b"pdf-ish " * 20_000

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=EICAR if request.match_info["name"] == "bad" else data)

    app = web.Application()
    app.router.add_get("/bucket/{name}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context).start()
    port = runner.addresses[0][1]
    registry = REGISTRY.copy()  # the process's https fetcher stays as it is
    registry.register_fetcher("https", https_fetcher(client_context))
    try:
        base = put(files, "unused", data)
        good = await commit(conn, tenant, base,
                            storage_uri=f"https://localhost:{port}/bucket/good?X-Sig=s3cr3t")
        bad = await commit(conn, tenant, base, storage_uri=f"https://localhost:{port}/bucket/bad",
                           size_bytes=len(EICAR), sha256=hashlib.sha256(EICAR).hexdigest())
        gone = await commit(conn, tenant, base, storage_uri=f"https://localhost:{port}/missing")
        await run_worker(dsn, registry)
    finally:
        await runner.cleanup()
    assert (await state(conn, good))["status"] == "clean"
    assert (await state(conn, bad))["status"] == "infected"
    row = await state(conn, gone)
    assert (row["status"], row["job_status"]) == ("pending", "pending")
    assert "HTTP 404" in row["last_error"] and "s3cr3t" not in row["last_error"]


# -- replies a real clamd gives only when it is unwell --------------------------------------


class FakeClamd:
    """A Unix-socket server speaking just enough INSTREAM to give one scripted reply."""

    def __init__(self, reply: bytes | None, *, early: bool = False) -> None:
        self.reply = reply
        self.early = early
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\0")
            if not self.early:
                while (size := int.from_bytes(await reader.readexactly(4), "big")) != 0:
                    await reader.readexactly(size)
            if self.reply is None:
                await reader.read()  # say nothing until the client gives up
            writer.write(self.reply or b"")
            await writer.drain()
        writer.close()


@pytest.mark.parametrize(("reply", "early", "error"), [
    (b"stream: Can't allocate memory ERROR\0", False, "clamd error"),
    (b"COMMAND READ TIMED OUT\0", False, "unexpected clamd reply"),
    (b"", False, "without a reply"),
    (b"stream: OK\0", True, "before the end of the stream"),
    (None, False, "did not answer"),
])
async def test_unwell_clamd_replies_retry_and_never_mark_clean(
    conn: Conn, dsn: str, tenant: uuid.UUID, files: Path, scanner: dict[str, str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reply: bytes | None, early: bool,
    error: str,
) -> None:
    monkeypatch.setattr(virus_scan, "REPLY_TIMEOUT", 0.5)
    monkeypatch.setattr(attachments, "CHUNK_SIZE", 1024)
    fake = FakeClamd(reply, early=early)
    socket_path = tmp_path / "fake.sock"
    server = await asyncio.start_unix_server(fake.handle, path=str(socket_path))
    try:
        use_clamd(f"unix://{socket_path}")
        attachment = await commit(conn, tenant, put(files, "x.bin", os.urandom(2_000_000)))
        await run_worker(dsn)
    finally:
        server.close()
    row = await state(conn, attachment)
    assert (row["status"], row["job_status"], row["attempts"]) == ("pending", "pending", 1)
    assert error in row["last_error"]
    assert fake.connections == 1


def test_malformed_payloads_and_unknown_schemes_are_permanent() -> None:
    with pytest.raises(PermanentError, match=r"missing required field `payload\.attachment_id`"):
        decode_payload("virus_scan", virus_scan.ScanPayload, {"id": 1})
    with pytest.raises(PermanentError, match="no fetcher for s3://"):
        attachments.fetcher_for("s3://bucket/key", virus_scan.fetchers_of(JobContext()))
