"""Text the commands print for a person at a terminal: tables of one line per row.

Cells hold text that other people and programs wrote (a pause's reason, an actor, a job's last
error, a tenant's metadata), so each is printed as one line with its control characters, line
separators and direction overrides escaped (`jobpool.core.jsondata.escape_line`): an escape
sequence in a cell would act on the terminal of whoever lists it, and a line break would break
the table.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobpool.core.jsondata import escape_line


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """`header` and `rows` as columns two spaces apart, each cell `escape_line`d."""
    lines = [list(header), *([escape_line(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for cells in lines:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
