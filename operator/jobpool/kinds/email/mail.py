"""An email_send payload, checked, and the exact message and envelope it turns into.

Pure: no I/O. Every address is one bare `local@domain`, checked by `email_validator` (no
display names, quoting, comments or IP literals; no control, line-separator or bidi
characters; a domain that has a dot and is not a special-use name). The domain goes out as
IDNA; only a non-ASCII local part needs the server's SMTPUTF8. The SMTP envelope is built
from the same checked addresses as the headers, so what was checked is what is delivered.
"""

from __future__ import annotations

import email.policy
import unicodedata
from dataclasses import dataclass
from email.headerregistry import Address as HeaderAddress
from email.message import EmailMessage

import msgspec
from email_validator import EmailNotValidError, validate_email

from jobpool.errors import JobpoolError

MAX_DISPLAY_NAME = 200
"""Characters of `from_name`."""

POLICY = email.policy.SMTP.clone(cte_type="7bit")
"""CRLF lines; non-ASCII bodies quoted-printable or base64, so no server needs 8BITMIME."""

_LINE_BREAKING = frozenset({"Cc", "Zl", "Zp"})
"""Unicode categories that end or corrupt a header line: controls (CR, LF, NUL, U+0085) and
the line and paragraph separators U+2028/U+2029."""


class PayloadError(JobpoolError, ValueError):
    """A payload field that cannot be sent as given; the message names the field."""


@dataclass(frozen=True)
class Address:
    """One checked address: `text` as given (NFC, domain lower-cased), `ascii` with the domain
    in IDNA, None when the local part is not ASCII (then only SMTPUTF8 can carry it)."""

    text: str
    ascii: str | None
    domain: str

    @property
    def needs_smtputf8(self) -> bool:
        return self.ascii is None

    @property
    def wire(self) -> str:
        """The form that goes into the envelope and the headers."""
        return self.ascii if self.ascii is not None else self.text

    @property
    def forms(self) -> tuple[str, ...]:
        """Every spelling a suppression list may hold for this address."""
        return tuple(dict.fromkeys(f for f in (self.text, self.ascii) if f is not None))


@dataclass(frozen=True)
class Email:
    """A checked email_send payload; `sender` None means the configured JOBPOOL_SMTP_FROM."""

    to: Address
    subject: str
    text: str
    html: str | None
    sender: Address | None
    sender_name: str | None
    reply_to: Address | None


@dataclass(frozen=True)
class Delivery:
    """What goes to the SMTP server: envelope sender, the one recipient, the message."""

    mail_from: str
    rcpt_to: str
    message: EmailMessage
    smtputf8: bool

    def data(self) -> bytes:
        """The message as sent: UTF-8 headers only when the transaction uses SMTPUTF8."""
        return self.message.as_bytes(policy=POLICY.clone(utf8=self.smtputf8))


def _shown(value: str, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _check_text(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError(f"{name} is not valid Unicode (a lone surrogate)") from None


def one_line(name: str, value: str) -> str:
    """`value` if it can be one header line; raises PayloadError naming `name` (e.g.
    "payload.subject") and the offending character (CR, LF, NUL, U+0085, U+2028, U+2029 would
    split or cut the header)."""
    _check_text(name, value)
    for char in value:
        if unicodedata.category(char) in _LINE_BREAKING:
            raise PayloadError(f"{name} must be one line without control characters, "
                               f"has U+{ord(char):04X} in {_shown(value)}")
    return value


def parse_address(name: str, value: str) -> Address:
    """One bare address; raises PayloadError naming `name` (e.g. "payload.to"), the value and
    the rule broken.

    Lists are refused with their own message: email_send has exactly one recipient, so the
    suppression check and the envelope always concern the same address.
    """
    candidate = value.strip(" \t")
    if any(sep in candidate for sep in ",;"):
        raise PayloadError(f"{name} must be exactly one address, got a list "
                           f"{_shown(value)}: enqueue one email_send job per recipient")
    try:
        checked = validate_email(candidate, check_deliverability=False, strict=True,
                                 allow_smtputf8=True, allow_display_name=False,
                                 allow_quoted_local=False, allow_domain_literal=False,
                                 allow_empty_local=False, globally_deliverable=True)
    except EmailNotValidError as exc:
        raise PayloadError(f"{name} is not a single bare address (local@domain): "
                           f"{_shown(value)}: {exc}") from None
    return Address(checked.normalized, checked.ascii_email, checked.ascii_domain)


def _display_name(value: str) -> str:
    one_line("payload.from_name", value)
    if len(value) > MAX_DISPLAY_NAME:
        raise PayloadError(f"payload.from_name is longer than {MAX_DISPLAY_NAME} characters")
    tricks = [s for s in ("@", "<", ">", "=?") if s in value]
    if tricks:
        raise PayloadError(f"payload.from_name must not contain {' or '.join(tricks)} "
                           f"(it would read as another address or an encoded word): "
                           f"{_shown(value)}")
    return value


class EmailPayload(msgspec.Struct, frozen=True, omit_defaults=True,
                   forbid_unknown_fields=True):
    """An email_send payload. Any other field is refused (a `cc` would otherwise be dropped);
    `checked_email` runs on decoding, so a bad address or header fails at enqueue too."""

    to: str
    subject: str
    text: str
    html: str | None = None
    sender: str | None = msgspec.field(default=None, name="from")
    from_name: str | None = None
    reply_to: str | None = None

    def __post_init__(self) -> None:
        checked_email(self)


def checked_email(payload: EmailPayload) -> Email:
    """The checked message of a decoded payload; raises PayloadError naming the first bad
    field. `from`, `reply_to` are bare addresses like `to`; `from_name` is the sender's display
    name, kept apart so no address can hide in it."""
    to, subject, text, html = payload.to, payload.subject, payload.text, payload.html
    sender, name, reply_to = payload.sender, payload.from_name, payload.reply_to
    _check_text("payload.text", text)
    if html is not None:
        _check_text("payload.html", html)
    return Email(
        to=parse_address("payload.to", to),
        subject=one_line("payload.subject", subject),
        text=text,
        html=html,
        sender=None if sender is None else parse_address("payload.from", sender),
        sender_name=None if name is None else _display_name(name),
        reply_to=None if reply_to is None else parse_address("payload.reply_to", reply_to),
    )


def _header(address: Address, display_name: str | None = None) -> HeaderAddress:
    local, _, domain = address.wire.rpartition("@")
    return HeaderAddress(display_name=display_name or "", username=local, domain=domain)


def build_delivery(mail: Email, sender: Address, *, message_id: str, job_id: int) -> Delivery:
    """The message and its envelope, both from the checked addresses; `sender` is the payload's
    `from` or the configured one. SMTPUTF8 is needed when any address has a non-ASCII local
    part (headers then carry UTF-8 too)."""
    msg = EmailMessage(policy=POLICY)
    msg["From"] = _header(sender, mail.sender_name)
    msg["To"] = _header(mail.to)
    if mail.reply_to is not None:
        msg["Reply-To"] = _header(mail.reply_to)
    msg["Subject"] = mail.subject
    msg["Message-ID"] = message_id
    msg["X-Jobpool-Job"] = str(job_id)
    msg.set_content(mail.text)
    if mail.html:
        msg.add_alternative(mail.html, subtype="html")
    addresses = [a for a in (sender, mail.to, mail.reply_to) if a is not None]
    return Delivery(sender.wire, mail.to.wire, msg,
                    any(a.needs_smtputf8 for a in addresses))
