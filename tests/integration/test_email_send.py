"""email_send against a real SMTP server (aiosmtpd) started by the test."""

from __future__ import annotations

import email
import email.policy
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from ports import free_port
from psycopg.types.json import Jsonb

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar
from jobpool import settings
from jobpool.job import JobContext
from jobpool.registry import load_kind_modules

Conn = psycopg.AsyncConnection[dict[str, Any]]


class Inbox:
    """An aiosmtpd handler that keeps messages and envelopes, and refuses some recipients."""

    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []
        self.envelopes: list[tuple[str, list[str], bool]] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          options: Any) -> str:
        if address.startswith("reject@"):
            return "550 5.1.1 no such user"
        if address.startswith("busy@"):
            return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(email.message_from_bytes(envelope.content,
                                                      policy=email.policy.SMTPUTF8))
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos),
                               bool(envelope.smtp_utf8)))
        return "250 Message accepted"


@contextmanager
def smtp_server(url_user: str = "", **options: Any) -> Iterator[Inbox]:
    """A real SMTP server on a free port, configured as JOBPOOL_SMTP_URL while it runs."""
    handler = Inbox()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port, **options)
    controller.start()
    previous = settings.current()
    settings.configure(replace(previous, smtp_url=f"smtp://{url_user}127.0.0.1:{port}",
                               smtp_from="noreply@mdm.example"))
    try:
        yield handler
    finally:
        settings.configure(previous)
        controller.stop()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    """A server without SMTPUTF8 (the Controller would offer it by default)."""
    with smtp_server(enable_SMTPUTF8=False) as handler:
        yield handler


@pytest.fixture
def utf8_inbox() -> Iterator[Inbox]:
    """A server that offers SMTPUTF8."""
    with smtp_server(enable_SMTPUTF8=True) as handler:
        yield handler


MAIL = {"to": "ada@example.com", "subject": "Welcome", "text": "Hello Ada",
        "html": "<p>Hello Ada</p>"}


async def test_delivered_once_with_the_expected_headers(conn: Conn, dsn: str, tenant: uuid.UUID,
                                                        inbox: Inbox) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send", payload=MAIL)).id
    await run_until_empty(dsn, "email_send")
    assert len(inbox.messages) == 1
    msg = inbox.messages[0]
    assert (msg["To"], msg["From"], msg["Subject"]) == ("ada@example.com", "noreply@mdm.example",
                                                        "Welcome")
    assert msg["Message-ID"] == f"<jobpool.{tenant}.{job_id}@mdm.example>"
    assert msg.is_multipart()
    row = await job(conn, job_id)
    assert row["status"] == "done"
    assert row["result"] == {"status": "sent", "message_id": msg["Message-ID"]}
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_email_log WHERE status = 'sent'"
                        " AND provider_message_id = %s", (msg["Message-ID"],)) == 1
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log"
                        " WHERE action = 'email_sent' AND job_id = %s", (job_id,)) == 1


async def test_suppressed_address_is_logged_not_sent(conn: Conn, dsn: str, tenant: uuid.UUID,
                                                     inbox: Inbox) -> None:
    await prepare(conn)
    await conn.execute("INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)"
                       " VALUES (%s, 'ada@example.com', 'bounced')", (tenant,))
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send",
                                    payload={**MAIL, "to": "Ada@Example.com"})).id
    await run_until_empty(dsn, "email_send")
    assert inbox.messages == []
    assert (await job(conn, job_id))["status"] == "done"
    assert await scalar(conn, "SELECT status FROM mdm.aa_email_log WHERE job_id = %s",
                        (job_id,)) == "suppressed"
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log"
                        " WHERE action = 'email_sent'") == 0


async def test_a_retry_after_a_lost_commit_logs_the_mail_once(conn: Conn, dsn: str,
                                                               tenant: uuid.UUID,
                                                               inbox: Inbox) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send", payload=MAIL)).id
    handler = load_kind_modules().get("email_send").handler
    claimed = await job(conn, job_id)
    claimed = {**claimed, "claimed_by": "h/1/x", "claimed_at": claimed["created_at"],
               "attempts": 1}
    job_obj = jobpool.Job.from_row(claimed, JobContext(settings=settings.current()))
    # first attempt: sent and logged, then the commit is lost
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        await handler(job_obj, tx)
        await tx.rollback()
    # the same message already logged (a commit that did land) is not logged twice
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        await handler(job_obj, tx)
        await handler(job_obj, tx)
        await tx.commit()
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_email_log WHERE job_id = %s",
                        (job_id,)) == 1
    await conn.execute("DELETE FROM mdm.aa_email_log")
    await run_until_empty(dsn, "email_send")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_email_log WHERE job_id = %s",
                        (job_id,)) == 1
    ids = {m["Message-ID"] for m in inbox.messages}
    assert len(ids) == 1  # every resend carries the same Message-ID for the provider to dedupe


@pytest.mark.parametrize(
    ("to", "status", "error"),
    [("reject@example.com", "dlq", "rejected the recipient"),
     ("busy@example.com", "pending", "451"),
     ("x@example.com", "dlq", "payload.subject")],
)
async def test_smtp_replies_map_to_retry_or_dlq(conn: Conn, dsn: str, tenant: uuid.UUID,
                                                inbox: Inbox, to: str, status: str,
                                                error: str) -> None:
    payload = {**MAIL, "to": to}
    if to.startswith("x@"):
        del payload["subject"]
        row = await _send_unchecked(conn, dsn, tenant, payload)
    else:
        row = await _send(conn, dsn, tenant, to=to)
    assert row["status"] == status
    assert error in row["last_error"]
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_email_log") == 0


@pytest.mark.parametrize(
    ("smtp_url", "error"),
    [(f"smtp://127.0.0.1:{free_port()}", "Connection refused"),  # nothing listens there
     (None, "JOBPOOL_SMTP_URL is not set")],
)
async def test_an_unreachable_or_unconfigured_smtp_server_keeps_the_job_waiting(
    conn: Conn, dsn: str, tenant: uuid.UUID, smtp_url: str | None, error: str
) -> None:
    await prepare(conn)
    previous = settings.current()
    settings.configure(replace(previous, smtp_url=smtp_url))
    try:
        job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send",
                                        payload=MAIL)).id
        await run_until_empty(dsn, "email_send")
    finally:
        settings.configure(previous)
    row = await job(conn, job_id)
    assert row["status"] == "pending"
    assert error in row["last_error"]


async def _send(conn: Conn, dsn: str, tenant: uuid.UUID, **fields: str) -> dict[str, Any]:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send",
                                    payload={**MAIL, **fields})).id
    await run_until_empty(dsn, "email_send")
    return await job(conn, job_id)


async def _send_unchecked(conn: Conn, dsn: str, tenant: uuid.UUID,
                          payload: dict[str, Any]) -> dict[str, Any]:
    """A payload that `enqueue` refuses, written as plain SQL would (the worker checks it)."""
    await prepare(conn)
    with pytest.raises(jobpool.InvalidPayloadError):
        await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send", payload=payload)
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts)"
        " VALUES (%s, 'email_send', %s, 20) RETURNING id", (tenant, Jsonb(payload)))
    row = await cur.fetchone()
    assert row is not None
    await run_until_empty(dsn, "email_send")
    return await job(conn, row["id"])


async def test_the_envelope_is_exactly_the_checked_sender_and_recipient(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox
) -> None:
    row = await _send(conn, dsn, tenant, reply_to="help@mdm.example")
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert inbox.envelopes == [("noreply@mdm.example", ["ada@example.com"], False)]
    assert inbox.messages[0]["Reply-To"] == "help@mdm.example"


async def test_a_list_of_recipients_is_refused_not_sent_past_the_suppression_check(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox
) -> None:
    await conn.execute("INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)"
                       " VALUES (%s, 'blocked@example.com', 'complaint')", (tenant,))
    row = await _send_unchecked(conn, dsn, tenant,
                                {**MAIL, "to": "ok@example.com, blocked@example.com"})
    assert (row["status"], row["attempts"]) == ("dlq", 1)
    assert "payload.to must be exactly one address" in row["last_error"]
    assert inbox.envelopes == []
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_email_log") == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [("from", "s@example.com\r\nBcc: spy@evil.example"),
     ("to", "ada@example.com\u2028Bcc: spy@evil.example"),
     ("reply_to", "Help <help@example.com>"),
     ("subject", "Hi\x85Bcc: spy@evil.example"),
     ("from_name", "security@bank.example"),
     ("to", "ada@")],
)
async def test_a_malformed_header_field_goes_to_the_dlq_at_once_naming_it(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox, field: str, value: str
) -> None:
    row = await _send_unchecked(conn, dsn, tenant, {**MAIL, field: value})
    assert (row["status"], row["attempts"]) == ("dlq", 1)
    assert f"payload.{field}" in row["last_error"]
    assert inbox.envelopes == []


async def test_an_international_domain_goes_out_as_idna_without_smtputf8(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox
) -> None:
    row = await _send(conn, dsn, tenant, to="joerg@bücher.example")
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert inbox.envelopes == [("noreply@mdm.example", ["joerg@xn--bcher-kva.example"], False)]
    assert inbox.messages[0]["To"] == "joerg@xn--bcher-kva.example"
    assert await scalar(conn, "SELECT recipient FROM mdm.aa_email_log") == (
        "joerg@xn--bcher-kva.example")


async def test_a_non_ascii_local_part_without_smtputf8_is_permanent(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox
) -> None:
    row = await _send(conn, dsn, tenant, to="jörg@bücher.example")
    assert (row["status"], row["attempts"]) == ("dlq", 1)
    assert "SMTPUTF8" in row["last_error"]
    assert inbox.envelopes == []


async def test_a_non_ascii_local_part_is_sent_with_smtputf8_where_offered(
    conn: Conn, dsn: str, tenant: uuid.UUID, utf8_inbox: Inbox
) -> None:
    row = await _send(conn, dsn, tenant, to="jörg@bücher.example", subject="Grüße")
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert utf8_inbox.envelopes == [("noreply@mdm.example", ["jörg@bücher.example"], True)]
    msg = utf8_inbox.messages[0]
    assert (msg["To"], msg["Subject"]) == ("jörg@bücher.example", "Grüße")


@pytest.mark.parametrize(("stored", "to"),
                         [("joerg@xn--bcher-kva.example", "joerg@bücher.example"),
                          ("joerg@bücher.example", "joerg@xn--BCHER-kva.example")])
async def test_suppression_matches_either_spelling_of_the_domain(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox, stored: str, to: str
) -> None:
    await conn.execute("INSERT INTO mdm.aa_email_suppression (tenant_id, address, reason)"
                       " VALUES (%s, %s, 'bounced')", (tenant, stored))
    row = await _send(conn, dsn, tenant, to=to)
    assert row["result"]["status"] == "suppressed"
    assert inbox.envelopes == []


async def test_an_unusable_configured_sender_keeps_the_job_waiting(
    conn: Conn, dsn: str, tenant: uuid.UUID, inbox: Inbox
) -> None:
    settings.configure(replace(settings.current(), smtp_from="jobpool@localhost"))
    row = await _send(conn, dsn, tenant)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "JOBPOOL_SMTP_FROM" in row["last_error"]
    assert inbox.envelopes == []


async def test_a_refused_smtp_login_keeps_the_job_waiting(conn: Conn, dsn: str,
                                                          tenant: uuid.UUID) -> None:
    def refuse(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        return AuthResult(success=False, handled=False)

    with smtp_server(url_user="u:wrong@", authenticator=refuse, auth_require_tls=False,
                     enable_SMTPUTF8=False) as box:
        row = await _send(conn, dsn, tenant)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "refused the login" in row["last_error"]
    assert box.envelopes == []
