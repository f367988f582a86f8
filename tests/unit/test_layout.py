"""The package layout: one noun, one home (docs/development.md, "Layout")."""

from __future__ import annotations

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
