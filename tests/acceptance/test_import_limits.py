"""`jobpool import` with wide files: a header over the column limit is refused whole, one just
under it stages and imports."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
from integration.entities_helpers import create_type, run_worker
from integration.helpers import scalar

from acceptance.cli import jobpool as cli
from jobpool.kinds.entities.attributes import MAX_FIELDS

Conn = psycopg.AsyncConnection[dict[str, Any]]


def _wide_csv(path: Path, columns: int, rows: int) -> Path:
    names = ["external_key", "name", *(f"c{i}" for i in range(columns - 2))]
    lines = [",".join(names)]
    lines += [",".join([f"k{r}", f"Name {r}", *("x" for _ in range(columns - 2))])
              for r in range(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def _staged(conn: Conn) -> tuple[int, int, int]:
    return (await scalar(conn, "SELECT count(*) FROM mdm.aa_import_job"),
            await scalar(conn, "SELECT count(*) FROM mdm.aa_import_row"),
            await scalar(conn, "SELECT count(*) FROM mdm.aa_job"))


async def test_a_header_of_100000_columns_is_refused_and_nothing_is_staged(
    dsn: str, conn: Conn, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer",
                      [{"attr_key": "name", "data_type": "string"}])
    path = _wide_csv(tmp_path / "wide.csv", 100_000, 2)
    result = cli(dsn, "import", str(path), "--tenant", "acme", "--type", "customer",
                 check=False)
    assert result.returncode == 2, result.stderr
    assert "wide.csv: the CSV header has 100,000 columns, more than the limit of 2,000" in (
        result.stderr)
    assert await _staged(conn) == (0, 0, 0)


async def test_a_header_just_under_the_limit_stages_and_imports(
    dsn: str, conn: Conn, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer",
                      [{"attr_key": "name", "data_type": "string"}])
    path = _wide_csv(tmp_path / "wide.csv", MAX_FIELDS, 50)
    result = cli(dsn, "import", str(path), "--tenant", "acme", "--type", "customer",
                 "--unknown-keys", "ignore")
    assert "staged 50 record(s)" in result.stdout
    await run_worker(dsn, "bulk_import")
    assert await scalar(conn, "SELECT result->>'inserted' FROM mdm.aa_job"
                              " WHERE job_kind = 'bulk_import'") == "50"
