"""Every named query the code runs exists with the shape it is called as, and every query
of the `.sql` files is run by the product (a static scan of the source: no database)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobpool.db.queries import Exec, Many, One
from jobpool.sql import QUERIES

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "operator" / "jobpool"
SOURCES = [PRODUCT, ROOT / "bench", ROOT / "tests"]
HANDLES = {cls.__name__: cls.shape for cls in (One, Many, Exec)}
QUERY_HOMES = {PRODUCT / "sql" / "__init__.py", PRODUCT / "db" / "queries.py"}


def python_files(*folders: Path) -> Iterator[Path]:
    """The Python files of `folders`, this one left out (it makes handles of unknown names)."""
    for folder in folders:
        yield from sorted(p for p in folder.rglob("*.py")
                          if ".venv" not in p.parts and p != Path(__file__).resolve())


def handles(path: Path) -> Iterator[tuple[str, str, int]]:
    """(query name, shape, line) of each `One("name")`, `Many(...)`, `Exec(...)` in `path`."""
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in HANDLES):
            assert len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str), \
                f"{path}:{node.lineno}: a query handle takes the query's name as a literal"
            yield node.args[0].value, HANDLES[node.func.id], node.lineno


def test_every_handle_names_a_query_of_its_shape() -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line}: {name} :{shape}"
             f" ({'declared :' + QUERIES[name].shape if name in QUERIES else 'no such query'})"
             for path in python_files(*SOURCES)
             for name, shape, line in handles(path)
             if name not in QUERIES or QUERIES[name].shape != shape]
    assert not wrong


def test_every_query_is_run_by_the_product() -> None:
    used = {name for path in python_files(PRODUCT) for name, _, _ in handles(path)}
    assert sorted(set(QUERIES) - used) == []


def test_queries_are_reached_through_handles_only() -> None:
    """No lookup of `QUERIES` by a name string outside the loader and the handles: a renamed
    query would fail only when that path runs."""
    lookups = [f"{path.relative_to(ROOT)}:{node.lineno}"
               for path in python_files(*SOURCES)
               if path not in QUERY_HOMES
               for node in ast.walk(ast.parse(path.read_text("utf-8")))
               if isinstance(node, ast.Name) and node.id == "QUERIES"]
    assert lookups == []


@pytest.mark.parametrize("make, shape", [(One, "many"), (Many, "one"), (Exec, "one")])
def test_a_handle_of_the_wrong_shape_fails_when_made(make: type[One | Many | Exec],
                                                     shape: str) -> None:
    name = next(q.name for q in QUERIES.values() if q.shape == shape)
    with pytest.raises(ValueError, match=f"{name}.*declared :{shape}"):
        make(name)


def test_a_handle_of_an_unknown_query_fails_when_made() -> None:
    with pytest.raises(LookupError, match="no query named 'no_such_query'"):
        One("no_such_query")
