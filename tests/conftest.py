"""Database fixtures: one migrated template per session, a fresh copy per test.

The server comes from JOBPOOL_TEST_DSN, else libpq's PG* variables, else
postgresql://postgres@127.0.0.1:5432/postgres.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from pgbouncer_server import PgBouncer, find_pgbouncer
from private_postgres import PrivateServer, find_bin
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from jobpool.db.migrate import migrate

_counter = itertools.count()


def server_dsn() -> str:
    if os.environ.get("JOBPOOL_TEST_DSN"):
        return os.environ["JOBPOOL_TEST_DSN"]
    if os.environ.get("PGHOST") or os.environ.get("PGDATABASE"):
        return ""
    return "postgresql://postgres@127.0.0.1:5432/postgres"


def dsn_for(database: str) -> str:
    params = conninfo_to_dict(server_dsn())
    params["dbname"] = database
    return make_conninfo(**params)


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(server_dsn(), autocommit=True)


def create_database(name: str, template: str | None = None) -> str:
    with _admin() as conn:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template))
        conn.execute(query)
    return dsn_for(name)


def drop_database(name: str) -> None:
    with _admin() as conn:
        query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(query.format(sql.Identifier(name)))


async def _migrate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrate(conn)


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """Name of a migrated template database for this test session."""
    name = f"jobpool_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    dsn = create_database(name)
    asyncio.run(_migrate(dsn))
    yield name
    drop_database(name)


@pytest.fixture
def dsn(template_db: str) -> Iterator[str]:
    """DSN of a fresh migrated database, dropped after the test."""
    name = f"jobpool_t_{os.getpid()}_{next(_counter)}"
    yield create_database(name, template_db)
    drop_database(name)


@pytest.fixture
def empty_dsn() -> Iterator[str]:
    """DSN of an empty database (no schema), dropped after the test."""
    name = f"jobpool_e_{os.getpid()}_{next(_counter)}"
    yield create_database(name)
    drop_database(name)


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[dict[str, Any]]]:
    """An autocommit connection (dict rows) to the test database."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, row_factory=dict_row
    ) as connection:
        yield connection


@pytest.fixture
async def tenant(conn: psycopg.AsyncConnection[dict[str, Any]]) -> uuid.UUID:
    """Id of a tenant with key `acme`."""
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme') RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """A running, migrated PostgreSQL cluster of the test's own, to stop and restart.

    Its `postgres` database (`private_server.dsn()`) holds the schema.
    """
    bin_dir = find_bin()
    if bin_dir is None:
        pytest.skip("no initdb/pg_ctl found: set JOBPOOL_TEST_PG_BIN to their folder")
    server = PrivateServer(bin_dir)
    try:
        server.start()
        asyncio.run(_migrate(server.dsn()))
        yield server
    finally:
        server.remove()


@pytest.fixture
def pgbouncer(private_server: PrivateServer) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode in front of `private_server`."""
    binary = find_pgbouncer()
    if binary is None:
        pytest.skip("no pgbouncer found: install Debian's package (apt-get install pgbouncer)")
    bouncer = PgBouncer(binary, server_port=private_server.port, run_as=private_server.user)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.remove()
