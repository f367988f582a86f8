"""email_send against a real SMTP server (aiosmtpd) started by the test."""

from __future__ import annotations

import email
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar
from jobpool import settings
from jobpool.registry import load_kind_modules

Conn = psycopg.AsyncConnection[dict[str, Any]]


class Inbox:
    """An aiosmtpd handler that keeps messages and refuses some recipients."""

    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          options: Any) -> str:
        if address.startswith("reject@"):
            return "550 5.1.1 no such user"
        if address.startswith("busy@"):
            return "451 4.3.0 try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    handler = Inbox()
    port = _free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    previous = settings.current()
    settings.configure(replace(previous, smtp_url=f"smtp://127.0.0.1:{port}",
                               smtp_from="noreply@mdm.example"))
    yield handler
    settings.configure(previous)
    controller.stop()


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
    job_obj = jobpool.Job.from_row(claimed)
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
    await prepare(conn)
    payload = {**MAIL, "to": to}
    if to.startswith("x@"):
        del payload["subject"]
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="email_send",
                                    payload=payload)).id
    await run_until_empty(dsn, "email_send")
    row = await job(conn, job_id)
    assert row["status"] == status
    assert error in row["last_error"]
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_email_log") == 0


@pytest.mark.parametrize(
    ("smtp_url", "error"),
    [(f"smtp://127.0.0.1:{_free_port()}", "Connection refused"),  # nothing listens there
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
