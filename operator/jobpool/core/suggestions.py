"""'Did you mean ...?' for a name that is not one of the known ones (a kind, a command)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.75
"""difflib's similarity ratio below which a known name is no suggestion: a letter swapped or
missing in a short name stays above it (`statsu`/`status` 0.83), a merely similar name of a
family (`test_recrod`/`test_noop` 0.6) does not."""


def close_names(word: str, known: Iterable[str], *, limit: int = 3) -> list[str]:
    """Up to `limit` names of `known` that look like `word`, the closest first."""
    return difflib.get_close_matches(word, sorted(set(known)), n=limit, cutoff=CUTOFF)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" (or "'x' or 'y'") when a known name looks like `word`, else "",
    to follow the name in a message."""
    names = close_names(word, known)
    if not names:
        return ""
    return " (did you mean " + " or ".join(repr(name) for name in names) + "?)"
