"""What a psycopg error says: a lost connection, a transaction that conflicted with another, or
a value the server refuses to store.

Functions of the exception (and of the connection it was raised on), apart from the worker's
connection module, so that the operator's counts and the admin API use them too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg


def transaction_conflict(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it came from, is a transaction the server rolled back
    for a conflict with another (SQLSTATE class 40: a serialization failure, a deadlock): the
    same transaction may well succeed when run again."""
    return any(isinstance(e, psycopg.Error) and (e.sqlstate or "").startswith("40")
               for e in _chain(exc))


PROGRAM_LIMIT_CLASS = "54"
"""SQLSTATE class of a value past one of the server's limits (program_limit_exceeded: a jsonb
past 256 MB, a tsvector past 1 MB, nesting past the stack's depth)."""


def refuses_value(exc: psycopg.Error) -> bool:
    """Whether the server refused a statement for a value it was to store, so that every retry
    of the same value is refused the same: a data exception (a DataError), an integrity
    violation (an IntegrityError) or a value past a server limit (SQLSTATE class 54)."""
    return (isinstance(exc, psycopg.errors.DataError | psycopg.errors.IntegrityError)
            or (exc.sqlstate or "").startswith(PROGRAM_LIMIT_CLASS))


def primary_message(exc: psycopg.Error) -> str:
    """The server's primary message of `exc`, without its detail (a failing row), context or
    the statement's text, which carry the refused value itself (a job's result, a row)."""
    return exc.diag.message_primary or str(exc).partition("\n")[0]


def interrupted_by_connection(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it came from, is a lost connection (`lost_connection`):
    a handler that wrapped the error in its own still counts as interrupted."""
    return any(lost_connection(e) for e in _chain(exc))


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or during (cycles cut)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and not any(current is e for e in seen) and len(seen) < 20:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def lost_connection(exc: BaseException) -> bool:
    """Whether `exc` says the connection failed (refused, broken, server shutting down, no
    pooled connection in time), as opposed to a statement that failed on a live one."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P"))


def closed_meanwhile(kept: psycopg.BaseConnection[Any] | None, exc: BaseException) -> bool:
    """Whether `exc` came of work on `kept`, a connection found open before the work ran (None:
    the work opened its own), which the server had closed while it idled (a restart, an
    `idle_session_timeout`, a pooler dropping it): the same work is worth running once more
    at once on a new connection, before anything is reported. Behind a session pooler
    psycopg raises that as an InternalError on the next BEGIN, which leaves `kept` broken."""
    return kept is not None and (kept.broken or lost_connection(exc))


def open_or_none(conn: psycopg.BaseConnection[Any] | None) -> psycopg.BaseConnection[Any] | None:
    """`conn` if it is open, else None (the `kept` of `closed_meanwhile`)."""
    return conn if conn is not None and not conn.closed else None


@contextlib.contextmanager
def broken_as_lost(conn: psycopg.BaseConnection[Any]) -> Iterator[None]:
    """Raise a psycopg.Error from what the block ran on `conn` as the lost connection it is
    when it left `conn` broken, whatever its class: behind a session pooler the server's
    FATAL message of a connection it closed (a restart, `idle_session_timeout`) reaches the
    client with the answer to its next BEGIN, and psycopg raises InternalError ("received 2
    results from command 'BEGIN ...'"), which `lost_connection` cannot tell apart by itself.
    Raises psycopg.OperationalError from the original error in that case."""
    try:
        yield
    except psycopg.Error as exc:
        if conn.broken and not lost_connection(exc):
            raise psycopg.OperationalError(
                f"connection lost ({type(exc).__name__}: {exc})") from exc
        raise
