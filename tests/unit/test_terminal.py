"""Tables the commands print: one line per row, whatever text the cells hold."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from jobpool.core.jsondata import escape_line
from jobpool.pause_command import print_pauses
from jobpool.terminal import print_table


@pytest.mark.parametrize(("text", "shown"), [
    ("plain text, 10\u00a0h \U0001f527\u200d", "plain text, 10\u00a0h \U0001f527\u200d"),
    ("red\x1b[31m alert", "red\\x1b[31m alert"),  # would colour the terminal
    ("two\nlines\r\tand a tab", "two\\nlines\\r\\tand a tab"),
    ("\u202eenod", "\\u202eenod"),  # would reverse what follows
    ("line\u2028separator", "line\\u2028separator"),
])
def test_a_cell_is_one_line_with_what_would_act_on_the_terminal_escaped(
        text: str, shown: str) -> None:
    assert escape_line(text) == shown


def test_a_table_keeps_its_columns_whatever_its_cells_hold(
        capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["id", "last_error"], [["1", "Traceback\n  line 2\x1b[2J"], ["22", "ok"]])
    assert capsys.readouterr().out.splitlines() == [
        "id  last_error",
        "1   Traceback\\n  line 2\\x1b[2J",
        "22  ok",
    ]


def test_the_paused_table_escapes_a_reason_stored_before_reasons_were_checked(
        capsys: pytest.CaptureFixture[str]) -> None:
    print_pauses([{"tenant": "acme", "kind": None, "pending": 3, "ready": 3,
                   "paused_by": "token:alice", "paused_at": datetime(2026, 12, 7, tzinfo=UTC),
                   "reason": "\u202ehi\n\x1b[31mred"}])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].endswith("\\u202ehi\\n\\x1b[31mred")
