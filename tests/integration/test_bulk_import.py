"""bulk_import against a real PostgreSQL: staging, validation, batches, crash resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from jobpool.kinds.imports import batches as imports
from jobpool.kinds.imports.staging import detect_format, read_file, stage_import
from jobpool.worker.maintenance import recover_stale_claims

from .entities_helpers import Conn, create_type, jobs_of, run_worker

pytestmark = pytest.mark.asyncio

CUSTOMER: list[dict[str, Any]] = [
    {"attr_key": "name", "data_type": "string", "required": True, "searchable": True},
    {"attr_key": "age", "data_type": "integer"},
    {"attr_key": "birthday", "data_type": "date"},
    {"attr_key": "active", "data_type": "boolean"},
    {"attr_key": "tier", "data_type": "enum", "enum_values": ["gold", "silver"]},
]


def _csv_rows(count: int, bad: dict[int, str] | None = None) -> str:
    """A CSV of `count` customers; `bad` replaces record i (1-based) with a raw line."""
    lines = ["external_key,name,age,birthday,active,tier"]
    for i in range(1, count + 1):
        if bad and i in bad:
            lines.append(bad[i])
        else:
            lines.append(f"k{i},Customer {i},{20 + i % 50},1990-01-{1 + i % 28:02d},"
                         f"{'true' if i % 2 else 'no'},{'gold' if i % 3 else 'silver'}")
    return "\n".join(lines) + "\n"


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBPOOL_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "jobpool", *args], env=env, text=True,
                          capture_output=True, timeout=120, check=False)


async def _count(conn: Conn, query: str, *params: Any) -> int:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return int(next(iter(row.values())))


async def _stage(conn: Conn, tenant: uuid.UUID, path: Path, **options: Any) -> int:
    fmt = detect_format(path, None)
    async with conn.transaction():
        staged = await stage_import(conn, read_file(path, fmt), tenant_id=tenant,
                                    type_key="customer", source_name=path.name, fmt=fmt,
                                    **options)
    return staged.import_job_id


async def test_10000_rows_with_3_bad_ones_import_once_and_a_rerun_changes_nothing(
    dsn: str, conn: Conn, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer", CUSTOMER)
    path = tmp_path / "customers.csv"
    path.write_text(_csv_rows(10_000, {
        100: "k100,Bad\x00Name,30,1990-01-01,true,gold",
        5000: "k5000,Customer 5000,99999999999999999999,1990-01-01,true,gold",
        9000: "k9000,,41,1990-01-01,true,gold",
    }), encoding="utf-8")

    staged = _cli(dsn, "import", str(path), "--tenant", "acme", "--type", "customer")
    assert staged.returncode == 0, staged.stderr
    assert "staged 10000 record(s)" in staged.stdout
    await run_worker(dsn, "bulk_import")

    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "done" and job["attempts"] == 1
    assert job["result"]["inserted"] == 9_997 and job["result"]["rejected"] == 3
    assert await _count(conn, "SELECT count(*) FROM mdm.ddm_entity") == 9_997
    cur = await conn.execute("SELECT line_no, error_field, error FROM mdm.aa_import_row"
                             " WHERE status = 'rejected' ORDER BY line_no")
    rejected = await cur.fetchall()
    assert [(r["line_no"], r["error_field"]) for r in rejected] == [
        (101, "name"), (5001, "age"), (9001, "name")]
    assert rejected[0]["error"] == "line 101: field 'name': contains a NUL character"
    assert "field 'age'" in rejected[1]["error"] and "out of range" in rejected[1]["error"]
    assert "field 'name': is required" in rejected[2]["error"]
    cur = await conn.execute("SELECT attributes, search_vector::text AS sv FROM mdm.ddm_entity"
                             " WHERE external_key = 'k7'")
    k7 = await cur.fetchone()
    assert k7 is not None
    assert k7["attributes"] == {"name": "Customer 7", "age": 27, "birthday": "1990-01-08",
                                "active": True, "tier": "gold"}
    assert "'customer'" in k7["sv"]

    again = _cli(dsn, "import", str(path), "--tenant", "acme", "--type", "customer")
    assert again.returncode == 0, again.stderr
    await run_worker(dsn, "bulk_import")

    second = (await jobs_of(conn, "bulk_import"))[1]
    assert second["status"] == "done"
    assert (second["result"]["inserted"], second["result"]["updated"]) == (0, 0)
    assert second["result"]["unchanged"] == 9_997 and second["result"]["rejected"] == 3
    assert await _count(conn, "SELECT count(*) FROM mdm.ddm_entity") == 9_997


async def test_a_file_of_only_bad_rows_completes_with_every_row_rejected(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer", CUSTOMER)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        '{"external_key": "a", "name": "A", "birthday": "2023-02-30"}',
        '{"external_key": "b", "name": "B", "age": 1.5}',
        'not json at all',
        '[1, 2, 3]',
        '{"external_key": "e", "name": "E", "tier": "bronze"}',
        '{"external_key": "f", "name": "F", "colour": "red"}',
        '{"name": "no key"}',
    ]) + "\n", encoding="utf-8")
    import_id = await _stage(conn, tenant, path)

    await run_worker(dsn, "bulk_import")

    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "done" and job["attempts"] == 1
    assert job["result"]["rejected"] == 7 and job["result"]["inserted"] == 0
    cur = await conn.execute("SELECT line_no, error_field, error FROM mdm.aa_import_row"
                             " WHERE import_job_id = %s ORDER BY line_no", (import_id,))
    rows = await cur.fetchall()
    assert [r["error_field"] for r in rows] == [
        "birthday", "age", None, None, "tier", "colour", "external_key"]
    assert "is not a valid date" in rows[0]["error"]
    assert "not valid JSON" in rows[2]["error"]
    assert "'colour': is not an attribute of type 'customer'" in rows[5]["error"]


async def test_jsonl_with_ignored_unknown_keys_typed_values_and_a_repeated_key_rejected(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer", [
        *CUSTOMER, {"attr_key": "seen", "data_type": "timestamp"},
        {"attr_key": "score", "data_type": "number"}])
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([
        '{"external_key": "x1", "name": "First", "seen": "2024-03-01T10:00:00+01:00",'
        ' "score": "2.5", "extra": 1}',
        '',
        '{"external_key": 42, "name": "Numeric key", "active": "YES", "age": "-7"}',
        '{"external_key": "x1", "name": "First again", "score": 1e3}',
    ]) + "\n", encoding="utf-8")
    await _stage(conn, tenant, path, unknown_keys="ignore")

    await run_worker(dsn, "bulk_import")

    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "done"
    assert (job["result"]["inserted"], job["result"]["updated"]) == (2, 0)
    assert job["result"]["rejected"] == 1
    cur = await conn.execute("SELECT external_key, attributes FROM mdm.ddm_entity"
                             " ORDER BY external_key")
    entities = {r["external_key"]: r["attributes"] for r in await cur.fetchall()}
    assert entities["42"] == {"name": "Numeric key", "active": True, "age": -7}
    assert (entities["x1"]["name"], entities["x1"]["score"]) == ("First", 2.5)
    cur = await conn.execute("SELECT line_no, status::text AS status, error_field, error "
                             "FROM mdm.aa_import_row ORDER BY line_no")
    assert [tuple(r.values()) for r in await cur.fetchall()] == [
        (1, "imported", None, None), (3, "imported", None, None),
        (4, "rejected", "external_key", "line 4: field 'external_key': 'x1' is on line 1 "
                                        "already; a file may set each entity once")]


async def _the_one_rejected_row(conn: Conn, import_id: int) -> dict[str, Any]:
    """The rejected row of an import whose job is done with 4 rows imported and 1 rejected."""
    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "done"
    assert (job["result"]["inserted"], job["result"]["rejected"]) == (4, 1)
    cur = await conn.execute("SELECT line_no, error FROM mdm.aa_import_row WHERE"
                             " import_job_id = %s AND status = 'rejected'", (import_id,))
    [row] = await cur.fetchall()
    return row


async def test_a_row_the_database_refuses_does_not_sink_its_batch(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer", CUSTOMER)
    await conn.execute("ALTER TABLE mdm.ddm_entity ADD CONSTRAINT test_refuse"
                       " CHECK (external_key <> 'k3')")
    path = tmp_path / "c.csv"
    path.write_text(_csv_rows(5), encoding="utf-8")
    import_id = await _stage(conn, tenant, path)

    await run_worker(dsn, "bulk_import")

    row = await _the_one_rejected_row(conn, import_id)
    assert row["line_no"] == 4 and "test_refuse" in row["error"]


async def test_a_row_past_a_server_limit_is_rejected_alone(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """120 searchable names of 1,000 distinct words each make a search vector past
    PostgreSQL's 1 MB (SQLSTATE class 54, which every retry of the import would meet): that
    row is rejected naming the limit, not its value, and the rest of its batch is imported."""
    names = [f"n{a}" for a in range(120)]
    await create_type(conn, tenant, "customer", [
        {"attr_key": name, "data_type": "string", "searchable": True} for name in names])
    long_row = {name: " ".join(f"w{a}x{n}" for n in range(1_000))
                for a, name in enumerate(names)}
    rows = [{"n0": "a"}, {"n0": "b"}, long_row, {"n0": "c"}, {"n0": "d"}]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"external_key": f"k{i}", **row}) + "\n"
                            for i, row in enumerate(rows, 1)), encoding="utf-8")
    import_id = await _stage(conn, tenant, path)

    await run_worker(dsn, "bulk_import")

    row = await _the_one_rejected_row(conn, import_id)
    assert row["line_no"] == 3
    assert row["error"].startswith("line 3: refused by the database: string is too long for "
                                   "tsvector (")
    assert "w0x1 " not in row["error"]


async def test_hostile_or_unknown_type_in_the_import_command_is_refused(
    dsn: str, conn: Conn, tenant: uuid.UUID, tmp_path: Path
) -> None:
    path = tmp_path / "c.csv"
    path.write_text(_csv_rows(2), encoding="utf-8")
    hostile = _cli(dsn, "import", str(path), "--tenant", "acme",
                   "--type", "x; drop table mdm.aa_job")
    assert hostile.returncode == 2
    assert "invalid type_key" in hostile.stderr and "^[a-z][a-z0-9_]{0,39}$" in hostile.stderr
    unknown = _cli(dsn, "import", str(path), "--tenant", "acme", "--type", "nosuch")
    assert unknown.returncode == 2 and "no entity type 'nosuch'" in unknown.stderr
    assert await _count(conn, "SELECT count(*) FROM mdm.aa_import_job") == 0
    assert await _count(conn, "SELECT count(*) FROM mdm.aa_job") == 0


async def test_a_worker_killed_halfway_resumes_and_commits_each_row_once(
    dsn: str, conn: Conn, tenant: uuid.UUID, tmp_path: Path
) -> None:
    total = 50_000
    await create_type(conn, tenant, "customer", CUSTOMER)
    path = tmp_path / "big.csv"
    path.write_text(_csv_rows(total), encoding="utf-8")
    import_id = await _stage(conn, tenant, path, batch_size=500)

    env = {**os.environ, "JOBPOOL_DSN": dsn}
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobpool", "run", "--kinds", "bulk_import", "--until-empty",
         "--metrics-port", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        progress = 0
        while time.monotonic() < deadline and worker.poll() is None:
            progress = await _count(conn, "SELECT last_line FROM mdm.aa_import_job"
                                          " WHERE id = %s", import_id)
            if progress >= total // 5:
                break
            await asyncio.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
    finally:
        worker.wait(timeout=30)
    assert 0 < progress < total + 1, "the worker must be killed halfway through"
    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "running"

    await conn.execute("UPDATE mdm.aa_job_kind SET stale_ttl = '1 second'"
                       " WHERE name = 'bulk_import'")
    await conn.execute("UPDATE mdm.aa_job SET claimed_at = claimed_at - interval '1 hour',"
                       " heartbeat_at = heartbeat_at - interval '1 hour',"
                       " lease_expires_at = claimed_at - interval '59 minutes' WHERE id = %s",
                       (job["id"],))
    recovered = await recover_stale_claims(conn, actor="test")
    assert [r["id"] for r in recovered] == [job["id"]]
    resumed_from = await _count(conn, "SELECT last_line FROM mdm.aa_import_job WHERE id = %s",
                                import_id)
    assert 0 < resumed_from <= total + 1

    await run_worker(dsn, "bulk_import")

    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "done" and job["attempts"] == 2
    assert job["result"]["inserted"] == total
    assert (job["result"]["updated"], job["result"]["unchanged"]) == (0, 0)
    assert await _count(conn, "SELECT count(*) FROM mdm.ddm_entity") == total
    assert await _count(conn, "SELECT count(*) FROM mdm.aa_import_row WHERE import_job_id = %s"
                              " AND status = 'imported'", import_id) == total
    cur = await conn.execute("SELECT payload FROM mdm.aa_audit_log WHERE action ="
                             " 'import_completed'")
    [audit] = await cur.fetchall()
    assert json.loads(json.dumps(audit["payload"]))["inserted"] == total


async def test_a_batch_ends_at_its_character_budget_before_its_row_count(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(imports, "MAX_BATCH_CHARS", 500)  # ~4 staged customer rows
    await create_type(conn, tenant, "customer", CUSTOMER)
    path = tmp_path / "c.csv"
    path.write_text(_csv_rows(20), encoding="utf-8")
    await _stage(conn, tenant, path, batch_size=1000)

    await run_worker(dsn, "bulk_import")

    [job] = await jobs_of(conn, "bulk_import")
    assert job["status"] == "done"
    assert job["result"]["inserted"] == 20
    assert job["result"]["batches_this_attempt"] >= 4


async def test_a_number_too_long_for_python_is_a_row_error_in_our_words(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await create_type(conn, tenant, "customer", CUSTOMER)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"external_key": "a", "name": "A"}) + "\n"
                    + '{"external_key": "b", "name": "B", "age": ' + "9" * 5000 + "}\n"
                    + json.dumps({"external_key": "c", "name": "C", "age": "9" * 5000}) + "\n",
                    encoding="utf-8")
    await _stage(conn, tenant, path)

    await run_worker(dsn, "bulk_import")

    cur = await conn.execute("SELECT line_no, status::text AS status, error FROM "
                             "mdm.aa_import_row ORDER BY line_no")
    rows = await cur.fetchall()
    assert [r["status"] for r in rows] == ["imported", "rejected", "rejected"]
    assert rows[1]["error"] == "line 2: record holds a number of more than 4300 digits"
    assert rows[2]["error"].startswith("line 3: field 'age': '9999")
    assert rows[2]["error"].endswith("is out of range for a 64-bit integer")
    assert not any("set_int_max_str_digits" in r["error"] for r in rows[1:])
