"""email_send: suppression check, SMTP send, `aa_email_log` row, audit `email_sent`.

Payload: `EmailPayload`, {"to", "subject", "text", "html"?, "from"?, "from_name"?,
"reply_to"?}, checked by `mail.checked_email`: one recipient, bare addresses, one-line headers.
The envelope is passed to SMTP explicitly and is exactly the checked recipient and sender. The
Message-ID is derived from the job, so a retry after a lost commit logs the mail once.
"""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from psycopg import AsyncConnection

from jobpool.db.queries import One
from jobpool.errors import JobpoolError, PermanentError
from jobpool.job import Job
from jobpool.kinds.email.mail import (
    Address,
    Delivery,
    Email,
    EmailPayload,
    PayloadError,
    build_delivery,
    checked_email,
    parse_address,
)
from jobpool.registry import kind

LOG_EMAIL = One("log_email")
SUPPRESSED_ADDRESS = One("suppressed_address")

SMTP_TIMEOUT = 30.0


class SmtpNotConfigured(JobpoolError):
    """No usable SMTP server or sender configured: transient, the job waits for the operator."""


def message_id(job: Job, domain: str) -> str:
    """Message-ID derived from the job: the same on every attempt."""
    return f"<jobpool.{job.tenant_id}.{job.id}@{domain}>"


def configured_sender(smtp_from: str) -> Address:
    """JOBPOOL_SMTP_FROM, checked like a payload address; a bad one is the operator's to fix."""
    try:
        return parse_address("JOBPOOL_SMTP_FROM", smtp_from)
    except PayloadError as exc:
        raise SmtpNotConfigured(f"{exc}; the job retries until it is fixed") from None


def prepare(job: Job, smtp_from: str) -> tuple[Email, Delivery]:
    """The checked message of the job's decoded `EmailPayload`, and its delivery."""
    mail = checked_email(job.payload)
    sender = mail.sender or configured_sender(smtp_from)
    return mail, build_delivery(mail, sender, message_id=message_id(job, sender.domain),
                                job_id=job.id)


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


def _refusal(exc: smtplib.SMTPResponseException) -> str:
    error = exc.smtp_error
    text = error.decode("utf-8", "replace") if isinstance(error, bytes) else error
    return f"SMTP {exc.smtp_code}: {text}"


def _deliver(smtp: smtplib.SMTP, delivery: Delivery) -> None:
    smtp.ehlo_or_helo_if_needed()
    options: tuple[str, ...] = ()
    if delivery.smtputf8:
        if not smtp.has_extn("smtputf8"):
            raise PermanentError(
                f"an address has a non-ASCII local part ({delivery.mail_from} -> "
                f"{delivery.rcpt_to}), which needs SMTPUTF8, and the SMTP server does not "
                "offer SMTPUTF8")
        options = ("SMTPUTF8", "BODY=8BITMIME")
    smtp.sendmail(delivery.mail_from, [delivery.rcpt_to], delivery.data(), mail_options=options)


def send(target: SmtpTarget, delivery: Delivery) -> None:
    """Deliver over SMTP (blocking) to exactly `delivery.rcpt_to`.

    5xx -> PermanentError; 4xx, connection errors and a refused login (the operator's to fix)
    propagate, so the job retries.
    """
    smtp_class = smtplib.SMTP_SSL if target.ssl else smtplib.SMTP
    try:
        with smtp_class(target.host, target.port, timeout=SMTP_TIMEOUT) as smtp:
            if target.starttls:
                smtp.starttls(context=ssl.create_default_context())
            if target.user:
                try:
                    smtp.login(target.user, target.password or "")
                except smtplib.SMTPAuthenticationError as exc:
                    raise SmtpNotConfigured(f"the SMTP server refused the login of "
                                            f"JOBPOOL_SMTP_URL ({_refusal(exc)})") from None
            _deliver(smtp, delivery)
    except smtplib.SMTPRecipientsRefused as exc:
        code, _ = exc.recipients[delivery.rcpt_to]
        if code >= 500:
            raise PermanentError(f"SMTP rejected the recipient: {exc.recipients}") from exc
        raise
    except smtplib.SMTPResponseException as exc:
        if exc.smtp_code >= 500:
            raise PermanentError(_refusal(exc)) from exc
        raise


@kind("email_send", priority=100, max_attempts=20, stale_ttl=5 * 60, timeout=60, backoff_base=30,
      backoff_max=24 * 3600, backoff_jitter=0.1, payload=EmailPayload)
async def email_send(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Send one email unless the tenant suppresses the address; log it once by Message-ID."""
    config = job.context.settings
    mail, delivery = prepare(job, config.smtp_from)
    suppressed = await SUPPRESSED_ADDRESS(tx,
                           {"tenant_id": job.tenant_id, "addresses": list(mail.to.forms)})
    status = "suppressed" if suppressed else "sent"
    if not suppressed:
        if not config.smtp_url:
            raise SmtpNotConfigured("JOBPOOL_SMTP_URL is not set: no SMTP server to send through;"
                                    " retried while the job has attempts left")
        await asyncio.to_thread(send, parse_smtp_url(config.smtp_url), delivery)
    message_id = delivery.message["Message-ID"]
    await LOG_EMAIL(tx, {
        "tenant_id": job.tenant_id, "job_id": job.id, "message_id": message_id,
        "recipient": delivery.rcpt_to, "subject": mail.subject, "status": status,
        "actor": job.context.actor,
    })
    return {"status": status, "message_id": message_id}
