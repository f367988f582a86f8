"""Named SQL queries, loaded once from the `.sql` files of a package folder.

Each query starts with `-- name: <name> :<shape>` and a one-line description; the shape
(`:one`, `:many`, `:exec`) tells the caller what comes back; code runs a query through its
typed handle (`jobpool.db.queries`), never by looking its name up here. `QUERIES` holds the queue's
files (this folder) and each feature slice's own file (`jobpool/kinds/<slice>/<noun>.sql`), in
one namespace, so that a name defined twice anywhere fails at load.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import LiteralString

_HEADER = re.compile(r"^-- name: (?P<name>[a-z_][a-z0-9_]*) :(?P<shape>one|many|exec)\s*$", re.M)


MAX_CACHED_TEXT = 4096
"""Bytes of query text up to which psycopg caches the query's conversion (its placeholders
parsed once, not on every call): the claim runs several times a second per worker."""


@dataclass(frozen=True)
class Query:
    """One named query: its text and what it returns."""

    name: str
    shape: str
    doc: str
    text: LiteralString


def parse_queries(source: str) -> dict[str, Query]:
    """Split a `.sql` file into its named queries; raise ValueError on a duplicate name."""
    queries: dict[str, Query] = {}
    headers = list(_HEADER.finditer(source))
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        body = source[header.end() : following.start() if following else len(source)]
        lines = body.strip("\n").splitlines()
        doc = lines[0].removeprefix("--").strip() if lines and lines[0].startswith("--") else ""
        # comment lines and indentation are left out (no query has a string literal spanning
        # lines): psycopg caches the conversion of a query's placeholders only up to
        # `MAX_CACHED_TEXT` bytes, and a shorter text is cheaper to send and parse
        code = (line.strip() for line in lines)
        text = "\n".join(line for line in code if line and not line.startswith("--"))
        name = header["name"]
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = Query(name, header["shape"], doc, text)
    return queries


def _sql_files(folder: Traversable) -> list[Traversable]:
    return sorted((e for e in folder.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name)


def query_files() -> Iterator[Traversable]:
    """The queue's `.sql` files (this folder), then each slice's under `jobpool/kinds/`."""
    yield from _sql_files(resources.files(__package__))
    slices = resources.files("jobpool.kinds")
    for folder in sorted(slices.iterdir(), key=lambda e: e.name):
        if folder.is_dir():
            yield from _sql_files(folder)


def load_queries() -> dict[str, Query]:
    """Every named query of every file of `query_files`; raise ValueError on a name defined
    twice."""
    queries: dict[str, Query] = {}
    for entry in query_files():
        for name, query in parse_queries(entry.read_text("utf-8")).items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice ({entry.name})")
            queries[name] = query
    return queries


QUERIES: dict[str, Query] = load_queries()


def migrations() -> list[tuple[int, str, str]]:
    """The migrations as (version, name, sql), in order; raise ValueError on a gap."""
    folder = resources.files(__package__).joinpath("migrations")
    found: list[tuple[int, str, str]] = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort()
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise ValueError(
                f"migration {version:04d}_{name} is out of sequence (expected {expected:04d})")
    return found
