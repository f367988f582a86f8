"""Paused scopes: what a scope is, what it holds, and the docs' commands."""

from __future__ import annotations

import re
import shlex
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobpool.cli import build_parser
from jobpool.core.pause_scopes import (
    check_reason,
    check_scope,
    covers,
    overlaps,
    scope_text,
    with_held_jobs,
)
from jobpool.pause_command import print_pauses

ACME = uuid.UUID("00000000-0000-4000-8000-000000000001")
GLOBEX = uuid.UUID("00000000-0000-4000-8000-000000000002")
DOC = Path(__file__).resolve().parents[2] / "docs" / "pause-and-stop.md"


def scope(tenant: uuid.UUID | None, kind: str | None) -> dict[str, Any]:
    return {"tenant_id": tenant, "kind": kind}


def count(tenant: uuid.UUID, kind: str, jobs: int, ready: int,
          status: str = "pending") -> dict[str, Any]:
    return {"tenant_id": tenant, "kind": kind, "status": status, "jobs": jobs, "ready": ready}


def test_a_scope_names_a_tenant_a_kind_or_both() -> None:
    with pytest.raises(ValueError, match="name what to pause or resume"):
        check_scope(None, None)
    check_scope("acme", None)
    check_scope(None, "email_send")
    assert scope_text("acme", "email_send") == "tenant acme, kind email_send"
    assert scope_text(None, "email_send") == "kind email_send (every tenant)"
    assert scope_text("acme", None) == "tenant acme (every kind)"


def test_a_reason_is_stripped_and_bounded() -> None:
    assert check_reason("  down  ") == "down"
    assert check_reason("   ") is None and check_reason(None) is None
    with pytest.raises(ValueError, match="at most 500 characters, got 501"):
        check_reason("x" * 501)
    with pytest.raises(ValueError, match=r"reason contains a lone surrogate \(U\+DCFF: the "
                                          r"byte 0xFF of text that is not UTF-8\)"):
        check_reason("smtp \udcff down")  # an undecodable byte of a command line
    assert check_reason(" " * 600 + "x") == "x"  # bounded once stripped, as it is stored
    spaced = "smtp down until 10\u00a0h \U0001f527"  # a no-break space and an emoji print
    assert check_reason(spaced) == spaced


@pytest.mark.parametrize(("reason", "shown"), [
    ("red\x1b[31m alert", "U+001B at index 3"),  # an escape sequence for the terminal
    ("two\nlines", "U+000A at index 3"),  # breaks `jobpool paused`'s table
    ("\u202edown", "U+202E at index 0"),  # reverses what the terminal shows after it
])
def test_a_reason_that_is_not_one_printable_line_is_refused_naming_the_character(
        reason: str, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"a pause's reason contains {re.escape(shown)}: only "
                                         "printable text"):
        check_reason(reason)


def test_which_pairs_a_scope_holds_and_which_scopes_overlap() -> None:
    assert covers(scope(ACME, "email_send"), ACME, "email_send")
    assert not covers(scope(ACME, "email_send"), GLOBEX, "email_send")
    assert covers(scope(None, "email_send"), GLOBEX, "email_send")
    assert covers(scope(ACME, None), str(ACME), "reindex")  # ids compare as text too
    assert overlaps(scope(ACME, "email_send"), scope(ACME, None))
    assert overlaps(scope(None, "email_send"), scope(GLOBEX, None))
    assert not overlaps(scope(ACME, "email_send"), scope(GLOBEX, None))
    assert not overlaps(scope(None, "email_send"), scope(None, "reindex"))


def test_each_pause_counts_the_pending_and_ready_jobs_it_holds() -> None:
    counts = [count(ACME, "email_send", 10, 8), count(ACME, "reindex", 2, 2),
              count(ACME, "email_send", 3, 0, status="running"),
              count(GLOBEX, "email_send", 5, 5)]
    held = with_held_jobs([scope(ACME, None), scope(None, "email_send")], counts)
    assert [(p["pending"], p["ready"]) for p in held] == [(12, 10), (15, 13)]


def test_the_docs_commands_parse_and_print_what_they_show() -> None:
    text = DOC.read_text()
    section = text.split("## Pause and resume", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"`(jobpool (?:pause|resume|paused)[^`]*)`", section)
    commands += re.findall(r"^\$ (jobpool .*)$", section, re.M)
    assert len(commands) >= 6
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(shlex.split(command)[1:])
        assert args.command in ("pause", "resume", "paused"), command
    assert "\npaused tenant acme, kind email_send\n" in section
    assert "\nresumed tenant acme, kind email_send (paused by " in section


def test_the_docs_listing_is_what_paused_prints(capsys: pytest.CaptureFixture[str]) -> None:
    print_pauses([{"tenant": "acme", "kind": "email_send", "pending": 1200, "ready": 1200,
                   "paused_by": "user:oncall", "reason": "SMTP provider down",
                   "paused_at": datetime(2026, 12, 1, 23, 40, tzinfo=UTC)}])
    printed = capsys.readouterr().out
    assert f"$ jobpool paused\n{printed}$ jobpool resume" in DOC.read_text()
    print_pauses([])
    assert capsys.readouterr().out == "nothing is paused\n"
