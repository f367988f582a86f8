"""Standard Webhooks signing, response classification, URL checks and the SSRF guard (pure)."""

from __future__ import annotations

import base64
import ipaddress
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import standardwebhooks

from jobpool.kinds.webhooks.signing import (
    EXCERPT_CHARS,
    MAX_RETRY_AFTER,
    Delivered,
    Gone,
    Rejected,
    Transient,
    WebhookVerificationError,
    classify_response,
    encode_secret,
    event_body,
    failure_reason,
    parse_retry_after,
    response_excerpt,
    sign,
    signed_headers,
    signing_key,
    verify_webhook,
)
from jobpool.kinds.webhooks.ssrf import (
    InvalidWebhookURLError,
    Target,
    TargetRefusedError,
    check_target,
    embedded_ipv4,
    parse_networks,
    refusal,
    webhook_target,
)

# The example of the Standard Webhooks reference implementations' test suites.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STAMP = "2026-11-29T12:00:00.000000Z"


def test_signature_matches_the_spec_example() -> None:
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_our_headers_verify_with_the_reference_library() -> None:
    secret = encode_secret(bytes(range(32)))
    body = event_body("order.paid", STAMP, '{"id": 7, "name": "Ærø"}')
    now = int(datetime.now(UTC).timestamp())
    headers = signed_headers(secret, "msg_abc_1", now, body)
    assert standardwebhooks.Webhook(secret).verify(body, headers) == json.loads(body)


def test_reference_library_signatures_verify_with_ours() -> None:
    secret = encode_secret(b"k" * 24)
    stamp = datetime.now(UTC)
    reference = standardwebhooks.Webhook(secret).sign("msg_1", stamp, '{"a":1}')
    headers = {"Webhook-Id": "msg_1", "Webhook-Timestamp": str(int(stamp.timestamp())),
               "Webhook-Signature": reference}
    assert verify_webhook(secret, headers, b'{"a":1}', now=int(stamp.timestamp())) == "msg_1"


@pytest.mark.parametrize("change", ["body", "id", "secret", "stale", "future"])
def test_verify_refuses_tampering_and_old_timestamps(change: str) -> None:
    secret = encode_secret(b"s" * 32)
    headers = signed_headers(secret, "msg_1", 1_000_000, b"{}")
    body, now = b"{}", 1_000_000
    if change == "body":
        body = b'{"x":1}'
    elif change == "id":
        headers["webhook-id"] = "msg_2"
    elif change == "secret":
        secret = encode_secret(b"t" * 32)
    elif change == "stale":
        now += 301
    else:
        now -= 301
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, headers, body, now=now)


def test_verify_accepts_any_of_several_signatures_and_names_missing_headers() -> None:
    secret = encode_secret(b"s" * 32)
    headers = signed_headers(secret, "msg_1", 50, b"{}")
    headers["webhook-signature"] = "v1,bm9wZQ== v2,xyz " + headers["webhook-signature"]
    assert verify_webhook(secret, headers, b"{}", now=50) == "msg_1"
    del headers["webhook-timestamp"]
    with pytest.raises(WebhookVerificationError, match="webhook-timestamp"):
        verify_webhook(secret, headers, b"{}", now=50)


@pytest.mark.parametrize("secret", ["plain-secret", "whsec_not base64!", "whsec_" +
                                    base64.b64encode(b"short").decode()])
def test_bad_secrets_are_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        signing_key(secret)


def test_event_body_places_the_stored_json_digit_for_digit() -> None:
    stored = ('{"a": {"x": "ü"}, "big": 1' + "0" * 400 + ', "tiny": 0.' + "0" * 399 + "1, "
              '"total": 12345678901234567890.12}')
    body = event_body("entity.updated", STAMP, stored)
    assert body == (f'{{"data":{stored},"timestamp":"{STAMP}","type":"entity.updated"}}'
                    ).encode()
    document = json.loads(body, parse_float=Decimal)
    assert document["data"]["total"] == Decimal("12345678901234567890.12")
    assert document["data"]["big"] == 10**400
    assert document["data"]["tiny"] == Decimal("1e-400")


@pytest.mark.parametrize(("status", "expected"), [
    (200, Delivered), (201, Delivered), (204, Delivered), (299, Delivered),
    (410, Gone),
    (408, Transient), (429, Transient), (500, Transient), (502, Transient),
    (503, Transient), (599, Transient),
    (400, Rejected), (401, Rejected), (403, Rejected), (404, Rejected), (422, Rejected),
    (301, Rejected), (302, Rejected), (307, Rejected), (308, Rejected), (600, Rejected),
])
def test_status_classification(status: int, expected: type) -> None:
    assert isinstance(classify_response(status, retry_after=None, now=NOW), expected)


def test_redirects_are_named_as_not_followed_with_their_location() -> None:
    outcome = classify_response(302, now=NOW, body=b"moved")
    assert outcome == Rejected("HTTP 302: moved (redirects are not followed)", 302)
    outcome = classify_response(301, now=NOW, location="https://new.example/h\udcff\x00")
    assert outcome == Rejected(
        "HTTP 301 (redirects are not followed; Location: https://new.example/h\\xff\\x00)", 301)


def test_retry_after_is_honoured_in_seconds_and_as_a_date() -> None:
    assert classify_response(429, retry_after="120", now=NOW) == Transient(
        "HTTP 429", 120.0, 429)
    date = "Sun, 29 Nov 2026 12:05:00 GMT"
    assert classify_response(503, retry_after=date, now=NOW) == Transient(
        "HTTP 503", 300.0, 503)
    assert classify_response(500, retry_after=None, now=NOW) == Transient("HTTP 500", None, 500)


@pytest.mark.parametrize("status", [410, 400, 503])
def test_what_a_receiver_sends_is_quoted_escaped_and_bounded(status: int) -> None:
    body = b"gone \x00\xff\xfe \x1b[31mred\r\n" + "é".encode() + b"x" * 100_000
    outcome = classify_response(status, now=NOW, body=body)
    assert not isinstance(outcome, Delivered)
    assert outcome.reason.startswith(f"HTTP {status}: gone \\x00\\xff\\xfe \\x1b[31mred éxxx")
    assert len(outcome.reason) < EXCERPT_CHARS + 20 and outcome.reason.endswith("[truncated]")
    outcome.reason.encode()  # storable: no lone surrogate
    assert "\x00" not in outcome.reason


def test_client_and_dns_messages_are_made_storable() -> None:
    reason = failure_reason("Bad status line '\x00\udcff garbage'" + "y" * 5000)
    assert reason.startswith("Bad status line '\\x00\\xff garbage'")
    assert len(reason) <= 1000
    reason.encode()


def test_response_excerpt_collapses_whitespace() -> None:
    assert response_excerpt(b"  a\n\tb  ") == "a b"
    assert response_excerpt(b"") == ""


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("soon", None), ("-5", None), ("0", 0.0),
    ("99999999", MAX_RETRY_AFTER), ("Sun, 29 Nov 2026 11:00:00 GMT", 0.0),
    ("²", None), ("\udcb2", None), ("Sun, 29 Nov 99999999999999999999 12:05:00 GMT", None),
    ("Sun, 29 Nov 2026 12:05:00 +9999999999999999999999", None),
])
def test_parse_retry_after_edges(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_parse_retry_after_far_date_is_capped() -> None:
    far = (NOW + timedelta(days=30)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert parse_retry_after(far, NOW) == MAX_RETRY_AFTER


# -- the SSRF guard ------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.1.1", "private"),
    ("fd12:3456::1", "private"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("100.64.0.1", "non-global"), ("240.0.0.1", "reserved"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.0.0.1", "private"),
    ("64:ff9b::a9fe:a9fe", "cloud metadata"),
    # 6to4 embeds an IPv4 address; site-local is deprecated but still routed in some sites
    ("2002:a00:1::1", "private"), ("2002:7f00:1::", "loopback"),
    ("2002:a9fe:a9fe::", "cloud metadata"), ("fec0::1", "site-local"),
])
def test_non_public_addresses_are_refused(address: str, reason: str) -> None:
    found = refusal(ipaddress.ip_address(address), ())
    assert found is not None and reason in found


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111",
                                     "2002:101:101::1"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address), ()) is None


def test_the_allow_list_opens_only_its_networks() -> None:
    allow = parse_networks("127.0.0.0/8, ::1/128")
    assert refusal(ipaddress.ip_address("127.0.0.1"), allow) is None
    assert refusal(ipaddress.ip_address("::1"), allow) is None
    assert refusal(ipaddress.ip_address("::ffff:127.0.0.1"), allow) is None
    assert refusal(ipaddress.ip_address("10.0.0.1"), allow) == "private address"
    assert refusal(ipaddress.ip_address("169.254.169.254"), allow) == "cloud metadata address"


def test_one_refused_answer_refuses_the_host() -> None:
    mixed = [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.1")]
    with pytest.raises(TargetRefusedError, match=r"'rebind\.example' resolves to 10\.0\.0\.1 "
                                            r"\(private address\): refused, no connection"):
        check_target("rebind.example", mixed, ())
    with pytest.raises(TargetRefusedError, match="no address"):
        check_target("empty.example", [], ())
    check_target("ok.example", [ipaddress.ip_address("1.1.1.1")], ())


def test_bad_allow_list_entries_are_named() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33'"):
        parse_networks("127.0.0.0/8,10.0.0.0/33")
    assert parse_networks(None) == ()
    assert parse_networks(" , ") == ()


def test_embedded_ipv4() -> None:
    assert embedded_ipv4(ipaddress.ip_address("::ffff:1.2.3.4")) == ipaddress.ip_address("1.2.3.4")
    assert embedded_ipv4(ipaddress.ip_address("64:ff9b::102:304")) == ipaddress.ip_address(
        "1.2.3.4")
    assert embedded_ipv4(ipaddress.ip_address("2001:db8::1")) is None


# -- webhook URLs --------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "problem"), [
    ("https://hooks.example.com:99999/in", "port '99999' is not a number from 1 to 65535"),
    ("https://hooks.example.com:0/in", "port '0' is not a number from 1 to 65535"),
    ("https://hooks.example.com:https/in", "port 'https' is not a number"),
    ("https://hooks.example.com:+443/in", "port '+443' is not a number"),
    ("https://hooks.example.com:٣/in", "port '٣' is not a number"),
    ("https://hooks.example.com:1:2/in", "port '1:2' is not a number"),
    ("http://:8080/in", "has no host"),
    ("http:///in", "has no host"),
    ("https://@hooks.example.com/", "must not carry user information"),
    ("https://user:pw@hooks.example.com/", "must not carry user information"),
    ("https://hooks.example.com\\@evil.example/", "must not carry user information"),
    ("http://[fe80::1%25eth0]:8080/", "IPv6 zone ids ('fe80::1%25eth0') are not allowed"),
    ("http://[fe80::1%eth0]/", "IPv6 zone ids"),
    ("http://[v1.fe]/", "'[v1.fe]' is not an IPv6 address"),
    ("http://[::1]x/", "is not host[:port]"),
    ("http://[example.com]/", "cannot be parsed"),
    ("ftp://hooks.example.com/", "absolute http:// or https:// URL"),
    ("javascript:alert(1)", "absolute http:// or https:// URL"),
    ("https:hooks.example.com/in", "absolute http:// or https:// URL"),
    ("//hooks.example.com/in", "absolute http:// or https:// URL"),
    ("https://hooks.example.com/" + "a" * 2030, "2056 characters long; at most 2048"),
    ("https://bücher.example/in", "not ASCII; write it in its IDNA A-label form "
                                  "'xn--bcher-kva.example'"),
    ("https://faß.de/in", "A-label form 'xn--fa-hia.de'"),
    ("https://☃.example/in", "is not a valid internationalised domain name"),
    ("https://exa%6dple.com/in", "is not a valid host name"),
    ("https://a..b/in", "is not a valid host name"),
    ("https://-a.example/in", "is not a valid host name"),
    ("https://" + "a" * 64 + ".example/in", "is not a valid host name"),
    ("https://" + "a." * 127 + "example/in", "is not a valid host name"),
    ("http://0x7f.1/", "neither a dotted-decimal IPv4 address"),
    ("http://2130706433/", "neither a dotted-decimal IPv4 address"),
    ("http://127.1/", "neither a dotted-decimal IPv4 address"),
    ("http://010.0.0.1/", "neither a dotted-decimal IPv4 address"),
    ("https://hooks.example.com/in\x00", "contains '\\x00'"),
    ("https://hooks.example.com/ in", "contains ' '"),
    ("https://user:pw@hooks.example.com/ in", "'https://***@hooks.example.com/ in' contains"),
    ("https://hooks.example.com/\u202ein", "contains '\\u202e'"),
])
def test_bad_webhook_urls_are_refused_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(InvalidWebhookURLError) as refused:
        webhook_target(url)
    assert problem in str(refused.value)
    assert "pw" not in str(refused.value)  # credentials are not echoed into logs


@pytest.mark.parametrize(("url", "target"), [
    ("https://Hooks.Example.com/in?x=1#f", Target("https", "hooks.example.com", 443, None)),
    ("HTTP://hooks.example.com:8080", Target("http", "hooks.example.com", 8080, None)),
    ("http://hooks.example.com:/", Target("http", "hooks.example.com", 80, None)),
    ("https://xn--bcher-kva.example/über", Target("https", "xn--bcher-kva.example", 443, None)),
    ("https://svc_1.internal.:65535/", Target("https", "svc_1.internal.", 65535, None)),
    ("http://93.184.216.34:1/", Target("http", "93.184.216.34", 1,
                                       ipaddress.ip_address("93.184.216.34"))),
    ("http://[2001:DB8::1]:8443/", Target("http", "2001:db8::1", 8443,
                                          ipaddress.ip_address("2001:db8::1"))),
    ("https://localhost/", Target("https", "localhost", 443, None)),
])
def test_good_webhook_urls_and_where_they_point(url: str, target: Target) -> None:
    assert webhook_target(url) == target
