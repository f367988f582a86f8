"""clamd replies → scan verdicts: `clean` if and only if the reply is `stream: OK`."""

from __future__ import annotations

import pytest

from jobpool.kinds.attachments.clamd import (
    END_OF_STREAM,
    ClamdAddress,
    Clean,
    Infected,
    Transient,
    Unscannable,
    after_cut_stream,
    frame,
    parse_clamd_url,
    parse_reply,
    status_of,
    with_integrity,
)


def test_ok_is_clean() -> None:
    assert parse_reply(b"stream: OK\0") == Clean()
    assert parse_reply(b"stream: OK") == Clean()
    assert parse_reply(b"stream: OK\n") == Clean()


@pytest.mark.parametrize(("reply", "signature"), [
    (b"stream: Eicar-Test-Signature FOUND\0", "Eicar-Test-Signature"),
    (b"stream: Jobpool-Test-EICAR.UNOFFICIAL FOUND\0", "Jobpool-Test-EICAR.UNOFFICIAL"),
    (b"stream: Win.Test.EICAR_HDB-1 FOUND\0", "Win.Test.EICAR_HDB-1"),
    (b"stream: Heuristics.Encrypted.Zip FOUND\0", "Heuristics.Encrypted.Zip"),
])
def test_found_is_infected_with_the_signature(reply: bytes, signature: str) -> None:
    assert parse_reply(reply) == Infected(signature)


@pytest.mark.parametrize("reply", [
    b"INSTREAM size limit exceeded. ERROR\0",
    b"stream: Heuristics.Limits.Exceeded.MaxFileSize FOUND\0",
    b"stream: Heuristics.Limits.Exceeded.MaxScanSize FOUND\0",
])
def test_limits_are_unscannable(reply: bytes) -> None:
    assert isinstance(parse_reply(reply), Unscannable)


@pytest.mark.parametrize("reply", [
    b"",  # closed without a reply
    b"\0",
    b"stream: Can't allocate memory ERROR\0",
    b"stream: Can't create temporary file ERROR\0",
    b"stream: lstat() failed: No such file or directory. ERROR\0",
    b"Error processing command. ERROR\0",
    b"UNKNOWN COMMAND\0",
    b"COMMAND READ TIMED OUT\0",
    b"PONG\0",
    b"stream:  FOUND\0",
    b"stream: OK stream: OK\0",
    b"stream: ok\0",
    b"Stream: OK\0",
    b" stream: OKAY\0",
    b"stream: OK.\0",
    b"\xff\xfe garbage",
])
def test_everything_else_is_transient(reply: bytes) -> None:
    assert isinstance(parse_reply(reply), Transient)


def test_what_clamd_sends_is_made_storable_before_it_is_written() -> None:
    """A NUL or control character inside a reply would make the signature or the error
    unwritable to PostgreSQL text: they are escaped, nothing dropped."""
    assert parse_reply(b"stream: Evil\x00Name\x1b FOUND\0") == Infected("Evil\\x00Name\\x1b")
    verdict = parse_reply(b"odd\x00reply ERROR\0")
    assert isinstance(verdict, Transient)
    assert "\x00" not in verdict.reason and "odd\\x00reply" in verdict.reason


def test_a_stream_cut_past_the_limit_is_unscannable_before_it_transient() -> None:
    assert isinstance(after_cut_stream(1_245_184, 1_048_576, "BrokenPipeError"), Unscannable)
    assert isinstance(after_cut_stream(65_536, 1_048_576, "ConnectionResetError"), Transient)
    assert isinstance(after_cut_stream(1_048_576, 1_048_576, "reset"), Transient)


def test_integrity_problems_make_a_clean_answer_unscannable_but_not_a_hit() -> None:
    assert with_integrity(Clean(), None) == Clean()
    assert with_integrity(Clean(), "sha256 differs") == Unscannable("sha256 differs")
    assert with_integrity(Infected("X"), "sha256 differs") == Infected("X")
    assert with_integrity(Transient("down"), "sha256 differs") == Transient("down")


def test_status_of_final_verdicts() -> None:
    assert status_of(Clean()) == "clean"
    assert status_of(Infected("X")) == "infected"
    assert status_of(Unscannable("big")) == "unscannable"


@pytest.mark.parametrize(("url", "address"), [
    ("tcp://127.0.0.1:3310", ClamdAddress(host="127.0.0.1", port=3310)),
    ("tcp://clamd.svc:3310", ClamdAddress(host="clamd.svc", port=3310)),
    ("tcp://[::1]:3310", ClamdAddress(host="::1", port=3310)),
    ("unix:///run/clamav/clamd.ctl", ClamdAddress(path="/run/clamav/clamd.ctl")),
])
def test_clamd_urls(url: str, address: ClamdAddress) -> None:
    assert parse_clamd_url(url) == address


@pytest.mark.parametrize("url", ["tcp://host", "tcp://:3310", "unix://relative/sock",
                                 "http://host:3310", "clamd.sock", "tcp://host:99999"])
def test_bad_clamd_urls_are_named(url: str) -> None:
    with pytest.raises(ValueError, match="JOBPOOL_CLAMD_URL"):
        parse_clamd_url(url)


def test_instream_framing() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert END_OF_STREAM == b"\x00\x00\x00\x00"
