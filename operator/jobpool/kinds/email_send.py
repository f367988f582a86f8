"""email_send: suppression check, SMTP send, `aa_email_log` row, audit `email_sent`.

Spec "Email" and "Idempotenz".

Payload: {"to": str, "subject": str, "text": str, "html": str (optional), "from": str (optional)}.
The Message-ID is derived from the job, so a retry after a lost commit logs the mail once.
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import parseaddr
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from psycopg import AsyncConnection

import jobpool
from jobpool import settings
from jobpool.errors import PermanentError
from jobpool.job import Job
from jobpool.sql import QUERIES

SMTP_TIMEOUT = 30.0


class SmtpNotConfigured(RuntimeError):
    """No SMTP server configured: a transient failure, the job waits for the operator."""


@dataclass(frozen=True)
class Email:
    to: str
    subject: str
    text: str
    html: str | None
    sender: str | None


def parse_payload(payload: Any) -> Email:
    """Validate an email_send payload; raises PermanentError naming the bad field."""
    if not isinstance(payload, dict):
        raise PermanentError(f"payload must be an object, got {type(payload).__name__}")
    for name in ("to", "subject", "text"):
        if not isinstance(payload.get(name), str):
            raise PermanentError(f"payload.{name} is required and must be a string")
    for name in ("html", "from"):
        if payload.get(name) is not None and not isinstance(payload[name], str):
            raise PermanentError(f"payload.{name} must be a string")
    to = payload["to"].strip()
    if "@" not in parseaddr(to)[1] or any(c in to for c in "\r\n"):
        raise PermanentError(f"payload.to is not an email address: {to!r}")
    if any(c in payload["subject"] for c in "\r\n"):
        raise PermanentError("payload.subject must be one line")
    return Email(to, payload["subject"], payload["text"], payload.get("html"), payload.get("from"))


def message_id(job: Job, domain: str) -> str:
    """Message-ID derived from the job: the same on every attempt."""
    return f"<jobpool.{job.tenant_id}.{job.id}@{domain}>"


def build_message(email: Email, job: Job, sender: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = email.sender or sender
    msg["To"] = email.to
    msg["Subject"] = email.subject
    msg["Message-ID"] = message_id(job, parseaddr(msg["From"])[1].rpartition("@")[2] or "jobpool")
    msg["X-Jobpool-Job"] = str(job.id)
    msg.set_content(email.text)
    if email.html:
        msg.add_alternative(email.html, subtype="html")
    return msg


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    ssl: bool
    starttls: bool
    user: str | None
    password: str | None


def parse_smtp_url(url: str) -> SmtpTarget:
    """`smtp://user:pass@host:587?starttls=true` or `smtps://host:465`; raises ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise ValueError(f"JOBPOOL_SMTP_URL must look like smtp://host:port, got {url!r}")
    query = parse_qs(parts.query)
    return SmtpTarget(
        host=parts.hostname,
        port=parts.port or (465 if parts.scheme == "smtps" else 25),
        ssl=parts.scheme == "smtps",
        starttls=query.get("starttls", ["false"])[0].lower() in ("1", "true", "yes"),
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def send(target: SmtpTarget, msg: EmailMessage) -> None:
    """Deliver over SMTP (blocking). 5xx → PermanentError; 4xx and connection errors propagate."""
    smtp_class = smtplib.SMTP_SSL if target.ssl else smtplib.SMTP
    try:
        with smtp_class(target.host, target.port, timeout=SMTP_TIMEOUT) as smtp:
            if target.starttls:
                smtp.starttls(context=ssl.create_default_context())
            if target.user:
                smtp.login(target.user, target.password or "")
            smtp.send_message(msg)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        if all(code >= 500 for code in codes):
            raise PermanentError(f"SMTP rejected the recipient: {exc.recipients}") from exc
        raise
    except smtplib.SMTPResponseException as exc:
        if exc.smtp_code >= 500:
            raise PermanentError(f"SMTP {exc.smtp_code}: {exc.smtp_error!r}") from exc
        raise


@jobpool.kind("email_send")
async def email_send(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Send one email unless the tenant suppresses the address; log it once by Message-ID."""
    email = parse_payload(job.payload)
    config = settings.current()
    msg = build_message(email, job, config.smtp_from)
    cur = await tx.execute(QUERIES["suppressed_address"].text,
                           {"tenant_id": job.tenant_id, "address": parseaddr(email.to)[1]})
    suppressed = await cur.fetchone()
    status = "suppressed" if suppressed else "sent"
    if not suppressed:
        if not config.smtp_url:
            raise SmtpNotConfigured("JOBPOOL_SMTP_URL is not set: no SMTP server to send through;"
                                    " the job retries until it is configured")
        await asyncio.to_thread(send, parse_smtp_url(config.smtp_url), msg)
    await tx.execute(QUERIES["log_email"].text, {
        "tenant_id": job.tenant_id, "job_id": job.id, "message_id": msg["Message-ID"],
        "recipient": email.to, "subject": email.subject, "status": status,
        "actor": config.service_account,
    })
    return {"status": status, "message_id": msg["Message-ID"]}
