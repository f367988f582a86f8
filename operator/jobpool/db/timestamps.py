"""Reading timestamptz values Python cannot hold without failing the whole fetch.

PostgreSQL stores 'infinity', '-infinity' and years from 4713 BC to 294276 AD; Python's
datetime holds years 1 to 9999. psycopg's own loaders raise DataError for the rest, which
would make one row written by SQL fail every claim, listing or look-up that reads it. The
loaders here return an `OutOfRangeTime` instead, registered on every connection jobpool
opens (`jobpool.db.connect.ADAPTERS`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.abc import AdaptContext
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.pq import Format


class OutOfRangeTime(datetime):
    """A stored timestamp past year 9999 (`LATE`) or before year 1 (`EARLY`).

    It orders and compares as datetime.max or datetime.min (UTC), so "available at infinity"
    stays last; it prints, and serialises through isoformat(), as "infinity" or "-infinity",
    so an admin view shows the value for what it is instead of a made-up date.
    """

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        """"infinity" or "-infinity" (whatever `sep` and `timespec`)."""
        return "infinity" if self.year == datetime.max.year else "-infinity"

    def __str__(self) -> str:
        return self.isoformat()

    def __repr__(self) -> str:
        return f"OutOfRangeTime({self.isoformat()!r})"


LATE = OutOfRangeTime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
"""What a timestamp past year 9999 ('infinity' included) is read as."""
EARLY = OutOfRangeTime(1, 1, 1, tzinfo=UTC)
"""What a timestamp before year 1 ('-infinity' included) is read as."""


def out_of_range(exc: psycopg.DataError) -> OutOfRangeTime:
    """`LATE` or `EARLY`, from psycopg's "timestamp too large/too small" error."""
    return EARLY if "too small" in str(exc) else LATE


class _TolerantLoader(Loader):
    """psycopg's own timestamptz loader of `format` (its C one when psycopg's binary package
    is installed: four times faster per value than the Python one, and every claimed job
    carries three timestamps), with out-of-range values read as OutOfRangeTime.

    It wraps that loader rather than subclassing it: the C loaders cannot be subclassed.
    """

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = psycopg.adapters.get_loader(oid, self.format)(oid, context).load  # type: ignore[misc]

    def load(self, data: Buffer) -> Any:
        try:
            return self._load(data)
        except psycopg.DataError as exc:
            return out_of_range(exc)


class TolerantTimestamptzLoader(_TolerantLoader):
    """Text timestamptz values; out-of-range ones come back as OutOfRangeTime."""

    format = Format.TEXT


class TolerantTimestamptzBinaryLoader(_TolerantLoader):
    """Binary timestamptz values; out-of-range ones come back as OutOfRangeTime."""

    format = Format.BINARY


def register_tolerant_timestamps(adapters: AdaptersMap) -> None:
    """Read timestamptz values in `adapters` with the tolerant loaders (text and binary)."""
    adapters.register_loader("timestamptz", TolerantTimestamptzLoader)
    adapters.register_loader("timestamptz", TolerantTimestamptzBinaryLoader)
