"""outbox_dispatch against real HTTP receivers on loopback (allow-listed) and real PostgreSQL."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import standardwebhooks
from aiohttp import web
from ports import free_port

import jobpool.kinds.webhooks.outbox_dispatch as outbox_dispatch
import jobpool.worker.maintenance  # noqa: F401  (registers cleanup_jobs)
from jobpool import (
    PublishedEvent,
    Subscription,
    publish_event,
    publish_event_sync,
    settings,
    subscribe_webhook,
    verify_webhook,
)
from jobpool.db.store import register_kinds
from jobpool.errors import UnknownTenantError
from jobpool.kinds.webhooks.signing import encode_secret
from jobpool.kinds.webhooks.ssrf import Address
from jobpool.payloads import decode_payload
from jobpool.registry import REGISTRY
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]
LOOPBACK = "127.0.0.0/8,::1/128"


# -- a real receiver -----------------------------------------------------------------------


@dataclass
class Hit:
    path: str
    host: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0


class Receiver:
    """An aiohttp server recording every request; each path answers its scripted replies in
    turn, repeating the last one."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.script: dict[str, list[Reply]] = {}
        self.port = 0
        self.host = "127.0.0.1"

    def answer(self, path: str, *replies: Reply) -> str:
        self.script[path] = list(replies)
        return self.url(path)

    def url(self, path: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    def paths(self) -> list[str]:
        return [hit.path for hit in self.hits]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(Hit(request.path, request.host, dict(request.headers),
                             await request.read()))
        queue = self.script.get(request.path) or [Reply()]
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return web.Response(status=reply.status, headers=reply.headers, body=reply.body)


async def _serve(host: str) -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    receiver.host = host
    receiver.port = int(runner.addresses[0][1])
    try:
        yield receiver
    finally:
        await runner.cleanup()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async for served in _serve("127.0.0.1"):
        yield served


@pytest.fixture
async def receiver6() -> AsyncIterator[Receiver]:
    async for served in _serve("::1"):
        yield served


def _configure(dsn: str, allow: str | None) -> Iterator[None]:
    previous = settings.current()
    settings.configure(replace(previous, dsn=dsn, webhook_allow_networks=allow))
    yield
    settings.configure(previous)


@pytest.fixture
def allow_loopback(dsn: str) -> Iterator[None]:
    """Settings whose allow-list opens loopback for the test receivers."""
    yield from _configure(dsn, LOOPBACK)


@pytest.fixture
def no_allow_list(dsn: str) -> Iterator[None]:
    """Settings without an allow-list: the guard refuses every non-public address."""
    yield from _configure(dsn, None)


# -- helpers -------------------------------------------------------------------------------


RUNNABLE = ("SELECT count(*) AS n FROM mdm.aa_job WHERE job_kind = %s"
            " AND status = 'pending' AND available_at <= now()")


async def run_worker(dsn: str, kind: str = "outbox_dispatch") -> None:
    """Run an until-empty worker, again while jobs of `kind` are runnable.

    An until-empty worker can stop when its last job commits follow-up jobs during its
    claim; starting it again makes the tests independent of that race.
    """
    config = WorkerConfig(kinds=(kind,), until_empty=True, poll_interval=0.2)
    for _ in range(5):
        await Worker(dsn, REGISTRY, config, actor="test-worker").run()
        async with await psycopg.AsyncConnection.connect(dsn) as check:
            row = await (await check.execute(RUNNABLE, (kind,))).fetchone()
        if not row or not row[0]:
            return


async def rows(conn: Conn, query: Any, params: Any = None) -> list[dict[str, Any]]:
    cur = await conn.execute(query, params)
    return [dict(row) for row in await cur.fetchall()]


async def deliveries(conn: Conn, event_id: int) -> dict[int, dict[str, Any]]:
    """The event's deliveries by subscription id, each with its job's status and timing."""
    found = await rows(conn, """
        SELECT d.*, d.status::text AS status, j.status::text AS job_status, j.attempts AS
               job_attempts, j.available_at, j.last_error AS job_error, now() AS db_now
          FROM mdm.aa_webhook_delivery d LEFT JOIN mdm.aa_job j ON j.id = d.job_id
         WHERE d.event_id = %s""", (event_id,))
    return {row["subscription_id"]: row for row in found}


async def make_due(conn: Conn, job_id: int) -> None:
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() WHERE id = %s", (job_id,))


async def add(conn: Conn, tenant: uuid.UUID, url: str, types: tuple[str, ...] = ("order.paid",)
              ) -> Subscription:
    return await subscribe_webhook(conn, tenant_id=tenant, url=url, event_types=types)


async def paid(conn: Conn, tenant: uuid.UUID, order: int = 1) -> PublishedEvent:
    return await publish_event(conn, tenant_id=tenant, event_type="order.paid",
                         payload={"order": order, "total": "12.50", "note": "Grüße"})


# -- writing events ------------------------------------------------------------------------


async def test_an_event_and_its_job_commit_together(conn: Conn, tenant: uuid.UUID) -> None:
    with pytest.raises(RuntimeError, match="abort"):
        async with conn.transaction():
            await paid(conn, tenant)
            raise RuntimeError("abort")
    assert await rows(conn, "SELECT id FROM mdm.aa_outbox_event") == []
    assert await rows(conn, "SELECT id FROM mdm.aa_job") == []

    event = await paid(conn, tenant)
    jobs = await rows(conn, "SELECT job_kind, payload, status::text AS status FROM mdm.aa_job")
    assert jobs == [{"job_kind": "outbox_dispatch", "payload": {"event_id": event.id},
                     "status": "pending"}]


async def test_a_plain_sql_insert_is_dispatched_too(conn: Conn, tenant: uuid.UUID) -> None:
    await conn.execute(
        "INSERT INTO mdm.aa_outbox_event (tenant_id, event_type, payload)"
        " SELECT %s, 'entity.updated', jsonb_build_object('n', n) FROM generate_series(1, 3) n",
        (tenant,))
    jobs = await rows(conn, "SELECT payload->>'event_id' AS event FROM mdm.aa_job ORDER BY id")
    events = await rows(conn, "SELECT id::text AS event FROM mdm.aa_outbox_event ORDER BY id")
    assert jobs == events and len(jobs) == 3


def test_publish_sync_writes_the_event_and_its_job(dsn: str) -> None:
    with psycopg.connect(dsn) as sync_conn:
        row = sync_conn.execute(
            "INSERT INTO mdm.aa_tenant (key) VALUES ('sync') RETURNING id").fetchone()
        assert row is not None
        event = publish_event_sync(sync_conn, tenant_id=row[0], event_type="a.b", payload=[1])
    with psycopg.connect(dsn) as check:
        job = check.execute("SELECT payload FROM mdm.aa_job").fetchone()
    assert job == ({"event_id": event.id},)


async def test_bad_events_and_subscriptions_are_refused_by_name(
    conn: Conn, tenant: uuid.UUID
) -> None:
    with pytest.raises(ValueError, match="invalid event type 'Order Paid'"):
        await publish_event(conn, tenant_id=tenant, event_type="Order Paid", payload={})
    deep: dict[str, Any] = {}
    for _ in range(3000):
        deep = {"a": deep}
    for payload, problem in [
        ({"x": object()}, "payload.x is of type object, which is not JSON"),
        ({"x": float("nan")}, "payload.x is nan, which JSON cannot hold"),
        ({"x": "\ud800"}, r"payload.x contains a lone surrogate \(U\+D800\)"),
        (deep, "payload is nested more than 100 levels deep"),
    ]:
        with pytest.raises(ValueError, match=f"payload of a 'a.b' event is refused: {problem}"):
            await publish_event(conn, tenant_id=tenant, event_type="a.b", payload=payload)
    with pytest.raises(UnknownTenantError):
        await publish_event(conn, tenant_id=uuid.uuid4(), event_type="a.b", payload={})
    with pytest.raises(UnknownTenantError):
        await subscribe_webhook(conn, tenant_id=uuid.uuid4(), url="https://hooks.example/in",
                                event_types=["a.b"])
    with pytest.raises(ValueError, match="NUL character"):
        await publish_event(conn, tenant_id=tenant, event_type="a.b", payload={"x\x00": 1})
    with pytest.raises(ValueError, match="http:// or https://"):
        await subscribe_webhook(conn, tenant_id=tenant, url="ftp://x.example/", event_types=["a.b"])
    with pytest.raises(ValueError, match="port '99999' is not a number from 1 to 65535"):
        await subscribe_webhook(conn, tenant_id=tenant, url="https://x.example:99999/",
                        event_types=["a.b"])
    with pytest.raises(ValueError, match="contains '\\\\x00'"):
        await subscribe_webhook(conn, tenant_id=tenant, url="https://x.example/\x00",
                                event_types=["a.b"])
    with pytest.raises(ValueError, match="secret"):
        await subscribe_webhook(conn, tenant_id=tenant, url="https://x.example/",
                                event_types=["a.b"], secret="hunter2")
    assert await rows(conn, "SELECT id FROM mdm.aa_outbox_event") == []
    assert await rows(conn, "SELECT id FROM mdm.aa_webhook_subscription") == []


async def test_an_escaped_backslash_before_u0000_is_text_not_nul(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await publish_event(conn, tenant_id=tenant, event_type="a.b", payload={"path": "C:\\u0000"})
    [row] = await rows(conn, "SELECT payload FROM mdm.aa_outbox_event")
    assert row["payload"] == {"path": "C:\\u0000"}


# -- delivery ------------------------------------------------------------------------------


STORED = ('{"total": 12345678901234567890.12, "big": 1e400, "precise": '
          '0.1000000000000000000000000000001, "neg0": -0, "tiny": 1e-30, '
          '"int": 123456789012345678901234567890, "text": "Grüße \\ud83d\\ude00 \\\\u0000"}')
EXACT = {"total": Decimal("12345678901234567890.12"), "big": Decimal("1e400"),
         "precise": Decimal("0.1000000000000000000000000000001"), "neg0": Decimal(0),
         "tiny": Decimal("1e-30"), "int": Decimal(123456789012345678901234567890),
         "text": "Grüße \U0001f600 \\u0000"}


async def test_numbers_arrive_exactly_as_stored_and_signed_over_the_bytes_sent(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    sub = await add(conn, tenant, receiver.answer("/exact"))
    huge = "9" * 5000 + "." + "1" * 300  # past Python's 4300-digit int conversion limit
    await conn.execute(
        "INSERT INTO mdm.aa_outbox_event (tenant_id, event_type, payload)"
        " VALUES (%s, 'order.paid', %s::jsonb), (%s, 'order.paid', %s::jsonb)",
        (tenant, STORED, tenant, f'{{"huge": {huge}}}'))

    await run_worker(dsn)
    events = await rows(conn, "SELECT id, payload::text AS stored, created_at"
                              " FROM mdm.aa_outbox_event ORDER BY id")
    assert [(await deliveries(conn, e["id"]))[sub.id]["status"] for e in events] == [
        "delivered", "delivered"]
    assert len(receiver.hits) == 2
    for event, hit in zip(events, sorted(receiver.hits, key=lambda h: len(h.body)), strict=True):
        stamp = event["created_at"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert hit.body == (f'{{"data":{event["stored"]},"timestamp":"{stamp}",'
                            '"type":"order.paid"}').encode()
        verify_webhook(sub.secret, hit.headers, hit.body, now=int(hit.headers["webhook-timestamp"]))
    small, big = sorted(receiver.hits, key=lambda h: len(h.body))
    assert b'"total": 12345678901234567890.12' in small.body
    assert b'"big": 1' + b"0" * 400 + b"," in small.body
    assert json.loads(small.body, parse_float=Decimal, parse_int=Decimal)["data"] == EXACT
    assert standardwebhooks.Webhook(sub.secret).verify(small.body, small.headers)["type"] == (
        "order.paid")
    assert f'"huge": {huge}}}'.encode() in big.body


async def test_an_event_time_rfc_3339_cannot_carry_dead_letters_its_fan_out(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    await add(conn, tenant, receiver.answer("/never"))
    await conn.execute(
        "INSERT INTO mdm.aa_outbox_event (tenant_id, event_type, created_at)"
        " VALUES (%s, 'order.paid', 'infinity'), (%s, 'order.paid', '12000-01-01 00:00:00+00')",
        (tenant, tenant))

    await run_worker(dsn)
    jobs = await rows(conn, "SELECT status::text AS status, attempts, last_error FROM mdm.aa_job"
                            " ORDER BY id")
    assert [(job["status"], job["attempts"]) for job in jobs] == [("dlq", 1), ("dlq", 1)]
    assert "has created_at infinity, which an RFC 3339 timestamp cannot carry" in (
        jobs[0]["last_error"])
    assert "has created_at 12000-01-01" in jobs[1]["last_error"]
    assert receiver.hits == []


async def test_500_then_200_sends_the_same_signed_bytes_with_the_same_id(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    url = receiver.answer("/flaky", Reply(500, body=b"boom"), Reply(200))
    sub = await add(conn, tenant, url)
    event = await paid(conn, tenant)

    await run_worker(dsn)
    first = (await deliveries(conn, event.id))[sub.id]
    assert (first["status"], first["attempts"], first["last_status_code"]) == ("pending", 1, 500)
    assert first["job_status"] == "pending" and "HTTP 500: boom" in first["job_error"]

    await make_due(conn, first["job_id"])
    await run_worker(dsn)
    second = (await deliveries(conn, event.id))[sub.id]
    assert (second["status"], second["attempts"], second["last_status_code"]) == (
        "delivered", 2, 200)
    assert second["job_status"] == "done" and second["delivered_at"] is not None

    assert receiver.paths() == ["/flaky", "/flaky"]
    one, two = receiver.hits
    assert one.headers["webhook-id"] == two.headers["webhook-id"] == second["webhook_id"]
    assert one.body == two.body
    assert json.loads(one.body) == {
        "type": "order.paid", "timestamp": json.loads(one.body)["timestamp"],
        "data": {"order": 1, "total": "12.50", "note": "Grüße"}}
    assert one.headers["Content-Type"] == "application/json"
    for hit in (one, two):
        verify_webhook(sub.secret, hit.headers, hit.body, now=int(hit.headers["webhook-timestamp"]))
        standardwebhooks.Webhook(sub.secret).verify(hit.body, hit.headers)


async def test_429_with_retry_after_waits_at_least_that_long(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    url = receiver.answer("/busy", Reply(429, headers={"Retry-After": "120"}))
    sub = await add(conn, tenant, url)
    event = await paid(conn, tenant)
    before = (await rows(conn, "SELECT now() AS t"))[0]["t"]

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub.id]
    assert row["job_status"] == "pending" and row["job_attempts"] == 1
    assert row["available_at"] >= before + timedelta(seconds=120)
    assert "Retry-After 120s" in row["job_error"]
    assert (row["status"], row["last_status_code"]) == ("pending", 429)
    assert receiver.paths() == ["/busy"]


async def test_a_400_dead_letters_only_its_delivery_and_a_replay_keeps_the_id(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    bad = await add(conn, tenant, receiver.answer("/bad", Reply(400, body=b"schema"), Reply(204)))
    good = await add(conn, tenant, receiver.answer("/good", Reply(200)))
    event = await paid(conn, tenant)

    await run_worker(dsn)
    state = await deliveries(conn, event.id)
    assert (state[bad.id]["status"], state[bad.id]["job_status"]) == ("failed", "dlq")
    assert state[bad.id]["last_status_code"] == 400
    assert "rejected the delivery: HTTP 400: schema" in state[bad.id]["job_error"]
    assert (state[good.id]["status"], state[good.id]["job_status"]) == ("delivered", "done")
    assert sorted(receiver.paths()) == ["/bad", "/good"]

    from jobpool import admin

    await admin.replay(conn, state[bad.id]["job_id"], actor="admin@test")
    await run_worker(dsn)
    state = await deliveries(conn, event.id)
    assert (state[bad.id]["status"], state[bad.id]["attempts"]) == ("delivered", 2)
    assert receiver.paths().count("/good") == 1
    bad_hits = [hit for hit in receiver.hits if hit.path == "/bad"]
    assert [hit.headers["webhook-id"] for hit in bad_hits] == [state[bad.id]["webhook_id"]] * 2
    assert bad_hits[0].body == bad_hits[1].body


async def test_410_deactivates_the_subscription(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    sub = await add(conn, tenant, receiver.answer("/gone", Reply(410)))
    event = await paid(conn, tenant)

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub.id]
    assert (row["status"], row["job_status"], row["last_status_code"]) == ("gone", "done", 410)
    [subscription] = await rows(
        conn, "SELECT active, deactivated_at, deactivated_reason FROM"
              " mdm.aa_webhook_subscription WHERE id = %s", (sub.id,))
    assert subscription["active"] is False and subscription["deactivated_at"] is not None
    assert "HTTP 410" in subscription["deactivated_reason"]
    audit = await rows(conn, "SELECT payload FROM mdm.aa_audit_log"
                             " WHERE action = 'webhook_disabled'")
    assert [a["payload"]["subscription_id"] for a in audit] == [sub.id]

    later = await paid(conn, tenant, order=2)
    await run_worker(dsn)
    assert await deliveries(conn, later.id) == {}
    assert receiver.paths() == ["/gone"]


@pytest.mark.parametrize("status", [410, 400, 503])
async def test_what_a_receiver_answers_is_stored_escaped_and_410_still_deactivates(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None,
    status: int,
) -> None:
    body = b"bye\x00\xff\xfe \x1b[2J" + b"z" * 10_000
    sub = await add(conn, tenant, receiver.answer("/odd", Reply(status, body=body)))
    event = await paid(conn, tenant)

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub.id]
    expected = f"HTTP {status}: bye\\x00\\xff\\xfe \\x1b[2Jzzz"
    assert row["last_error"].startswith(expected) and row["last_status_code"] == status
    assert len(row["last_error"]) < 400
    [subscription] = await rows(
        conn, "SELECT active, deactivated_reason FROM mdm.aa_webhook_subscription")
    if status == 410:
        assert (row["status"], row["job_status"]) == ("gone", "done")
        assert subscription["active"] is False
        assert subscription["deactivated_reason"].startswith(expected)
        [audit] = await rows(conn, "SELECT payload FROM mdm.aa_audit_log"
                                   " WHERE action = 'webhook_disabled'")
        assert audit["payload"]["reason"].startswith(expected)
    else:
        assert subscription["active"] is True and expected in row["job_error"]
        assert (row["status"], row["job_status"]) == (
            ("failed", "dlq") if status == 400 else ("pending", "pending"))


async def test_a_redirect_location_and_a_malformed_answer_are_stored_escaped(
    conn: Conn, dsn: str, tenant: uuid.UUID, allow_loopback: None,
) -> None:
    moved = await raw_receiver(b"HTTP/1.1 302 Found\r\nLocation: https://new.example/\xff\xfe"
                               b"\r\nContent-Length: 0\r\n\r\n")
    garbage = await raw_receiver(b"\x00\xff not http\r\n\r\n")
    try:
        redirected = await add(conn, tenant, f"http://127.0.0.1:{port_of(moved)}/")
        broken = await add(conn, tenant, f"http://127.0.0.1:{port_of(garbage)}/")
        event = await paid(conn, tenant)

        await run_worker(dsn)
    finally:
        for server in (moved, garbage):
            server.close()
    state = await deliveries(conn, event.id)
    assert (state[redirected.id]["status"], state[redirected.id]["job_status"]) == (
        "failed", "dlq")
    assert state[redirected.id]["last_error"] == (
        "HTTP 302 (redirects are not followed; Location: https://new.example/\\xff\\xfe)")
    assert (state[broken.id]["status"], state[broken.id]["job_status"]) == ("pending", "pending")
    assert state[broken.id]["last_status_code"] is None
    assert "ClientResponseError" in state[broken.id]["last_error"]
    assert "not http" in state[broken.id]["last_error"]


async def raw_receiver(response: bytes) -> asyncio.Server:
    """A TCP server answering every connection with `response`, whatever was asked."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


@pytest.mark.parametrize(("url", "problem"), [
    ("http://127.0.0.1:99999/", "port '99999' is not a number from 1 to 65535"),
    ("http://hook@127.0.0.1:{port}/", "must not carry user information"),
    ("http://[::1%25lo]:{port}/", "IPv6 zone ids"),
    ("http://bücher.example:{port}/", "write it in its IDNA A-label form 'xn--bcher-kva.example'"),
    ("http://127.1:{port}/", "neither a dotted-decimal IPv4 address"),
    ("http://[::1]x:{port}/", "is not host[:port]"),
])
async def test_a_bad_url_written_by_sql_dead_letters_at_once_naming_the_problem(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None,
    url: str, problem: str,
) -> None:
    [sub] = await rows(
        conn, "INSERT INTO mdm.aa_webhook_subscription (tenant_id, url, secret, event_types)"
              " VALUES (%s, %s, %s, '{*}') RETURNING id",
        (tenant, url.format(port=receiver.port), encode_secret(b"k" * 32)))
    event = await paid(conn, tenant)

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub["id"]]
    assert (row["status"], row["job_status"], row["job_attempts"]) == ("failed", "dlq", 1)
    assert problem in row["job_error"] and problem in row["last_error"]
    assert "not sent" in row["job_error"]
    assert receiver.hits == []


async def test_a_bad_secret_written_by_sql_dead_letters_at_once(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    sub = await add(conn, tenant, receiver.answer("/secret"))
    await conn.execute("UPDATE mdm.aa_webhook_subscription SET secret = 'whsec_c2hvcnQ='")
    event = await paid(conn, tenant)

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub.id]
    assert (row["status"], row["job_status"], row["job_attempts"]) == ("failed", "dlq", 1)
    assert f"subscription {sub.id}: a webhook secret must hold at least 16 bytes" in (
        row["job_error"])
    assert receiver.hits == []


async def test_only_matching_active_subscriptions_of_the_tenant_get_the_event(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    everything = await add(conn, tenant, receiver.answer("/all"), ("*",))
    await add(conn, tenant, receiver.answer("/other"), ("order.cancelled",))
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('globex') RETURNING id")
    other_tenant = (await cur.fetchone() or {})["id"]
    await add(conn, other_tenant, receiver.answer("/globex"))
    event = await paid(conn, tenant)

    await run_worker(dsn)
    assert set(await deliveries(conn, event.id)) == {everything.id}
    assert receiver.paths() == ["/all"]
    [dispatched] = await rows(conn, "SELECT dispatched_at, body FROM mdm.aa_outbox_event")
    assert dispatched["dispatched_at"] is not None
    assert bytes(dispatched["body"]) == receiver.hits[0].body


async def test_a_redirect_is_not_followed(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    target = receiver.answer("/elsewhere")
    sub = await add(conn, tenant, receiver.answer("/moved", Reply(302, {"Location": target})))
    event = await paid(conn, tenant)

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub.id]
    assert (row["status"], row["job_status"]) == ("failed", "dlq")
    assert "redirects are not followed" in row["job_error"]
    assert receiver.paths() == ["/moved"]


async def test_timeouts_refusals_and_huge_bodies_are_retried_briefly(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox_dispatch, "TOTAL_TIMEOUT", 0.5)
    slow = await add(conn, tenant, receiver.answer("/slow", Reply(200, delay=3.0)))
    huge = await add(conn, tenant, receiver.answer("/huge", Reply(503, body=b"x" * 5_000_000)))
    closed = await add(conn, tenant, f"http://127.0.0.1:{free_port()}/")
    event = await paid(conn, tenant)

    await run_worker(dsn)
    state = await deliveries(conn, event.id)
    for sub in (slow, huge, closed):
        assert (state[sub.id]["status"], state[sub.id]["job_status"]) == ("pending", "pending")
    assert "no answer" in state[slow.id]["job_error"]
    assert state[huge.id]["last_status_code"] == 503
    assert len(state[huge.id]["last_error"]) < 400
    assert "Connect" in state[closed.id]["job_error"]


# -- the SSRF guard ------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "answer"), [
    ("127.0.0.1", None), ("localhost", None), ("internal.test", "10.0.0.1"),
    ("metadata.test", "169.254.169.254"), ("metadata6.test", "fd00:ec2::254"),
])
async def test_non_public_targets_are_refused_without_a_connection(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, no_allow_list: None,
    monkeypatch: pytest.MonkeyPatch, host: str, answer: str | None,
) -> None:
    if answer is not None:
        async def fake_dns(name: str, port: int) -> list[Address]:
            assert name == host
            return [ipaddress.ip_address(answer)]
        monkeypatch.setattr(outbox_dispatch, "resolve", fake_dns)
    sub = await add(conn, tenant, f"http://{host}:{receiver.port}/hook")
    event = await paid(conn, tenant)

    await run_worker(dsn)
    row = (await deliveries(conn, event.id))[sub.id]
    assert (row["status"], row["job_status"], row["job_attempts"]) == ("failed", "dlq", 1)
    assert f"webhook target '{host}' resolves to" in row["job_error"]
    assert "refused, no connection made" in row["job_error"]
    assert receiver.hits == []


async def test_ipv6_loopback_is_refused_then_allowed_by_the_list(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver6: Receiver,
) -> None:
    sub = await add(conn, tenant, receiver6.answer("/v6"))
    event = await paid(conn, tenant)
    for allow in (None, LOOPBACK):
        for _ in _configure(dsn, allow):
            await run_worker(dsn)
            row = (await deliveries(conn, event.id))[sub.id]
            if allow is None:
                assert row["job_status"] == "dlq" and "(loopback address)" in row["job_error"]
                assert receiver6.hits == []
                from jobpool import admin

                await admin.replay(conn, row["job_id"], actor="admin@test")
    row = (await deliveries(conn, event.id))[sub.id]
    assert row["status"] == "delivered" and receiver6.paths() == ["/v6"]


async def test_the_checked_address_is_the_one_connected_to_with_the_right_host_header(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lookups: list[str] = []

    async def one_answer(name: str, port: int) -> list[Address]:
        lookups.append(name)
        return [ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(outbox_dispatch, "resolve", one_answer)
    sub = await add(conn, tenant, f"http://hooks.customer.test:{receiver.port}/in")
    event = await paid(conn, tenant)

    await run_worker(dsn)
    assert (await deliveries(conn, event.id))[sub.id]["status"] == "delivered"
    assert lookups == ["hooks.customer.test"]  # resolved once; the system resolver never
    assert receiver.hits[0].host == f"hooks.customer.test:{receiver.port}"  # knew this name


# -- compaction ----------------------------------------------------------------------------


async def test_cleanup_compacts_settled_events_past_retention(
    conn: Conn, dsn: str, tenant: uuid.UUID, receiver: Receiver, allow_loopback: None
) -> None:
    await add(conn, tenant, receiver.answer("/ok"))
    stuck = await add(conn, tenant, receiver.answer("/down", Reply(503)))
    settled = await paid(conn, tenant, order=1)
    await run_worker(dsn)
    await conn.execute("UPDATE mdm.aa_webhook_subscription SET active = false,"
                       " deactivated_at = now() WHERE id = %s", (stuck.id,))
    recent = await paid(conn, tenant, order=2)
    await run_worker(dsn)
    old = await paid(conn, tenant, order=3)
    await run_worker(dsn)
    await conn.execute(
        "UPDATE mdm.aa_outbox_event SET dispatched_at = now() - interval '8 days'"
        " WHERE id = ANY(%s)", ([settled.id, old.id],))
    assert (await deliveries(conn, settled.id))[stuck.id]["job_status"] == "pending"

    await register_kinds(conn, [REGISTRY.get("cleanup_jobs")])
    await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts)"
        " VALUES ('00000000-0000-0000-0000-000000000000', 'cleanup_jobs', 1)")
    await run_worker(dsn, "cleanup_jobs")

    [result] = await rows(conn, "SELECT result FROM mdm.aa_job WHERE job_kind = 'cleanup_jobs'")
    assert result["result"]["outbox_events_deleted"] == 1
    left = await rows(conn, "SELECT id FROM mdm.aa_outbox_event ORDER BY id")
    assert [r["id"] for r in left] == [settled.id, recent.id]  # pending delivery keeps it
    assert await deliveries(conn, old.id) == {}


async def test_handler_refuses_a_malformed_payload(conn: Conn, tenant: uuid.UUID) -> None:
    from jobpool.errors import PermanentError

    model = outbox_dispatch.DispatchPayload
    with pytest.raises(PermanentError, match=r"unknown field `payload\.event`"):
        decode_payload("outbox_dispatch", model, {"event": 1})
    with pytest.raises(PermanentError, match="event_id"):
        decode_payload("outbox_dispatch", model, {"event_id": 1, "delivery_id": 2})
    assert decode_payload("outbox_dispatch", model, {"delivery_id": 3}) == model(delivery_id=3)
    assert encode_secret(b"x" * 16).startswith("whsec_")
