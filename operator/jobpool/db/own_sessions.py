"""The server sessions of this process: every connection a worker opens is counted as its
own, so that its connection budget, read after an outage while some of them (the lease
thread's, LISTEN's) are already back, does not take them for other clients'."""

from __future__ import annotations

import threading
import weakref
from typing import Any, TypeVar

import psycopg

_OWN_SESSIONS: weakref.WeakSet[psycopg.BaseConnection[Any]] = weakref.WeakSet()
_OWN_SESSIONS_LOCK = threading.Lock()

BaseConnectionT = TypeVar("BaseConnectionT", bound=psycopg.BaseConnection[Any])


def count_as_own(conn: BaseConnectionT) -> BaseConnectionT:
    """Count `conn` among this process's own sessions (`own_backend_pids`); returns it.
    Any thread."""
    with _OWN_SESSIONS_LOCK:
        _OWN_SESSIONS.add(conn)
    return conn


def own_backend_pids() -> list[int]:
    """The server processes of this process's open connections (`count_as_own`): the
    connection budget counts them as the worker's own, not as others' (after an outage the
    lease thread and LISTEN connect again before the budget is read)."""
    with _OWN_SESSIONS_LOCK:
        held = list(_OWN_SESSIONS)
    pids = []
    for conn in held:
        try:  # another thread (the lease thread's) may close its connection meanwhile
            pids.append(conn.info.backend_pid)
        except psycopg.OperationalError:
            continue
    return pids
