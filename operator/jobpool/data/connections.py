"""Side connections: a data kind's own autocommit connection next to the job's transaction.

The worker gives a handler one transaction (`tx`). Work that must commit on its own (import
batches, reindex batches) or must run outside any transaction (CREATE/DROP INDEX
CONCURRENTLY) runs on a side connection to the same database.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.conninfo import make_conninfo

from jobpool.db.connect import connect


def sibling_dsn(conn: AsyncConnection[Any]) -> str:
    """A DSN that reaches `conn`'s database as `conn`'s user, password included if it used one.

    `conn.info.dsn` leaves the password out; it is taken from `conn.info.password`.
    """
    password = conn.info.password
    return make_conninfo(conn.info.dsn, password=password) if password else conn.info.dsn


async def open_side_connection(
    tx: AsyncConnection[Any], *, application_name: str
) -> AsyncConnection[dict[str, Any]]:
    """An autocommit connection (dict rows) to `tx`'s database, named in pg_stat_activity.

    Opening it runs nothing on `tx`. The caller closes it (`async with`).
    """
    dsn = make_conninfo(sibling_dsn(tx), application_name=application_name[:63])
    return await connect(dsn, autocommit=True)
