import uuid
from datetime import UTC, datetime

import pytest

from jobpool.errors import InvalidPayloadError, PermanentError
from jobpool.job import Job
from jobpool.kinds.email.email_send import parse_smtp_url, prepare
from jobpool.kinds.email.mail import (
    Email,
    EmailPayload,
    build_delivery,
    checked_email,
    parse_address,
)
from jobpool.payloads import decode_payload

MAIL = {"to": "ada@example.com", "subject": "s", "text": "t"}


def parse_payload(payload: object) -> Email:
    """What the worker does before email_send runs: decode, then check the message."""
    return checked_email(decode_payload("email_send", EmailPayload, payload))


def _job(job_id: int = 42) -> Job:
    now = datetime.now(UTC)
    return Job(job_id, uuid.UUID(int=1), "email_send",
               decode_payload("email_send", EmailPayload, MAIL), "running", 100, now, now,
               "w", now, 1, 3, None, None)


@pytest.mark.parametrize(
    ("payload", "field"),
    [({"subject": "s", "text": "t"}, "payload.to"), ({"to": "a@b.c", "text": "t"}, "subject"),
     ({**MAIL, "text": 5}, "payload.text"),
     ({**MAIL, "to": "not-an-address"}, "payload.to"),
     ({**MAIL, "subject": "s\r\nBcc: x@y.z"}, "payload.subject"),
     ([1, 2], "object")],
)
def test_malformed_payloads_name_the_field(payload: object, field: str) -> None:
    with pytest.raises(InvalidPayloadError, match=field):
        parse_payload(payload)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("to", "ok@example.com, blocked@example.com", "exactly one address"),
        ("to", "ok@example.com; blocked@example.com", "exactly one address"),
        ("to", "ada@example.com\r\nBcc: spy@evil.example", "U\\+000A|U\\+000D"),
        ("to", "ada@example.com\u2028", "LINE SEPARATOR"),
        ("to", "ada@example.com\u2029", "PARAGRAPH SEPARATOR"),
        ("to", "ada@example.com\x85", "U\\+0085"),
        ("to", "ada@example.com\x00", "U\\+0000"),
        ("to", "ada@", "after the @-sign"),
        ("to", "ada@example", "period"),
        ("to", "ada", "@-sign"),
        ("to", "Ada <ada@example.com>", "display name"),
        ("to", '"blocked@example.com" <ok@example.com>', "display name"),
        ("to", "ok@example.com <blocked@example.com>", "bare address"),
        ("to", "alice@example.org)<bob@example.org>", "bare address"),
        ("to", "ada@example.com (comment)", "bare address"),
        ("to", "ada@[127.0.0.1]", "bracketed IP"),
        ("to", "root@mail.localhost", "special-use"),
        ("from", "s@example.com\r\nBcc: spy@evil.example", "payload.from"),
        ("from", "Shop <s@example.com>", "payload.from"),
        ("reply_to", "r@example.com\nBcc: spy@evil.example", "payload.reply_to"),
        ("subject", "Hi\u2028Bcc: spy@evil.example", "U\\+2028"),
        ("subject", "Hi\x85there", "U\\+0085"),
        ("subject", "Hi\x00", "U\\+0000"),
        ("from_name", "Shop\r\nBcc: spy@evil.example", "U\\+000D"),
        ("from_name", "support@bank.example", "must not contain @"),
        ("from_name", "=?utf-8?q?Bank?=", "encoded word"),
        ("from_name", "x" * 201, "longer than 200"),
        ("text", "\ud800", "lone surrogate"),
        ("cc", "spy@evil.example", "unknown field `payload.cc`"),
    ],
)
def test_header_bound_fields_are_refused_naming_the_field(field: str, value: str,
                                                         problem: str) -> None:
    with pytest.raises(InvalidPayloadError, match=f"payload.{field}") as caught:
        parse_payload({**MAIL, field: value})
    assert caught.match(problem)


def test_the_domain_goes_out_as_idna_and_only_a_non_ascii_local_part_needs_smtputf8() -> None:
    joerg = parse_address("payload.to", "joerg@Bücher.example")
    assert (joerg.wire, joerg.needs_smtputf8) == ("joerg@xn--bcher-kva.example", False)
    assert set(joerg.forms) == {"joerg@bücher.example", "joerg@xn--bcher-kva.example"}
    jorg = parse_address("payload.to", "jörg@bücher.example")
    assert (jorg.wire, jorg.needs_smtputf8) == ("jörg@bücher.example", True)


def test_envelope_and_headers_come_from_the_same_checked_addresses() -> None:
    mail = parse_payload({**MAIL, "to": " joerg@bücher.example ", "from_name": "Bücher, Shop",
                          "reply_to": "help@bücher.example", "subject": "Grüße"})
    sender = parse_address("JOBPOOL_SMTP_FROM", "noreply@bücher.example")
    delivery = build_delivery(mail, sender, message_id="<m@x>", job_id=7)
    assert (delivery.mail_from, delivery.rcpt_to, delivery.smtputf8) == (
        "noreply@xn--bcher-kva.example", "joerg@xn--bcher-kva.example", False)
    data = delivery.data()
    assert data.isascii()
    assert b"\r\nTo: joerg@xn--bcher-kva.example\r\n" in data
    assert b"Reply-To: help@xn--bcher-kva.example\r\n" in data
    assert b"<noreply@xn--bcher-kva.example>" in data


def test_a_non_ascii_local_part_is_sent_as_utf8() -> None:
    mail = parse_payload({**MAIL, "to": "jörg@bücher.example"})
    delivery = build_delivery(mail, parse_address("x", "s@example.com"), message_id="<m@x>",
                              job_id=7)
    assert (delivery.rcpt_to, delivery.smtputf8) == ("jörg@bücher.example", True)
    assert "\r\nTo: jörg@bücher.example\r\n".encode() in delivery.data()


def test_message_id_is_derived_from_the_job() -> None:
    _, first = prepare(_job(), "noreply@example.com")
    _, again = prepare(_job(), "noreply@example.com")
    _, other = prepare(_job(43), "noreply@example.com")
    assert first.message["Message-ID"] == again.message["Message-ID"] != other.message[
        "Message-ID"]
    assert first.message["Message-ID"].endswith("@example.com>")


def test_a_bad_payload_is_permanent_and_an_instance_is_checked_as_its_json() -> None:
    with pytest.raises(PermanentError, match=r"payload\.to"):
        decode_payload("email_send", EmailPayload, {**MAIL, "to": "a@b.example, c@d.example"})
    given = EmailPayload("ada@example.com", "s", "t", sender="shop@example.com")
    assert decode_payload("email_send", EmailPayload, given) == given
    with pytest.raises(ValueError, match=r"payload\.from "):  # at construction too
        EmailPayload("ada@example.com", "s", "t", sender="Shop <shop@example.com>")


def test_smtp_url() -> None:
    target = parse_smtp_url("smtp://user:p%40ss@mail.example.com:587?starttls=true")
    assert (target.host, target.port, target.starttls, target.user, target.password) == (
        "mail.example.com", 587, True, "user", "p@ss")
    assert parse_smtp_url("smtps://mail.example.com").port == 465
    with pytest.raises(ValueError, match="JOBPOOL_SMTP_URL"):
        parse_smtp_url("http://mail.example.com")
