"""A throw-away migrated database for the data-kind benchmarks."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg
from common import server_dsn
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """Create a database on the benchmark server (`common.server_dsn`), yield its DSN, drop
    it afterwards."""
    server = server_dsn()
    name = f"jobpool_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
