"""Migrations on an empty database, twice: the second run changes nothing."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from private_postgres import PrivateServer, find_bin
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from integration.helpers import add_tenant, role_dsn, scalar, wait_until
from jobpool.db import migrate as migrations_module
from jobpool.db.migrate import (
    _LOCK_KEY,
    NO_TRANSACTION,
    check_schema,
    migrate,
    migration_script,
)
from jobpool.errors import MigrationLockError, SchemaNotMigratedError
from jobpool.registry import builtin_kinds
from jobpool.sql import migrations

Conn = psycopg.AsyncConnection[dict[str, Any]]

KINDS = """
SELECT name, priority, max_attempts, extract(epoch FROM stale_ttl)::float8 AS stale_ttl
  FROM mdm.aa_job_kind ORDER BY name
"""


def _declared() -> list[tuple[str, int, int, float]]:
    return [(spec.name, spec.defaults.priority, spec.defaults.max_attempts,
             spec.defaults.stale_ttl) for spec in builtin_kinds()]


async def _kinds(dsn: str) -> list[tuple[str, int, int, float]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(KINDS)
        return [(row[0], row[1], row[2], row[3]) for row in await cur.fetchall()]

SNAPSHOT = """
SELECT (SELECT json_agg(x ORDER BY x) FROM (
          SELECT table_schema || '.' || table_name || '.' || column_name || ':' || data_type AS x
            FROM information_schema.columns WHERE table_schema = 'mdm') c) AS columns,
       (SELECT json_agg(indexdef ORDER BY indexdef) FROM pg_indexes
         WHERE schemaname = 'mdm') AS indexes,
       (SELECT json_agg(conname ORDER BY conname) FROM pg_constraint c
          JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'mdm') AS constraints,
       (SELECT json_agg(e.enumlabel ORDER BY e.enumlabel) FROM pg_enum e) AS enums,
       (SELECT count(*) FROM mdm.jobpool_migration) AS migrations,
       (SELECT count(*) FROM mdm.aa_tenant) AS tenants,
       (SELECT json_agg(json_build_array(name, priority, max_attempts, stale_ttl) ORDER BY name)
          FROM mdm.aa_job_kind) AS kinds
"""


async def _snapshot(dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(SNAPSHOT)
        return await cur.fetchone()


def _run_script(dsn: str, since: int = 0) -> None:
    """Run the printed script (of the migrations after `since`) as a platform's tool does:
    psql, statement by statement (a migration that builds indexes CONCURRENTLY cannot run
    inside one multi-statement query)."""
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql (the PostgreSQL client) is not installed")
    subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
                   input=migration_script(since=since), text=True, check=True,
                   capture_output=True)


async def test_migrations_apply_once_and_the_second_run_changes_nothing(empty_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as conn:
        with pytest.raises(SchemaNotMigratedError, match="run `jobpool migrate`"):
            await check_schema(conn)
        first = await migrate(conn)
    after_first = await _snapshot(empty_dsn)
    async with await psycopg.AsyncConnection.connect(empty_dsn) as conn:
        second = await migrate(conn)
        await check_schema(conn)
    assert first and first[0] == "0001_queue"
    assert second == []
    assert await _snapshot(empty_dsn) == after_first


async def test_migrate_registers_the_built_in_kinds_as_declared(empty_dsn: str) -> None:
    """Every built-in kind can be enqueued before any worker ran, with its declared defaults."""
    async with await psycopg.AsyncConnection.connect(empty_dsn) as conn:
        await migrate(conn)
    assert await _kinds(empty_dsn) == _declared()


async def test_migrate_brings_the_built_in_kinds_back_to_their_declarations(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("UPDATE mdm.aa_job_kind SET priority = 1, stale_ttl = '1 second'")
        await migrate(conn)
    assert await _kinds(dsn) == _declared()


async def test_printed_sql_registers_the_built_in_kinds_as_declared(empty_dsn: str) -> None:
    _run_script(empty_dsn)
    assert await _kinds(empty_dsn) == _declared()


async def test_concurrent_migrations_queue_on_the_lock(empty_dsn: str) -> None:
    async def run() -> list[str]:
        async with await psycopg.AsyncConnection.connect(empty_dsn) as conn:
            return await migrate(conn)

    results = await asyncio.gather(*(run() for _ in range(4)))
    assert sorted(len(r) for r in results)[:3] == [0, 0, 0]
    assert sum(len(r) for r in results) == len(max(results, key=len))


async def test_a_migration_waiting_for_another_names_it(
        conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """When it starts waiting, and again every report period while it waits."""
    monkeypatch.setattr(migrations_module, "WAIT_REPORT_EVERY", 0.3)
    async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name="other-deploy") as other:
        await other.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        waiting = asyncio.create_task(migrate(conn))

        def namings() -> int:
            return sum("another session is migrating" in r.getMessage()
                       and f"pid {other.info.backend_pid} " in r.getMessage()
                       and "application 'other-deploy'" in r.getMessage()
                       for r in caplog.records if r.levelname == "WARNING")

        await wait_until(lambda: namings() >= 2, "the holder named twice, a period apart", 60)
        assert not waiting.done()
        await other.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    assert await waiting == []


async def test_a_migration_waiting_for_another_gives_up_naming_it(conn: Conn, dsn: str) -> None:
    """It waits at most `lock_wait` seconds for the other (which applies the same
    migrations), then names it, its own session as it was before."""
    await conn.execute("SET lock_timeout = '777ms'; SET application_name = 'deploy'")
    before, autocommit = await _session_settings(conn), conn.autocommit
    async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, application_name="stuck-deploy") as other:
        await other.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        with pytest.raises(MigrationLockError) as raised:
            await migrate(conn, lock_wait=1.0)
        message = str(raised.value)
        assert "another session has been migrating this database" in message
        assert f"pid {other.info.backend_pid} " in message
        assert "application 'stuck-deploy'" in message
    assert await _session_settings(conn) == before and conn.autocommit == autocommit
    assert await migrate(conn) == []


async def test_a_migration_cancelled_as_its_lock_was_taken_leaves_no_lock(
        conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel that meets the lock query after the server took the lock (the answer lost):
    the session does not keep the migration lock, and its settings come back."""

    monkeypatch.setattr(migrations_module, "_lock", _lock_taken_then_cancelled)
    await conn.execute("SET lock_timeout = '777ms'")
    before, autocommit = await _session_settings(conn), conn.autocommit
    with pytest.raises(asyncio.CancelledError):
        await migrate(conn)
    assert await _session_settings(conn) == before and conn.autocommit == autocommit
    assert not await _session_holds_migration_lock(conn)


async def test_a_migration_cancelled_after_setting_its_session_gives_it_back(
        conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled before it asked for the migration lock: its settings and autocommit come
    back, and it releases no lock of its caller's."""

    async def cancelled(conn: Conn) -> bool:
        raise asyncio.CancelledError

    monkeypatch.setattr(migrations_module, "_holds_migration_lock", cancelled)
    await conn.execute("SET lock_timeout = '777ms'; SET application_name = 'deploy'")
    await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))  # the caller's own
    before, autocommit = await _session_settings(conn), conn.autocommit
    with pytest.raises(asyncio.CancelledError):
        await migrate(conn)
    monkeypatch.undo()
    assert await _session_settings(conn) == before and conn.autocommit == autocommit
    assert await _session_holds_migration_lock(conn)
    await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))


async def test_the_wait_for_another_migration_counts_against_the_runs_limit(
        conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A run that waited for another migrator, then for a table held by a transaction,
    gives up once its waits add up to `lock_wait`, not a limit later."""
    label = await _forget_time_checks_migration(conn)
    holder = await _hold_the_job_table(dsn)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            await other.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
            migration = asyncio.create_task(migrate(conn, lock_timeout=0.3, lock_wait=2.0))
            await wait_until(lambda: any("another session is migrating" in r.getMessage()
                                         for r in caplog.records), "the wait named", 60)
            await asyncio.sleep(1.5)  # at least this long spent waiting for the lock
            await other.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
        with pytest.raises(MigrationLockError, match=label) as raised:
            await migration
        # 1.5 s and more of the 2 s spent: its first try (0.3 s) and the pause after it
        # (0.5 s at least) pass the limit; a limit of its own would have allowed more tries
        assert f"{label} gave up after 1 tries" in str(raised.value)
    finally:
        await holder.close()


async def test_a_caller_holding_the_migration_lock_keeps_it_as_it_held_it(
        conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that already holds the lock migrates under that hold, without asking for
    the lock again (a cancel that lost the answer could not tell a second hold from the
    first), and is left holding it once: its one unlock frees it for others."""

    monkeypatch.setattr(migrations_module, "_lock", _lock_taken_then_cancelled)
    await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    assert await migrate(conn, lock_wait=0.0) == []
    await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    assert not await _session_holds_migration_lock(conn)
    async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, row_factory=dict_row) as other:
        assert await scalar(other, "SELECT pg_try_advisory_lock(%s)", (_LOCK_KEY,))


async def test_only_the_wait_for_a_lock_counts_against_the_limit(
        conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A try that worked for a while before it waited for a lock is charged its lock wait
    alone: a migration that works longer than the limit still gets its tries."""
    shipped = migrations()
    version = len(shipped) + 1
    work_then_lock = "SELECT pg_sleep(1.5);\nLOCK TABLE mdm.aa_tenant IN ACCESS EXCLUSIVE MODE;\n"
    monkeypatch.setattr(migrations_module, "migrations",
                        lambda: [*shipped, (version, "test_work_then_lock", work_then_lock)])
    async with await psycopg.AsyncConnection.connect(
            dsn, application_name="tenant-report") as holder:
        await holder.execute("SELECT count(*) FROM mdm.aa_tenant")
        with pytest.raises(MigrationLockError, match="test_work_then_lock") as raised:
            await migrate(conn, lock_timeout=0.2, lock_wait=1.5)
    # charged 0.2 s per try and 0.5-1 s for the first pause, it always tries twice; charged
    # the 1.7 s of its first try, it would give up after one
    tries = re.search(r"gave up after (\d+) tries", str(raised.value))
    assert tries is not None and int(tries.group(1)) >= 2
    assert "application 'tenant-report'" in str(raised.value)


async def test_printed_sql_builds_the_same_schema(empty_dsn: str, dsn: str) -> None:
    _run_script(empty_dsn)
    assert await _snapshot(empty_dsn) == await _snapshot(dsn)


async def test_printed_sql_since_the_last_version_applied_brings_the_rest(
        conn: Conn, dsn: str) -> None:
    """A platform's tool applies the script of a later release from the version its database
    has; the script of the version it has changes nothing."""
    label = await _forget_time_checks_migration(conn)
    await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version > %s",
                       (int(label[:4]),))  # a database at the version before it
    await conn.execute("ALTER TABLE mdm.aa_job DROP CONSTRAINT aa_job_completed_at_in_range,"
                       " ADD CONSTRAINT aa_job_completed_at_in_range"
                       " CHECK (mdm.jobpool_time_in_range(completed_at)) NOT VALID")
    before = int(await scalar(conn, "SELECT max(version) FROM mdm.jobpool_migration"))
    assert before == int(label[:4]) - 1
    _run_script(dsn, since=before)
    assert await _range_checks_validated(conn) == len(TIME_COLUMNS)
    after = await _snapshot(dsn)
    _run_script(dsn, since=max(version for version, _, _ in migrations()))
    assert await _snapshot(dsn) == after
    assert await migrate(conn) == []


@pytest.mark.parametrize("gap", [False, True])
async def test_a_printed_script_refuses_a_database_not_at_its_version(
        conn: Conn, dsn: str, gap: bool) -> None:
    """The script after the latest version but one, on a database that has the latest; the
    script after the latest, on one where version 10 is missing (it would be skipped for
    good): both stop at their first step, changing nothing."""
    latest = len(migrations())
    if gap:
        await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = 10")
    before = await _snapshot(dsn)
    with pytest.raises(subprocess.CalledProcessError) as failed:
        _run_script(dsn, since=latest if gap else latest - 1)
    have = latest - 1 if gap else latest
    assert f"this one has {have} of them, the latest {latest}" in failed.value.stderr
    assert "--since` its latest version, or run `jobpool migrate`" in failed.value.stderr
    assert await _snapshot(dsn) == before


async def test_running_jobs_are_always_claimed(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('k')")
        await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('t')")
        try:
            await conn.execute(
                "INSERT INTO mdm.aa_job (tenant_id, job_kind, status, max_attempts)"
                " SELECT id, 'k', 'running', 1 FROM mdm.aa_tenant WHERE key = 't'")
            violated = None
        except psycopg.errors.CheckViolation as exc:
            violated = exc.diag.constraint_name
    assert violated == "aa_job_running_is_claimed"


async def test_the_queue_table_is_vacuumed_by_a_fixed_number_of_changes(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'mdm.aa_job'::regclass")
        row = await cur.fetchone()
    assert row is not None
    assert {"autovacuum_vacuum_scale_factor=0.0", "autovacuum_vacuum_threshold=5000",
            "autovacuum_analyze_threshold=5000"} <= set(row[0])


async def test_an_index_migration_interrupted_half_way_is_redone(empty_dsn: str) -> None:
    """A migration outside a transaction that stopped before its row was written (here: its
    index built, the old one still there) runs again from the start and completes."""
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as conn:
        await migrate(conn)
        await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = 6")
        await conn.execute("CREATE INDEX ix_aa_job_claim ON mdm.aa_job (priority, available_at)"
                           " WHERE status = 'pending'")
        assert await migrate(conn) == ["0006_claim_lanes"]
        cur = await conn.execute(
            "SELECT indexname FROM pg_indexes WHERE indexname LIKE 'ix_aa_job_%' ORDER BY 1")
        names = [row[0] for row in await cur.fetchall()]
    assert "ix_aa_job_lane" in names
    assert "ix_aa_job_claim" not in names


async def _undo_bounds(conn: psycopg.AsyncConnection[Any]) -> None:
    """Take the database back to before the migrations that bound job times and metadata."""
    versions = [v for v, name, _ in migrations() if name.startswith("robust_bounds")]
    await conn.execute("DROP TABLE mdm.jobpool_oversized_metadata")
    await conn.execute("ALTER TABLE mdm.aa_tenant DROP CONSTRAINT aa_tenant_metadata_size")
    for column in ("available_at", "created_at", "claimed_at", "heartbeat_at", "completed_at"):
        await conn.execute(f"ALTER TABLE mdm.aa_job DROP CONSTRAINT aa_job_{column}_in_range")
    await conn.execute("DROP FUNCTION mdm.jobpool_time_in_range")
    await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = ANY(%s)", (versions,))


async def test_the_bounds_migration_parks_unreadable_jobs_and_keeps_oversized_metadata(
    dsn: str,
) -> None:
    """Rows written before the checks: jobs with times Python cannot hold go to the DLQ
    naming the column, oversized tenant metadata moves aside; then both are refused."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _undo_bounds(conn)
        big = {"rate_limit": {f"kind_{n}": {"rps": 1} for n in range(5000)}}
        cur = await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES "
                                 "('acme', %s) RETURNING id", (Jsonb(big),))
        tenant = (await cur.fetchone() or [None])[0]
        cur = await conn.execute(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, available_at, "
            "created_at, status, claimed_by, claimed_at) VALUES "
            "(%(t)s, 'cleanup_jobs', 1, 'infinity', now(), 'pending', NULL, NULL), "
            "(%(t)s, 'cleanup_jobs', 1, now(), '-infinity', 'running', 'w', '10000-01-01'), "
            "(%(t)s, 'cleanup_jobs', 1, now(), now(), 'pending', NULL, NULL) RETURNING id",
            {"t": tenant})
        late, early, fine = [row[0] for row in await cur.fetchall()]

        await migrate(conn)

        cur = await conn.execute(
            "SELECT id, status::text, last_error, isfinite(available_at) AND isfinite(created_at)"
            " FROM mdm.aa_job ORDER BY id")
        assert await cur.fetchall() == [
            (late, "dlq", "OutOfRangeTime: available_at was infinity (outside years 1 to 9999), "
                          "set to the time of this move", True),
            (early, "dlq", "OutOfRangeTime: created_at was -infinity; claimed_at was "
                           "10000-01-01 00:00:00+00 (outside years 1 to 9999), set to the time "
                           "of this move", True),
            (fine, "pending", None, True)]
        cur = await conn.execute("SELECT count(*) FROM mdm.aa_audit_log WHERE action = 'job_dlq'")
        assert await cur.fetchone() == (2,)
        cur = await conn.execute("SELECT t.metadata, m.metadata = %s FROM mdm.aa_tenant t "
                                 "JOIN mdm.jobpool_oversized_metadata m ON m.tenant_id = t.id",
                                 (Jsonb(big),))
        assert await cur.fetchone() == ({}, True)

        with pytest.raises(psycopg.errors.CheckViolation, match="aa_job_available_at_in_range"):
            await conn.execute("UPDATE mdm.aa_job SET available_at = '10000-01-01' "
                               "WHERE id = %s", (fine,))
        with pytest.raises(psycopg.errors.CheckViolation, match="aa_tenant_metadata_size"):
            await conn.execute("UPDATE mdm.aa_tenant SET metadata = %s WHERE id = %s",
                               (Jsonb(big), tenant))


TIME_COLUMNS = ("available_at", "created_at", "claimed_at", "heartbeat_at", "completed_at")


async def _range_checks_validated(conn: Conn) -> int:
    """How many of the job-time checks are validated range tests."""
    return int(await scalar(
        conn, "SELECT count(*) FROM pg_constraint WHERE conrelid = 'mdm.aa_job'::regclass"
              " AND conname LIKE 'aa_job\\_%%\\_in\\_range' AND convalidated"
              " AND pg_get_constraintdef(oid) LIKE '%%<@%%'"))


@pytest.mark.parametrize("column", TIME_COLUMNS)
async def test_each_job_time_is_checked_at_both_bounds(conn: Conn, column: str) -> None:
    """From 0001-01-02 UTC up to, not including, 9999-12-31 UTC (what every Python datetime
    reads back in any time zone): the last times inside pass, the first outside and the
    infinities are refused under the column's own check."""
    job = await scalar(
        conn, "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, status, completed_at)"
              " VALUES (%s, 'cleanup_jobs', 1, 'done', now()) RETURNING id",
        (await add_tenant(conn, "acme"),))
    update = f"UPDATE mdm.aa_job SET {column} = %s::timestamptz WHERE id = %s"
    for inside in ("0001-01-02 00:00:00+00", "9999-12-30 23:59:59.999999+00"):
        await conn.execute(update, (inside, job))
    for outside in ("0001-01-01 23:59:59.999999+00", "9999-12-31 00:00:00+00",
                    "infinity", "-infinity"):
        with pytest.raises(psycopg.errors.CheckViolation, match=f"aa_job_{column}_in_range"):
            await conn.execute(update, (outside, job))


async def test_no_check_on_jobs_calls_a_function_of_the_schema(conn: Conn) -> None:
    """PostgreSQL prepares a table's checks anew for every statement that writes to it and
    inlines a SQL function by parsing its body each time: a call in a check on the queue
    table would cost every enqueue and every writing job's `done` (the job-time checks did,
    about 30 µs of server CPU per row, before they became range tests: bench/check_cost.py)."""
    cur = await conn.execute(
        "SELECT c.conname, p.oid::regprocedure::text FROM pg_constraint c"
        "  JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = c.oid"
        "  JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid"
        " WHERE c.conrelid = 'mdm.aa_job'::regclass AND c.contype = 'c'")
    assert await cur.fetchall() == []
    assert await _range_checks_validated(conn) == len(TIME_COLUMNS)


async def test_the_time_checks_migration_interrupted_half_way_is_redone(conn: Conn) -> None:
    """Stopped before one check was validated and its row was written (that check still the
    old one, NOT VALID): run again from the start over jobs of every status, their times at
    both bounds, it completes with every check a range test and validated."""
    version = next(v for v, name, _ in migrations() if name == "time_bounds_as_ranges")
    await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, status, available_at,"
        " created_at, claimed_by, claimed_at, heartbeat_at, completed_at)"
        " SELECT %(t)s, 'cleanup_jobs', 1, s::mdm.job_status, b, b,"
        "        CASE WHEN s = 'running' THEN 'w' END, CASE WHEN s <> 'pending' THEN b END,"
        "        CASE WHEN s <> 'pending' THEN b END,"
        "        CASE WHEN s IN ('done', 'dlq', 'failed') THEN b END"
        "   FROM unnest(enum_range(NULL::mdm.job_status)::text[]) s,"
        "        unnest(ARRAY['0001-01-02 00:00:00+00',"
        "                     '9999-12-30 23:59:59.999999+00']::timestamptz[]) b",
        {"t": await add_tenant(conn, "acme")})
    assert await scalar(conn, "SELECT count(DISTINCT status) FROM mdm.aa_job") == 5
    await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = %s", (version,))
    await conn.execute("ALTER TABLE mdm.aa_job DROP CONSTRAINT aa_job_completed_at_in_range,"
                       " ADD CONSTRAINT aa_job_completed_at_in_range"
                       " CHECK (mdm.jobpool_time_in_range(completed_at)) NOT VALID")
    assert await migrate(conn) == [f"{version:04d}_time_bounds_as_ranges"]
    assert await _range_checks_validated(conn) == len(TIME_COLUMNS)


async def _hold_the_job_table(dsn: str) -> psycopg.AsyncConnection[Any]:
    """A session of application `nightly-report` with a transaction open that has read the job
    table: every lock that alters the table waits for it."""
    holder = await psycopg.AsyncConnection.connect(dsn, application_name="nightly-report")
    await holder.execute("SELECT count(*) FROM mdm.aa_job")
    return holder


async def _forget_time_checks_migration(conn: Conn) -> str:
    """Take the row of the migration that alters the job table's checks away; its name."""
    version = next(v for v, name, _ in migrations() if name == "time_bounds_as_ranges")
    await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = %s", (version,))
    return f"{version:04d}_time_bounds_as_ranges"


async def test_a_migration_held_up_by_an_open_transaction_gives_up_naming_it(
        conn: Conn, dsn: str, template_db: str) -> None:
    """It tries again within its limit, then stops with the session to end, unrecorded; once
    that session's transaction ended, it applies."""
    label = await _forget_time_checks_migration(conn)
    holder = await _hold_the_job_table(dsn)
    try:
        async with _job_table_held_in_another_database(dsn, template_db):
            # the session's own settings (a statement timeout shorter than the lock timeout
            # included), set once the holders are in place: the session idles only in migrate
            await conn.execute("SET lock_timeout = '777ms'; SET statement_timeout = '100ms';"
                               " SET idle_session_timeout = '300ms';"
                               " SET application_name = 'deploy'")
            with pytest.raises(MigrationLockError, match=label) as raised:
                await migrate(conn, lock_timeout=0.3, lock_wait=2.0)  # a pause longer than idle
            restored = await _session_settings(conn)
            await conn.execute("SET idle_session_timeout = 0")  # for the slower steps below
        assert "application 'nightly-report', idle in transaction" in str(raised.value)
        assert f"pid {holder.info.backend_pid} " in str(raised.value)
        assert "other-database" not in str(raised.value)  # its tables are not these
        assert await scalar(conn, "SELECT count(*) FROM mdm.jobpool_migration"
                                  " WHERE name = 'time_bounds_as_ranges'") == 0
        assert restored == ["777ms", "100ms", "300ms", "deploy"]  # its own again
    finally:
        await holder.close()
    assert await migrate(conn, lock_timeout=0.3, lock_wait=1.0) == [label]


async def test_prepared_transactions_holding_a_migration_up_are_named_by_their_gids(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each prepared transaction that holds the job table is named apart, by its gid, with
    the statements that end it: to a step that gave way, and to a CONCURRENTLY step (which
    the server tells only that it waits for one)."""
    bin_dir = find_bin()
    if bin_dir is None:
        pytest.skip("no initdb/pg_ctl found: set JOBPOOL_TEST_PG_BIN to their folder")
    server = PrivateServer(bin_dir, {"fsync": "off", "max_prepared_transactions": "4"})
    monkeypatch.setattr(migrations_module, "WAIT_REPORT_EVERY", 0.1)
    try:
        server.start()
        dsn = str(server.dsn())
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=dict_row) as conn:
            await migrate(conn)
            for gid in ("nightly-batch", "audit export"):
                async with await psycopg.AsyncConnection.connect(dsn) as batch:
                    await batch.execute("LOCK TABLE mdm.aa_job IN ROW EXCLUSIVE MODE")
                    await batch.execute(sql.SQL("PREPARE TRANSACTION {}").format(gid))
            label = await _forget_time_checks_migration(conn)
            with pytest.raises(MigrationLockError, match=label) as raised:
                await migrate(conn, lock_timeout=0.3, lock_wait=1.0)
            for gid in ("nightly-batch", "audit export"):
                assert (f"prepared transaction '{gid}' (owner postgres, prepared "
                        in str(raised.value))
                assert f"`ROLLBACK PREPARED '{gid}'` ends it), holding aa_job" in str(
                    raised.value)
            assert "pg_terminate_backend" not in str(raised.value)  # no session to end
            await conn.execute("ROLLBACK PREPARED 'audit export'")
            version = next(v for v, name, _ in migrations() if name == "running_by_id")
            await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = %s",
                               (version,))
            building = asyncio.create_task(migrate(conn, lock_timeout=0.3, lock_wait=1.0))
            await wait_until(lambda: any(
                "a CONCURRENTLY step waits" in r.getMessage()
                and "prepared transaction 'nightly-batch'" in r.getMessage()
                for r in caplog.records), "the CONCURRENTLY step naming the gid", 60)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                await other.execute("ROLLBACK PREPARED 'nightly-batch'")
            assert await building == [f"{version:04d}_running_by_id", label]
    finally:
        server.remove()


async def test_another_roles_transaction_is_named_to_a_role_that_may_not_see_it(
        conn: Conn, dsn: str) -> None:
    """A migrating role that is no superuser sees neither the state nor the start of another
    role's session: that session holding it up is named all the same, by pid and role."""
    suffix = uuid.uuid4().hex[:8]
    migrator, reader = f"jobpool_limited_m{suffix}", f"jobpool_limited_r{suffix}"
    for grant in ("CREATE ROLE {m} LOGIN", "CREATE ROLE {r} LOGIN",
                  "GRANT CREATE ON DATABASE {db} TO {m}",
                  "GRANT USAGE, CREATE ON SCHEMA mdm TO {m}",
                  "ALTER TABLE mdm.aa_job OWNER TO {m}",
                  "GRANT ALL ON mdm.jobpool_migration, mdm.aa_job_kind TO {m}",
                  "GRANT USAGE ON SCHEMA mdm TO {r}", "GRANT SELECT ON mdm.aa_job TO {r}"):
        await conn.execute(sql.SQL(grant).format(
            m=sql.Identifier(migrator), r=sql.Identifier(reader),
            db=sql.Identifier(conn.info.dbname)))
    label = await _forget_time_checks_migration(conn)
    holder = await psycopg.AsyncConnection.connect(role_dsn(dsn, reader))
    try:
        await holder.execute("SELECT count(*) FROM mdm.aa_job")
        async with await psycopg.AsyncConnection.connect(role_dsn(dsn, migrator)) as own:
            with pytest.raises(MigrationLockError, match=label) as raised:
                await migrate(own, lock_timeout=0.3, lock_wait=1.0)
        assert (f"pid {holder.info.backend_pid} (role {reader}, state not visible to this role, "
                "transaction age not visible, holding aa_job)") in str(raised.value)
    finally:
        await holder.close()
        for cleanup in ("REASSIGN OWNED BY {m} TO CURRENT_USER", "DROP OWNED BY {m}, {r}",
                        "DROP ROLE {m}", "DROP ROLE {r}"):
            await conn.execute(sql.SQL(cleanup).format(
                m=sql.Identifier(migrator), r=sql.Identifier(reader)))


@asynccontextmanager
async def _job_table_held_in_another_database(dsn: str, template: str) -> AsyncIterator[None]:
    """`_hold_the_job_table` in another copy of the test's template (its tables have the same
    oids as the test's database), by application `other-database`; that copy is dropped
    after."""
    name = f"{conninfo_to_dict(dsn)['dbname']}_other"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)))
        try:
            async with await psycopg.AsyncConnection.connect(
                    make_conninfo(dsn, dbname=name), application_name="other-database") as other:
                await other.execute("SELECT count(*) FROM mdm.aa_job")
                yield
        finally:
            await admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(
                sql.Identifier(name)))


async def test_a_step_outside_a_transaction_that_gave_way_is_tried_again_alone(
        conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The steps before it stay done and are not run again (a step that cannot run twice, a
    CONCURRENTLY index build already made, are safe)."""
    shipped = migrations()
    version = len(shipped) + 1
    steps = (f"{NO_TRANSACTION}\nCREATE TABLE mdm.test_step_one (n integer);\n"
             "ALTER TABLE mdm.aa_job ADD COLUMN test_step_two integer;\n")
    monkeypatch.setattr(migrations_module, "migrations",
                        lambda: [*shipped, (version, "test_steps", steps)])
    holder = await _hold_the_job_table(dsn)
    migration = asyncio.create_task(migrate(conn, lock_timeout=0.2, lock_wait=300))
    try:
        await wait_until(lambda: any("gave way to the writers" in r.getMessage()
                                     for r in caplog.records), "a step that gave way", 60)
    finally:
        await holder.close()
    assert await migration == [f"{version:04d}_test_steps"]
    assert await scalar(conn, "SELECT count(*) FROM information_schema.columns WHERE"
                              " table_name = 'aa_job' AND column_name = 'test_step_two'") == 1


async def test_a_printed_script_for_a_migrated_database_leaves_another_one_alone(
        empty_dsn: str) -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        _run_script(empty_dsn, since=len(migrations()))
    assert "this one has 0 of them, the latest 0" in failed.value.stderr
    async with await psycopg.AsyncConnection.connect(empty_dsn) as conn:
        cur = await conn.execute("SELECT to_regnamespace('mdm') IS NULL")
        assert await cur.fetchone() == (True,)


async def test_a_concurrent_index_build_names_what_it_waits_for(
        conn: Conn, dsn: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """It waits without a limit (it holds up no writer), but not in silence: every period it
    logs the transactions older than it that it waits for; it completes once they end."""
    monkeypatch.setattr(migrations_module, "WAIT_REPORT_EVERY", 0.1)
    version = next(v for v, name, _ in migrations() if name == "running_by_id")
    await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = %s", (version,))
    holder = await _hold_the_job_table(dsn)
    migration = asyncio.create_task(migrate(conn, lock_timeout=0.3, lock_wait=1.0))
    try:
        await wait_until(lambda: any(
            "a CONCURRENTLY step waits" in r.getMessage() and "'nightly-report'" in
            r.getMessage() for r in caplog.records), "a warning naming the open transaction",
            60)
        assert not migration.done()  # still waiting: past lock_wait, which it is not bound by
    finally:
        await holder.close()
    assert await migration == [f"{version:04d}_running_by_id"]


async def test_writers_go_on_while_a_migration_waits_for_its_lock(conn: Conn, dsn: str) -> None:
    """An enqueue sent while the ALTER waits behind an open transaction gets through while that
    transaction is still open (it waited forever behind the ALTER before migrations gave way)."""
    label = await _forget_time_checks_migration(conn)
    tenant = await add_tenant(conn, "acme")
    holder = await _hold_the_job_table(dsn)
    migration = asyncio.create_task(migrate(conn, lock_timeout=1.0, lock_wait=300))
    try:
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=dict_row) as writer:
            async def alter_waits() -> bool:
                return bool(await scalar(writer, "SELECT count(*) FROM pg_stat_activity WHERE"
                                                 " wait_event_type = 'Lock'"
                                                 " AND query LIKE 'ALTER TABLE%%'"
                                                 " AND application_name = 'jobpool migrate'"))
            await wait_until(alter_waits, "the migration's ALTER waits for its lock (its "
                             "session named, as its connection did not name it)", 60)
            await writer.execute("SET statement_timeout = '60s'")
            await writer.execute(
                "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts) VALUES"
                " (%s, 'cleanup_jobs', 1)", (tenant,))
        assert not migration.done()
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        await holder.close()
    assert await migration == [label]


async def _session_settings(conn: Conn) -> list[Any]:
    """What `migrate` sets for itself and must give back: lock, statement and idle-session
    timeouts and application_name (one round trip: a short idle timeout may be among them)."""
    cur = await conn.execute(
        "SELECT current_setting('lock_timeout') AS a, current_setting('statement_timeout') AS b,"
        " current_setting('idle_session_timeout') AS c, current_setting('application_name') AS d")
    row = await cur.fetchone()
    assert row is not None
    return list(row.values())


async def _session_holds_migration_lock(conn: Conn) -> bool:
    return bool(await scalar(conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                                   " AND pid = pg_backend_pid()"
                                   " AND ((classid::bigint << 32) | objid::bigint) = %s",
                             (_LOCK_KEY,)))


async def _lock_taken_then_cancelled(conn: Conn, budget: Any) -> None:
    """`migrate`'s `_lock` when a cancel meets its query after the server took the lock: the
    answer is lost."""
    await conn.execute("SELECT pg_try_advisory_lock(%s)", (_LOCK_KEY,))
    raise asyncio.CancelledError
