"""The package layout: one noun, one home (docs/development.md, "Layout")."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import jobpool
from jobpool.sql import parse_queries, query_files

PACKAGE = Path(jobpool.__file__).parent


def test_no_two_modules_share_a_name() -> None:
    found: defaultdict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.stem not in ("__init__", "__main__"):
            found[path.stem].append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in found.items() if len(paths) > 1}
    assert shared == {}


def test_every_sql_file_of_the_package_is_loaded() -> None:
    on_disk = {path.name for path in PACKAGE.rglob("*.sql") if "migrations" not in path.parts}
    assert on_disk == {entry.name for entry in query_files()}


def test_each_slice_keeps_its_sql_in_its_own_folder() -> None:
    # a query name is unique across every file, so a slice's file holds only its own queries
    names: defaultdict[str, list[str]] = defaultdict(list)
    for entry in query_files():
        for name in parse_queries(entry.read_text("utf-8")):
            names[name].append(entry.name)
    assert {name: files for name, files in names.items() if len(files) > 1} == {}
    assert {slice_.name for slice_ in (PACKAGE / "kinds").iterdir() if slice_.is_dir()
            and slice_.name != "__pycache__"} == {
        "attachments", "email", "entities", "imports", "indexes", "webhooks"}


def imported(path: Path) -> set[str]:
    """The modules `path` imports anywhere (also inside functions), `from a import b` as
    both `a` and `a.b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def importers(folder: str, forbidden: str) -> dict[str, set[str]]:
    """The modules under `folder` that import `forbidden` or a module inside it."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        hits = {name for name in imported(path)
                if name == forbidden or name.startswith(forbidden + ".")}
        if hits:
            found[str(path.relative_to(PACKAGE))] = hits
    return found


def test_no_kind_imports_the_worker() -> None:
    # the worker's parts change without touching a kind (a kind's cleanup step registers
    # with the registry, jobpool.registry.cleanup_step)
    assert importers("kinds", "jobpool.worker") == {}


def test_the_worker_does_not_import_the_admin_commands() -> None:
    assert importers("worker", "jobpool.admin") == {}
