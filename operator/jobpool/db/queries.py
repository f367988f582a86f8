"""The one way to call a named query (`jobpool.sql`): a handle per query, typed by its shape.

A module declares the queries it runs as constants, `GET_JOB = One("get_job")`, so that a
query renamed or removed in its `.sql` file, or declared with another shape, fails when the
module is imported (LookupError, ValueError), not when the path that runs it does; the unit
tests check that every declared query is used by one of these handles.

- `One`: at most one row; calling it returns the row (a dict) or None.
- `Many`: any number of rows; calling it returns them as a list of dicts.
- `Exec`: no rows wanted; calling it returns the number of rows the statement touched
  (psycopg's rowcount, -1 for statements that report none).

Each handle is awaited on an async connection (`await GET_JOB(conn, params)`) and called
through `.sync` on a blocking one (threads, benchmarks). Rows come back as dicts whatever the
connection's row factory. `.text` is the query's text, for the few places that must send it
themselves (a pipeline, COPY, an EXPLAIN, a query given to KEDA, identifiers composed in with
`psycopg.sql`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, LiteralString

from psycopg import AsyncConnection, Connection, sql
from psycopg.rows import dict_row

from jobpool.sql import QUERIES, Query

Row = dict[str, Any]
"""One row of a query, by column name."""

Params = Mapping[str, Any] | None
"""A query's named parameters (`%(name)s`), or None for a query without any."""

PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")
"""A named parameter in a query's text: `%(name)s` (text) or `%(name)b` (binary)."""


class NamedQuery:
    """A named query of shape `shape`, looked up when the handle is made."""

    shape = ""

    __slots__ = ("query",)

    def __init__(self, name: str) -> None:
        query = QUERIES.get(name)
        if query is None:
            raise LookupError(f"no query named {name!r} in jobpool's .sql files")
        if query.shape != self.shape:
            raise ValueError(f"query {name!r} is declared :{query.shape}, "
                             f"called as :{self.shape}")
        self.query: Query = query

    @property
    def name(self) -> str:
        return self.query.name

    @property
    def text(self) -> LiteralString:
        return self.query.text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def prepared(self, statement: str,
                 params: Mapping[str, Any]) -> tuple[sql.Composed, sql.Composed]:
        """`PREPARE statement AS ...` of this query (its parameters numbered in order of first
        use) and the `EXECUTE statement (...)` that runs it with `params` as literals. An
        EXPLAIN of that EXECUTE shows the plan a prepared statement runs with (the generic
        plan under `plan_cache_mode = force_generic_plan`), where an EXPLAIN of the text
        itself plans for the values given. Raises KeyError naming a parameter missing from
        `params`."""
        names: list[str] = []

        def numbered(match: re.Match[str]) -> str:
            if match[1] not in names:
                names.append(match[1])
            return f"${names.index(match[1]) + 1}"

        text = PLACEHOLDER.sub(numbered, self.query.text)
        prepare = sql.SQL("PREPARE {} AS {}").format(
            sql.Identifier(statement), sql.SQL(text))
        execute = sql.SQL("EXECUTE {} ({})").format(
            sql.Identifier(statement),
            sql.SQL(", ").join(sql.Literal(params[name]) for name in names))
        return prepare, execute


class One(NamedQuery):
    """A `:one` query: the first row it returns, or None."""

    shape = "one"
    __slots__ = ()

    async def __call__(self, conn: AsyncConnection[Any], params: Params = None, *,
                       prepare: bool | None = None) -> Row | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.query.text, params, prepare=prepare)
            return await cur.fetchone()

    def sync(self, conn: Connection[Any], params: Params = None, *,
             prepare: bool | None = None) -> Row | None:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self.query.text, params, prepare=prepare)
            return cur.fetchone()


class Many(NamedQuery):
    """A `:many` query: every row it returns."""

    shape = "many"
    __slots__ = ()

    async def __call__(self, conn: AsyncConnection[Any], params: Params = None, *,
                       prepare: bool | None = None) -> list[Row]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(self.query.text, params, prepare=prepare)
            return await cur.fetchall()

    def sync(self, conn: Connection[Any], params: Params = None, *,
             prepare: bool | None = None) -> list[Row]:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self.query.text, params, prepare=prepare)
            return cur.fetchall()


class Exec(NamedQuery):
    """An `:exec` query: run for its effect; returns the rows it touched (psycopg's
    rowcount)."""

    shape = "exec"
    __slots__ = ()

    async def __call__(self, conn: AsyncConnection[Any], params: Params = None, *,
                       prepare: bool | None = None) -> int:
        async with conn.cursor() as cur:
            await cur.execute(self.query.text, params, prepare=prepare)
            return cur.rowcount

    def sync(self, conn: Connection[Any], params: Params = None, *,
             prepare: bool | None = None) -> int:
        with conn.cursor() as cur:
            cur.execute(self.query.text, params, prepare=prepare)
            return cur.rowcount
