"""A throw-away migrated database for the data-kind benchmarks."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SERVER = os.environ.get("JOBPOOL_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """Create a database on SERVER, yield its DSN, drop it afterwards."""
    name = f"jobpool_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(SERVER)
    params["dbname"] = name
    try:
        yield make_conninfo(**params)
    finally:
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))
