"""Text the commands print for a person at a terminal: tables of one line per row.

Cells hold text that other people and programs wrote (a pause's reason, an actor, a job's last
error, a tenant's metadata), so each is printed as one line with its control, format and line
separator characters escaped: an escape sequence in a cell would act on the terminal of
whoever lists it, and a line break would break the table.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from jobpool.core.jsondata import NOT_IN_A_LINE


def one_line(text: str) -> str:
    """`text` with every character of NOT_IN_A_LINE escaped as Python writes it (`\\x1b`,
    `\\n`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(_escaped(c) if unicodedata.category(c) in NOT_IN_A_LINE else c
                   for c in text)


SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    code = ord(char)
    return SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """`header` and `rows` as columns two spaces apart, each cell `one_line`."""
    lines = [list(header), *([one_line(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for cells in lines:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
