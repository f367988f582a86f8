"""The admin REST API against a real database, over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import psycopg
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import jobpool
from jobpool.admin import ERROR_PREVIEW_CHARS, PREVIEW_CHARS, PREVIEW_READ_LIMIT
from jobpool.api.app import CONSOLE_ASSETS, CONSOLE_FILES, build_app
from jobpool.api.auth import TokenVerifier, load_verifier
from jobpool.cli import main
from jobpool.db.connect import open_pool
from jobpool.db.store import register_kinds
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.job import Job
from jobpool.registry import REGISTRY

Conn = psycopg.AsyncConnection[dict[str, Any]]
KIND = "test_api_kind"
AUDIENCE = "jobpool-admin"
SECRET = "s3cret-s3cret-s3cret-s3cret-s3cret!"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RSA_PUBLIC_PEM = RSA_KEY.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@jobpool.kind(KIND)
async def never_runs(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """No worker runs in these tests; the kind only has to be registered."""


def token(*, sub: str = "alice", permissions: Any = ("manage_metadata",),
          expires_in: float = 86_400,  # tokens are made at collection: outlive a slow suite
          key: Any = SECRET, algorithm: str = "HS256", audience: str = AUDIENCE,
          headers: dict[str, Any] | None = None, tenants: Any = "*") -> str:
    claims = {"sub": sub, "aud": audience, "exp": int(time.time() + expires_in),
              "permissions": list(permissions)}
    if tenants is not None:
        claims["tenants"] = tenants
    return jwt.encode(claims, key, algorithm=algorithm, headers=headers)


def verifier() -> TokenVerifier:
    return load_verifier(secret=SECRET, public_key=RSA_PUBLIC_PEM, audience=AUDIENCE)


async def seed(conn: Conn, tenant: uuid.UUID, *, dlq: int = 3, pending: int = 1,
               running: int = 1) -> dict[str, list[int]]:
    """Jobs of KIND in the DLQ, pending and running; returns their ids by status."""
    await register_kinds(conn, [REGISTRY.get(KIND)])
    made = await enqueue_many(conn, [NewJob(tenant, KIND, {"n": n})
                                     for n in range(dlq + pending + running)])
    ids = [job.id for job in made]
    groups = {"dlq": ids[:dlq], "pending": ids[dlq:dlq + pending], "running": ids[dlq + pending:]}
    await conn.execute(
        "UPDATE mdm.aa_job SET status = 'dlq', attempts = max_attempts, completed_at = now(), "
        "last_error = 'boom', claimed_by = 'w', claimed_at = now(), "
        "lease_expires_at = now() + interval '30 seconds' WHERE id = ANY(%s)", (groups["dlq"],))
    await conn.execute(
        "UPDATE mdm.aa_job SET status = 'running', attempts = 1, claimed_by = 'w', "
        "claimed_at = now(), heartbeat_at = now(), lease_expires_at = now() + interval "
        "'30 seconds' WHERE id = ANY(%s)", (groups["running"],))
    return groups


class Client:
    """The API served on a free port in this event loop, and an HTTP session to it."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(self, method: str, path: str, *, bearer: str | None = None,
                   **kwargs: Any) -> tuple[int, Any, aiohttp.ClientResponse]:
        headers = dict(kwargs.pop("headers", {}))
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        async with self.session.request(method, self.base + path, headers=headers,
                                        **kwargs) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None, response


@pytest.fixture
async def api(dsn: str) -> AsyncIterator[Client]:
    async with serving(dsn) as client:
        yield client


@contextlib.asynccontextmanager
async def serving(dsn: str) -> AsyncIterator[Client]:
    """The admin API on a pool of two connections to `dsn`, and a client of it."""
    pool = open_pool(dsn, size=2, name="test-api")
    await pool.open(wait=True)
    runner = web.AppRunner(build_app(pool, verifier()))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            yield Client(session, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
        await pool.close()


async def job_row(conn: Conn, job_id: int) -> dict[str, Any] | None:
    cur = await conn.execute("SELECT status::text AS status, attempts, available_at, last_error "
                             "FROM mdm.aa_job WHERE id = %s", (job_id,))
    return await cur.fetchone()


async def claim_columns(conn: Conn, job_id: int) -> tuple[Any, ...]:
    """The job's claim: who holds it, since when, its heartbeat and its lease."""
    cur = await conn.execute("SELECT claimed_by, claimed_at, heartbeat_at, lease_expires_at "
                             "FROM mdm.aa_job WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None
    return tuple(row.values())


async def audit(conn: Conn, job_id: int) -> list[dict[str, Any]]:
    cur = await conn.execute("SELECT action::text AS action, actor_principal_id, payload "
                             "FROM mdm.aa_audit_log WHERE job_id = %s ORDER BY id", (job_id,))
    return await cur.fetchall()


# -- DLQ actions ---------------------------------------------------------------------------


async def test_replay_of_a_dlq_job_is_audited_with_the_token_subject(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    job = (await seed(conn, tenant))["dlq"][0]
    status, body, _ = await api.call("POST", f"/v1/jobs/{job}/replay",
                                     bearer=token(sub="steward@acme"))
    assert status == 200
    assert (body["id"], body["status"], body["attempts"]) == (job, "pending", 0)
    row = await job_row(conn, job)
    assert row is not None and (row["status"], row["attempts"]) == ("pending", 0)
    assert await claim_columns(conn, job) == (None, None, None, None)
    replays = [a for a in await audit(conn, job) if a["action"] == "job_replay"]
    assert [a["actor_principal_id"] for a in replays] == ["token:steward@acme"]


async def test_replay_of_a_pending_job_is_409_and_changes_nothing(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    job = (await seed(conn, tenant))["pending"][0]
    before = await job_row(conn, job)
    status, body, response = await api.call("POST", f"/v1/jobs/{job}/replay", bearer=token())
    assert status == 409
    assert response.content_type == "application/problem+json"
    assert body["status"] == 409
    assert "it is pending, only dlq jobs can be replayed" in body["detail"]
    assert await job_row(conn, job) == before
    assert [a["action"] for a in await audit(conn, job)] == ["job_enqueued"]


async def test_discard_snapshots_the_row_and_refuses_a_running_job(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    groups = await seed(conn, tenant)
    dead, running = groups["dlq"][0], groups["running"][0]
    status, body, _ = await api.call("DELETE", f"/v1/jobs/{running}", bearer=token())
    assert status == 409 and "only dlq or stopped (failed) jobs can be discarded" in body["detail"]
    assert (await job_row(conn, running) or {}).get("status") == "running"

    status, body, _ = await api.call("DELETE", f"/v1/jobs/{dead}", bearer=token(sub="bob"))
    assert (status, body) == (204, None)
    assert await job_row(conn, dead) is None
    discard = [a for a in await audit(conn, dead) if a["action"] == "job_discard"]
    assert len(discard) == 1 and discard[0]["actor_principal_id"] == "token:bob"
    assert discard[0]["payload"]["payload"] == {"n": 0}
    assert discard[0]["payload"]["last_error"] == "boom"
    assert (await api.call("GET", f"/v1/jobs/{dead}", bearer=token()))[0] == 404


async def test_stop_sets_the_manual_flag_once(api: Client, conn: Conn, tenant: uuid.UUID) -> None:
    job = (await seed(conn, tenant))["pending"][0]
    status, body, _ = await api.call("POST", f"/v1/jobs/{job}/stop", bearer=token())
    assert (status, body["status"]) == (200, "failed")
    status, body, _ = await api.call("POST", f"/v1/jobs/{job}/stop", bearer=token())
    assert status == 409 and "it is failed" in body["detail"]


async def test_a_stopped_running_job_keeps_no_claim_nor_lease(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    job = (await seed(conn, tenant))["running"][0]
    status, body, _ = await api.call("POST", f"/v1/jobs/{job}/stop", bearer=token())
    assert (status, body["status"]) == (200, "failed")
    assert await claim_columns(conn, job) == (None, None, None, None)


async def test_dlq_pages_by_keyset_and_filters(api: Client, conn: Conn, tenant: uuid.UUID
                                               ) -> None:
    dead = (await seed(conn, tenant, dlq=5))["dlq"]
    pages: list[list[int]] = []
    after: int | None = 0
    while after is not None:
        status, body, _ = await api.call("GET", f"/v1/dlq?limit=2&after={after}&tenant=acme",
                                         bearer=token())
        assert status == 200
        pages.append([item["id"] for item in body["items"]])
        after = body["next_after"]
    assert pages == [dead[0:2], dead[2:4], dead[4:5]]
    _, body, _ = await api.call("GET", f"/v1/dlq?tenant={tenant}&kind={KIND}", bearer=token())
    assert [item["id"] for item in body["items"]] == dead
    first = body["items"][0]
    assert (first["last_error_preview"], first["last_error_length"], first["tenant_key"]) == (
        "boom", 4, "acme")
    assert (first["payload_preview"], first["payload_truncated"]) == ('{"n": 0}', False)
    # a misspelt kind is named, not answered with an empty page
    status, body, _ = await api.call("GET", f"/v1/dlq?kind={KIND}x", bearer=token())
    assert status == 404
    assert body["detail"].startswith(f"unknown job kind '{KIND}x' (did you mean '{KIND}'?)")


async def test_stats_count_by_tenant_kind_and_status(api: Client, conn: Conn, tenant: uuid.UUID
                                                     ) -> None:
    await seed(conn, tenant, dlq=2, pending=3, running=1)
    status, body, _ = await api.call("GET", "/v1/stats", bearer=token())
    assert status == 200
    assert body["totals"] == {"dlq": 2, "pending": 3, "running": 1}
    assert {(c["tenant"], c["kind"], c["status"], c["jobs"]) for c in body["counts"]} == {
        ("acme", KIND, "dlq", 2), ("acme", KIND, "pending", 3), ("acme", KIND, "running", 1)}


# -- stored data the API cannot decode -------------------------------------------------------


def deep_json(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


async def test_jobs_with_undecodable_data_are_served_not_500(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    """Payloads and results written by SQL that are too deep (or too long a number) to
    decode are served as {"undecodable": why, "text": its start}; the other jobs as they are."""
    dead = (await seed(conn, tenant, dlq=2, pending=0, running=0))["dlq"]
    await conn.execute("UPDATE mdm.aa_job SET payload = %s::jsonb, result = %s::jsonb "
                       "WHERE id = %s", (deep_json(980), deep_json(300), dead[0]))
    await conn.execute("UPDATE mdm.aa_job SET payload = %s::jsonb WHERE id = %s",
                       ('{"n": ' + "9" * 5000 + "}", dead[1]))
    healthy = (await seed(conn, tenant, dlq=1, pending=0, running=0))["dlq"][0]

    status, body, _ = await api.call("GET", f"/v1/jobs/{dead[0]}", bearer=token())
    assert status == 200
    assert body["payload"]["undecodable"] == "nested 980 levels deep, more than the limit of 100"
    assert body["payload"]["text"].startswith('{"a": {"a": ')
    assert body["result"]["undecodable"] == "nested 300 levels deep, more than the limit of 100"

    status, body, _ = await api.call("GET", "/v1/dlq", bearer=token())
    assert status == 200
    items = {item["id"]: item for item in body["items"]}
    assert set(items) == {*dead, healthy}
    assert items[dead[0]]["payload_preview"].startswith('{"a": {"a": ')
    assert items[dead[1]]["payload_preview"] == '{"n": ' + "9" * (PREVIEW_CHARS - 6)
    assert [items[i]["payload_truncated"] for i in (*dead, healthy)] == [True, True, False]
    assert items[healthy]["payload_preview"] == '{"n": 0}'

    status, body, _ = await api.call("POST", f"/v1/jobs/{dead[0]}/replay", bearer=token())
    assert (status, body["status"]) == (200, "pending")
    status, body, _ = await api.call("POST", f"/v1/jobs/{dead[0]}/stop", bearer=token())
    assert (status, body["status"]) == (200, "failed")
    assert (await api.call("DELETE", f"/v1/jobs/{dead[0]}", bearer=token()))[0] == 204


async def test_job_times_python_cannot_hold_are_served_as_infinity(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    """A DLQ row written by SQL before the database refused such times: served, not a 500."""
    dead = (await seed(conn, tenant, dlq=2, pending=0, running=0))["dlq"]
    for constraint in ("created_at", "completed_at"):
        await conn.execute(f"ALTER TABLE mdm.aa_job DROP CONSTRAINT aa_job_{constraint}_in_range")
    await conn.execute("UPDATE mdm.aa_job SET created_at = '-infinity', "
                       "completed_at = '10000-01-01' WHERE id = %s", (dead[0],))

    status, body, _ = await api.call("GET", f"/v1/jobs/{dead[0]}", bearer=token())
    assert (status, body["created_at"], body["completed_at"]) == (200, "-infinity", "infinity")
    status, body, _ = await api.call("GET", "/v1/dlq", bearer=token())
    assert status == 200
    items = {item["id"]: item for item in body["items"]}
    assert (items[dead[0]]["created_at"], items[dead[0]]["dlq_at"]) == ("-infinity", "infinity")
    assert items[dead[1]]["created_at"] not in ("-infinity", "infinity")


# -- lists are bounded --------------------------------------------------------------------


def incompressible(chars: int) -> str:
    """Hex text that compression cannot shrink much (stored at about half its length)."""
    return os.urandom(chars // 2).hex()


async def test_a_dlq_page_carries_previews_whatever_the_payloads_hold(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    """Big payloads and errors stay in the database: a page is a few kilobytes per job, and
    the whole payload is the job's own endpoint."""
    dead = (await seed(conn, tenant, dlq=4, pending=0, running=0))["dlq"]
    big = {"blob": incompressible(4_000_000)}
    await conn.execute("UPDATE mdm.aa_job SET payload = %s, last_error = %s WHERE id = ANY(%s)",
                       (Jsonb(big), "E" * 4_000, dead[:3]))
    medium = {"text": "ab" * 5_000}  # stored within the read limit: cut, not left out
    await conn.execute("UPDATE mdm.aa_job SET payload = %s WHERE id = %s",
                       (Jsonb(medium), dead[3]))

    status, body, response = await api.call("GET", "/v1/dlq?limit=50", bearer=token())

    assert status == 200
    assert int(response.headers["Content-Length"]) < 4 * 4_000  # 4 jobs, not 12 MB
    items = {item["id"]: item for item in body["items"]}
    for ident in dead[:3]:
        item = items[ident]
        assert (item["payload_preview"], item["payload_truncated"]) == (None, True)
        assert item["payload_size"] > PREVIEW_READ_LIMIT
        assert item["last_error_preview"] == "E" * ERROR_PREVIEW_CHARS
        assert (item["last_error_length"], item["last_error_truncated"]) == (4_000, True)
    assert items[dead[3]]["payload_preview"] == json.dumps(medium)[:PREVIEW_CHARS]
    assert items[dead[3]]["payload_truncated"] is True
    status, body, _ = await api.call("GET", f"/v1/jobs/{dead[0]}", bearer=token())
    assert (status, body["payload"]) == (200, big)


async def test_the_history_carries_previews_and_each_entry_is_whole_on_its_own(
    api: Client, conn: Conn, tenant: uuid.UUID
) -> None:
    """A discard's audit row holds the whole job: its history row shows a preview, its own
    endpoint the snapshot."""
    job = (await seed(conn, tenant, dlq=1, pending=0, running=0))["dlq"][0]
    big = {"blob": incompressible(200_000)}
    await conn.execute("UPDATE mdm.aa_job SET payload = %s WHERE id = %s", (Jsonb(big), job))
    assert (await api.call("DELETE", f"/v1/jobs/{job}", bearer=token()))[0] == 204

    status, body, response = await api.call("GET", f"/v1/audit/jobs/{job}", bearer=token())

    assert status == 200 and int(response.headers["Content-Length"]) < 4_000
    enqueued, discarded = body["items"]
    assert (enqueued["action"], enqueued["payload_truncated"]) == ("job_enqueued", False)
    assert json.loads(enqueued["payload_preview"])["kind"] == KIND
    assert (discarded["action"], discarded["payload_preview"]) == ("job_discard", None)
    assert discarded["payload_truncated"] is True
    status, entry, _ = await api.call("GET", f"/v1/audit/entries/{discarded['id']}",
                                      bearer=token())
    assert status == 200
    assert (entry["job_id"], entry["action"], entry["payload"]["payload"]) == (
        job, "job_discard", big)
    status, problem, _ = await api.call("GET", "/v1/audit/entries/999999999", bearer=token())
    assert (status, problem["detail"]) == (404, "no audit entry with id 999999999")


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "status", "detail"), [
    ("/v1/jobs/abc", 400, "job id must be an integer, got 'abc'"),
    ("/v1/jobs/0", 400, "job id must be between 1 and"),
    ("/v1/jobs/-3", 400, "job id must be between 1 and"),
    ("/v1/jobs/99999999999999999999", 400, "job id must be between 1 and"),
    ("/v1/jobs/424242", 404, "no job with id 424242"),
    ("/v1/dlq?limit=0", 400, "limit must be between 1 and 1000, got 0"),
    ("/v1/dlq?limit=lots", 400, "limit must be an integer, got 'lots'"),
    ("/v1/dlq?after=-1", 400, "after must be between 0 and"),
    ("/v1/dlq?kind=DROP%20TABLE", 400, "kind must be a kind name"),
    ("/v1/dlq?tenant=nobody", 404, "unknown tenant 'nobody'"),
    ("/v1/dlq?tenant=%27%3B--", 400, "is neither a tenant key (1 to 63 lower-case letters"),
    ("/v1/dlq?tenant=ACME", 400, "'ACME' is neither a tenant key"),
    ("/v1/dlq?tenant=%ff", 400, "is neither a tenant key"),
    ("/v1/dlq?limit=%ff", 400, "limit must be an integer"),
    ("/v1/jobs/%ff", 400, "job id must be an integer"),
    ("/v1/nothing", 404, "Not Found"),
])
async def test_bad_input_is_a_named_4xx(api: Client, path: str, status: int, detail: str) -> None:
    got, body, response = await api.call("GET", path, bearer=token())
    assert got == status
    assert response.content_type == "application/problem+json"
    assert detail in body["detail"]


async def test_wrong_method_and_oversized_body(api: Client, conn: Conn, tenant: uuid.UUID
                                               ) -> None:
    job = (await seed(conn, tenant))["dlq"][0]
    status, body, response = await api.call("PUT", f"/v1/jobs/{job}", bearer=token())
    assert status == 405 and "DELETE" in response.headers["Allow"]
    status, body, _ = await api.call("POST", f"/v1/jobs/{job}/replay", bearer=token(),
                                     data=b"x" * (1024 * 1024))
    assert status == 413 and body["status"] == 413
    assert body["detail"] == "the request body is larger than 65536 bytes; no endpoint takes one"
    assert (await job_row(conn, job) or {}).get("status") == "dlq"


async def test_a_console_file_that_does_not_exist_is_a_problem_404(api: Client) -> None:
    status, body, response = await api.call("GET", "/console/no-such-file.js")
    assert (status, response.content_type) == (404, "application/problem+json")
    assert body["status"] == 404


async def test_a_tenant_id_is_found_in_any_case(api: Client, conn: Conn, tenant: uuid.UUID
                                               ) -> None:
    dead = (await seed(conn, tenant))["dlq"]
    for ref in (str(tenant).upper(), str(tenant), "acme"):
        status, body, _ = await api.call("GET", f"/v1/dlq?tenant={ref}", bearer=token())
        assert status == 200, (ref, body)
        assert [item["id"] for item in body["items"]] == dead


async def test_a_tenant_whose_metadata_python_cannot_decode_is_still_found(
    api: Client, conn: Conn
) -> None:
    """The lookup reads only the tenant's id: its metadata (1e5000 is valid jsonb, but too
    many digits for Python's int()) is not the API's business."""
    await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES "
                       "('huge', '{\"rate_limit\": {\"k\": {\"rps\": 1e5000}}}')")
    status, body, _ = await api.call("GET", "/v1/dlq?tenant=huge", bearer=token())
    assert (status, body) == (200, {"items": [], "next_after": None})


async def test_a_body_that_cannot_be_decoded_is_a_400(api: Client, conn: Conn,
                                                      tenant: uuid.UUID) -> None:
    job = (await seed(conn, tenant))["dlq"][0]
    status, body, response = await api.call(
        "POST", f"/v1/jobs/{job}/replay", bearer=token(), data=b"not gzip at all",
        headers={"Content-Encoding": "gzip"})
    assert status == 400 and response.content_type == "application/problem+json"
    assert "the request body cannot be read" in body["detail"]
    assert (await job_row(conn, job) or {}).get("status") == "dlq"


async def raw_request(api: Client, head: bytes) -> tuple[int, str, dict[str, Any]]:
    """Send `head` (request line and headers, any bytes) as is; the status, type and body."""
    host, port = api.base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"Host: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    content_type = next((line.split(b":", 1)[1].split(b";")[0].strip().decode()
                         for line in headers.split(b"\r\n")
                         if line.lower().startswith(b"content-type:")), "")
    return int(status_line.split()[1]), content_type, json.loads(body)


# -- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize("credentials", [
    b"Bearer \xff", b"Bearer a\xff.b.c", b"Bearer eyJhbGciOiJIUzI1NiJ9\xff.e30.x",
    b"bearer \xc3\xa9t\xc3\xa9", b"Bearer a.b.c d.e.f",
])
async def test_a_header_with_bytes_no_token_holds_is_a_401(api: Client, credentials: bytes
                                                           ) -> None:
    status, content_type, body = await raw_request(
        api, b"GET /v1/stats HTTP/1.1\r\nAuthorization: " + credentials + b"\r\n")
    assert (status, content_type) == (401, "application/problem+json")
    assert body["detail"] == "malformed token: a JWT holds only base64url characters and dots"


def forged_hs256_with_public_key() -> str:
    """A token that abuses the RSA public key as an HMAC secret (algorithm confusion)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64(json.dumps({"sub": "mallory", "aud": AUDIENCE, "exp": int(time.time()) + 86_400,
                             "permissions": ["manage_metadata"]}).encode())
    mac = hmac.new(RSA_PUBLIC_PEM.encode(), f"{header}.{claims}".encode(), hashlib.sha256)
    return f"{header}.{claims}.{b64(mac.digest())}"


def unsigned() -> str:
    return jwt.encode({"sub": "mallory", "aud": AUDIENCE, "exp": int(time.time()) + 86_400,
                       "permissions": ["manage_metadata"]}, None, algorithm="none")


@pytest.mark.parametrize(("bearer", "detail"), [
    (None, "missing Authorization header"),
    ("", "malformed Authorization header"),
    ("not-a-jwt", "malformed token"),
    (token(expires_in=-60), "token expired"),
    (token(key="another-secret-another-secret-xx"), "token signature does not verify"),
    (token(audience="someone-else"), "token is not for this API"),
    (token(key=OTHER_RSA_KEY, algorithm="RS256"), "token signature does not verify"),
    (token(key=ec.generate_private_key(ec.SECP256R1()), algorithm="ES256"),
     "token signed with 'ES256'"),
    (unsigned(), "token signed with 'none'"),
    (forged_hs256_with_public_key(), "token signature does not verify"),
    (token(sub="ali\x00ce"), "token sub must be printable text"),
    (token(sub="ali\ud800ce"), "token sub must be printable text"),
    (token(sub="alice\nbob"), "token sub must be printable text"),
    (token(sub="\x1b[31malice"), "token sub must be printable text"),
])
async def test_bad_tokens_get_401(api: Client, conn: Conn, tenant: uuid.UUID,
                                  bearer: str | None, detail: str) -> None:
    job = (await seed(conn, tenant))["dlq"][0]
    headers = {"Authorization": "Basic YWxpY2U6eA=="} if bearer == "" else {}
    status, body, response = await api.call("POST", f"/v1/jobs/{job}/replay",
                                            bearer=bearer or None, headers=headers)
    assert status == 401
    assert detail in body["detail"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await job_row(conn, job) or {}).get("status") == "dlq"


async def test_a_token_without_manage_metadata_gets_403(api: Client, conn: Conn,
                                                        tenant: uuid.UUID) -> None:
    job = (await seed(conn, tenant))["dlq"][0]
    for permissions in ((), ("read_metadata",), "manage_metadata"):
        status, body, _ = await api.call("POST", f"/v1/jobs/{job}/replay",
                                         bearer=token(permissions=permissions))
        assert status == 403, permissions
        assert "lacks the permission 'manage_metadata'" in body["detail"]
    assert (await job_row(conn, job) or {}).get("status") == "dlq"


async def test_rs256_tokens_verify_with_the_public_key(api: Client, conn: Conn,
                                                       tenant: uuid.UUID) -> None:
    job = (await seed(conn, tenant))["dlq"][0]
    status, _, _ = await api.call("POST", f"/v1/jobs/{job}/replay",
                                  bearer=token(key=RSA_KEY, algorithm="RS256", sub="carol"))
    assert status == 200
    assert [a["actor_principal_id"] for a in await audit(conn, job)
            if a["action"] == "job_replay"] == ["token:carol"]


def test_es256_tokens_verify_with_a_jwks_file(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}))
    checker = load_verifier(secret=None, public_key=str(path), audience=AUDIENCE)
    good = token(key=key, algorithm="ES256", headers={"kid": "k1"}, sub="dave")
    assert checker.principal(f"Bearer {good}").subject == "dave"
    other_kid = token(key=key, algorithm="ES256", headers={"kid": "k2"})
    with pytest.raises(Exception, match="with kid 'k2'"):
        checker.principal(f"Bearer {other_kid}")


async def test_only_the_document_and_the_probe_are_public(api: Client) -> None:
    status, body, _ = await api.call("GET", "/openapi.json")
    assert status == 200 and body["openapi"].startswith("3.")
    assert (await api.call("GET", "/healthz"))[0] == 200
    assert (await api.call("GET", "/v1/stats"))[0] == 401


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"secret": None, "public_key": None, "audience": AUDIENCE}, "needs a token key"),
    ({"secret": "short", "public_key": None, "audience": AUDIENCE}, "at least 32 bytes"),
    ({"secret": SECRET, "public_key": None, "audience": None}, "JOBPOOL_API_JWT_AUDIENCE"),
    ({"secret": None, "public_key": "/nonexistent.pem", "audience": AUDIENCE}, "cannot read"),
    # a device that never ends: read up to the limit, not until memory runs out
    ({"secret": None, "public_key": "/dev/zero", "audience": AUDIENCE},
     "file /dev/zero: longer than 1048576 bytes"),
    ({"secret": None, "public_key": "/", "audience": AUDIENCE}, "file /: it is a directory"),
    ({"secret": None, "public_key": "-----BEGIN PUBLIC KEY-----\nxx\n-----END PUBLIC KEY-----",
      "audience": AUDIENCE}, "not a PEM public key"),
])
def test_the_api_refuses_to_start_without_usable_keys(kwargs: dict[str, Any], message: str
                                                      ) -> None:
    with pytest.raises(ValueError, match=message):
        load_verifier(**kwargs)


def test_jobpool_api_without_a_key_exits_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("JOBPOOL_API_JWT_SECRET", "JOBPOOL_API_JWT_PUBLIC_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["api", "--dsn", "postgresql://unused@127.0.0.1:1/x"]) == 2
    assert "the admin API needs a token key" in capsys.readouterr().err


# -- schemathesis against the live server --------------------------------------------------


@contextlib.contextmanager
def api_in_thread(dsn: str) -> Iterator[str]:
    """The API in a thread of its own (schemathesis calls it synchronously)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def start() -> None:
        pool = open_pool(dsn, size=2, name="test-api-schema")
        await pool.open(wait=True)
        runner = web.AppRunner(build_app(pool, verifier()))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        state.update(pool=pool, runner=runner, port=runner.addresses[0][1])

    async def stop() -> None:
        await state["runner"].cleanup()
        await state["pool"].close()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="api", daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def seed_sync(dsn: str) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                         row_factory=dict_row) as conn:
            cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme') RETURNING id")
            row = await cur.fetchone()
            assert row is not None
            await seed(conn, row["id"], dlq=4, pending=2, running=2)

    asyncio.run(go())


SCHEMATHESIS_CONFIG = """
[warnings]
# a run that only ever met 401/403 (handlers not reached), or whose valid requests the server
# refuses as invalid (document and server disagree), fails instead of passing with a warning
fail-on = ["missing_auth", "validation_mismatch", "unsupported_regex"]
"""


def test_schemathesis_finds_no_error_against_the_live_server(dsn: str, tmp_path: Path) -> None:
    """Every schemathesis check (server errors, status codes, content types, headers, schemas,
    auth, links) passes, with a real database behind the handlers and a valid token."""
    seed_sync(dsn)
    (tmp_path / "schemathesis.toml").write_text(SCHEMATHESIS_CONFIG)
    with api_in_thread(dsn) as base:
        run = subprocess.run(
            [str(Path(sys.executable).with_name("schemathesis")), "run", f"{base}/openapi.json",
             "--checks", "all", "--max-examples", "40", "--no-color",
             "-H", f"Authorization: Bearer {token(expires_in=3600)}"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "13 selected / 13 total" in run.stdout


async def test_every_file_of_the_console_is_served(api: Client) -> None:
    """Each file is a route of its own: one added to the folder must be listed too."""
    files = {path.name for path in CONSOLE_FILES.iterdir()} - {"index.html"}
    assert files == set(CONSOLE_ASSETS)
    for name in sorted(files):
        async with api.session.get(f"{api.base}/console/{name}") as response:
            assert (response.status, await response.read()) == (
                200, (CONSOLE_FILES / name).read_bytes()), name
