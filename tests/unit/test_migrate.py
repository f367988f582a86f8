"""How long a migration's statements wait for their locks, how the sessions that held one up
are told to an operator, and what the printed script holds (no database needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from jobpool.cli import main
from jobpool.db.migrate import (
    LOCK_WAIT,
    describe_lock_holders,
    describe_sessions,
    migrate,
    migration_script,
    runs_outside_transaction,
    statements,
    waits_without_limit,
)
from jobpool.sql import migrations

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("statement", [
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_a ON mdm.aa_job (id)",
    "drop index concurrently if exists mdm.ix_a",
    "CREATE UNIQUE INDEX\n    CONCURRENTLY ux_a ON mdm.aa_job (id)",
])
def test_a_concurrent_index_build_waits_as_long_as_it_takes(statement: str) -> None:
    """It blocks no writer while it waits, and one that gave up would leave an invalid
    index behind."""
    assert waits_without_limit(statement)


@pytest.mark.parametrize("statement", [
    "ALTER TABLE mdm.aa_job ADD CONSTRAINT c CHECK (id > 0) NOT VALID",
    "ALTER TABLE mdm.aa_job VALIDATE CONSTRAINT c",
    "DROP INDEX IF EXISTS mdm.ix_concurrently_built",
])
def test_every_other_statement_waits_the_lock_timeout(statement: str) -> None:
    assert not waits_without_limit(statement)


def test_every_index_built_outside_a_transaction_is_built_concurrently() -> None:
    """So no statement of the shipped migrations outside a transaction both waits without a
    limit and blocks writers while it waits."""
    unlimited = [statement for _, _, text in migrations() if runs_outside_transaction(text)
                 for statement in statements(text) if waits_without_limit(statement)]
    assert unlimited
    assert all(" INDEX " in f" {s.upper()} " for s in unlimited)


def test_the_sessions_holding_a_migration_up_are_named_with_what_to_act_on() -> None:
    text = describe_lock_holders([
        {"pid": 4242, "role": "reports", "application_name": "nightly-report",
         "state": "idle in transaction", "open_for": 65.4, "query": "SELECT count(*) FROM x",
         "tables": "aa_job"},
        {"pid": 77, "role": "other", "application_name": "", "state": None, "open_for": None,
         "query": None, "tables": "aa_job, aa_tenant"},
        {"pid": None, "role": None, "application_name": None, "state": None, "open_for": None,
         "query": None, "gid": None, "tables": "aa_job"},
    ])
    assert text.startswith("transactions holding locks on schema mdm: pid 4242 (role reports, "
                           "application 'nightly-report', idle in transaction, transaction "
                           "open 65s, holding aa_job, last query 'SELECT count(*) FROM x'); ")
    assert ("; pid 77 (role other, state not visible to this role, transaction age not "
            "visible, holding aa_job, aa_tenant); ") in text  # another role's, to a non-superuser
    assert text.endswith("; a prepared transaction (`pg_prepared_xacts`: COMMIT PREPARED or "
                         "ROLLBACK PREPARED ends it), holding aa_job")


def test_an_idle_session_is_said_to_have_no_transaction_open() -> None:
    """Another migrator between its tries, as a role that may see it: idle, no transaction
    (not an age this role may not see)."""
    text = describe_sessions([
        {"pid": 5, "role": "deploy", "application_name": "jobpool migrate", "state": "idle",
         "open_for": None, "query": "SELECT pg_try_advisory_lock(1)", "tables": None}])
    assert text == ("pid 5 (role deploy, application 'jobpool migrate', idle, no transaction "
                    "open, last query 'SELECT pg_try_advisory_lock(1)')")


@pytest.mark.parametrize("limits", [
    {"lock_wait": float("nan")}, {"lock_wait": -1.0}, {"lock_timeout": 0.0},
    {"lock_timeout": 0.0004},  # the server would take it as 0 ms: no limit at all
    {"lock_timeout": 3e6}, {"lock_timeout": float("inf")}, {"lock_timeout": float("nan")}])
async def test_wait_limits_out_of_range_are_refused_before_anything_is_sent(
        limits: dict[str, float]) -> None:
    with pytest.raises(ValueError,
                       match=r"0\.001 <= lock_timeout <= 2147483\.647 and lock_wait >= 0"):
        await migrate(cast(Any, None), **limits)  # no connection touched


def test_a_prepared_transaction_is_named_by_its_gid_with_the_statements_that_end_it() -> None:
    text = describe_lock_holders([
        {"pid": None, "role": "batch", "application_name": None, "state": None,
         "open_for": 3600.2, "query": None, "gid": "night's batch", "tables": "aa_job"}])
    assert text.endswith("prepared transaction 'night''s batch' (owner batch, prepared 3600s "
                         "ago: `COMMIT PREPARED 'night''s batch'` or `ROLLBACK PREPARED "
                         "'night''s batch'` ends it), holding aa_job")


def test_no_session_left_holding_a_lock_is_said_so() -> None:
    assert describe_lock_holders([]).startswith(
        "no other transaction of this database older than that holds a lock on schema mdm's "
        "tables or indexes now")


def _printed_migrations(script: str) -> list[str]:
    return [line.split()[1] for line in script.splitlines()
            if line.startswith("-- 0") and "_" in line.split()[1]]


def test_the_printed_script_since_a_version_holds_only_the_later_migrations() -> None:
    versions = [f"{v:04d}_{name}" for v, name, _ in migrations()]
    assert _printed_migrations(migration_script()) == versions
    assert _printed_migrations(migration_script(since=len(versions) - 2)) == versions[-2:]
    latest = migration_script(since=len(versions))
    assert _printed_migrations(latest) == []
    assert "INSERT INTO mdm.aa_job_kind" in latest  # the built-in kinds, as on every run


@pytest.mark.parametrize("since", [-1, 10_000])
def test_a_version_the_release_does_not_have_is_refused_naming_the_latest(since: int) -> None:
    latest = len(migrations())
    with pytest.raises(ValueError, match=f"from 0 to {latest} .* got {since}"):
        migration_script(since=since)


def test_since_without_print_sql_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "--since", "3"]) == 2
    assert "--since goes with --print-sql" in capsys.readouterr().err


def test_migrate_through_a_transaction_pooler_is_refused_before_it_connects(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Its advisory lock and lock timeout live in a session, which such a pooler hands to other
    clients; the printed script needs no connection."""
    monkeypatch.setenv("JOBPOOL_POOLER", "transaction")
    monkeypatch.setenv("JOBPOOL_DSN", "postgresql://nobody@127.0.0.1:1/none")
    assert main(["migrate"]) == 2
    assert "JOBPOOL_DSN straight to PostgreSQL" in capsys.readouterr().err
    assert main(["migrate", "--print-sql", "--since", str(len(migrations()))]) == 0
    assert "INSERT INTO mdm.aa_job_kind" in capsys.readouterr().out


def test_migrate_gives_up_within_the_chart_hooks_deadline() -> None:
    """Half of it: the hook's log says why before Kubernetes stops the hook."""
    values = yaml.safe_load((ROOT / "charts" / "jobpool" / "values.yaml").read_text("utf-8"))
    assert values["migrations"]["activeDeadlineSeconds"] == LOCK_WAIT * 2
