import uuid
from datetime import UTC, datetime

import pytest

from jobpool.errors import PermanentError
from jobpool.job import Job
from jobpool.kinds.email_send import build_message, parse_payload, parse_smtp_url


def _job(job_id: int = 42) -> Job:
    now = datetime.now(UTC)
    return Job(job_id, uuid.UUID(int=1), "email_send", {}, "running", 100, now, now, "w", now, 1,
               3, None, None)


@pytest.mark.parametrize(
    ("payload", "field"),
    [({"subject": "s", "text": "t"}, "payload.to"), ({"to": "a@b.c", "text": "t"}, "subject"),
     ({"to": "a@b.c", "subject": "s", "text": 5}, "payload.text"),
     ({"to": "not-an-address", "subject": "s", "text": "t"}, "payload.to"),
     ({"to": "a@b.c", "subject": "s\r\nBcc: x@y.z", "text": "t"}, "subject"),
     ([1, 2], "object")],
)
def test_malformed_payloads_name_the_field(payload: object, field: str) -> None:
    with pytest.raises(PermanentError, match=field):
        parse_payload(payload)


def test_message_id_is_derived_from_the_job() -> None:
    email = parse_payload({"to": "a@example.com", "subject": "s", "text": "t"})
    first = build_message(email, _job(), "noreply@example.com")
    again = build_message(email, _job(), "noreply@example.com")
    other = build_message(email, _job(43), "noreply@example.com")
    assert first["Message-ID"] == again["Message-ID"] != other["Message-ID"]
    assert first["Message-ID"].endswith("@example.com>")


def test_smtp_url() -> None:
    target = parse_smtp_url("smtp://user:p%40ss@mail.example.com:587?starttls=true")
    assert (target.host, target.port, target.starttls, target.user, target.password) == (
        "mail.example.com", 587, True, "user", "p@ss")
    assert parse_smtp_url("smtps://mail.example.com").port == 465
    with pytest.raises(ValueError, match="JOBPOOL_SMTP_URL"):
        parse_smtp_url("http://mail.example.com")
