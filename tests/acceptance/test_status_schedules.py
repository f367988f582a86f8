"""`jobpool status` shows each schedule's last and next run, as text and as JSON."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from integration.helpers import prepare

from acceptance.cli import jobpool as cli
from jobpool.core.schedules import cleanup_schedule, parse_schedule
from jobpool.worker.scheduler import Declarations, declare, enqueue_due_ticks

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def test_status_shows_the_last_and_next_run_of_every_schedule(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    nightly = parse_schedule({"name": "nightly", "kind": "test_noop", "tenant": "acme",
                              "cron": "0 3 * * *", "timeZone": "Europe/Berlin"}, "s")
    await declare(conn, Declarations("mdm-jobs", (cleanup_schedule(300), nightly), retire=True))
    last_tick = nightly.previous_tick(datetime.now(UTC))  # missed: caught up once
    await conn.execute("UPDATE mdm.aa_schedule SET next_run_at = %s WHERE name = 'nightly'",
                       (last_tick,))
    [run] = [r for r in await enqueue_due_ticks(conn, actor="t") if r.name == "nightly"]
    assert run.created == 1

    document = json.loads(cli(dsn, "status", "--json").stdout)
    shown = {s["name"]: s for s in document["schedules"]}
    assert sorted(shown) == ["cleanup_jobs", "nightly"]
    assert shown["nightly"]["last_job_id"] == run.job_ids[0]
    assert shown["nightly"]["last_run_at"] is not None
    assert shown["nightly"]["next_run_at"] > shown["nightly"]["last_run_at"]
    assert (shown["cleanup_jobs"]["expression"], shown["cleanup_jobs"]["owner"]) == (
        "every 300s", "")

    text = cli(dsn, "status").stdout
    assert "schedules (times in UTC)" in text
    [line] = [line for line in text.splitlines() if line.startswith("nightly ")]
    assert "0 3 * * * (Europe/Berlin)" in line and " (in " in line


async def test_the_schedules_of_a_pool_that_is_gone_are_retired_by_a_person(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """A deleted pool's schedules stayed for good (no worker of it retires them any more, and
    every worker of the database enqueued their ticks): `jobpool schedules retire` deletes
    them, audited, and never a built-in one or another pool's."""
    await prepare(conn)
    mine = [parse_schedule({"name": name, "kind": "test_noop", "tenant": "acme",
                            "every": 3600}, "s") for name in ("hourly-a", "hourly-b")]
    other = parse_schedule({"name": "theirs", "kind": "test_noop", "tenant": "acme",
                            "every": 600}, "s")
    await declare(conn, Declarations("mdm/gone", (cleanup_schedule(300), *mine), retire=True))
    await declare(conn, Declarations("mdm/other", (other,), retire=True))
    await conn.commit()
    text = cli(dsn, "status").stdout
    [line] = [line for line in text.splitlines() if line.startswith("hourly-a ")]
    assert " mdm/gone " in line

    retired = cli(dsn, "schedules", "retire", "mdm/gone", "--actor", "carol")
    assert retired.stdout.strip() == "retired 2 schedule(s) of pool mdm/gone: hourly-a, hourly-b"
    left = {s["name"]: s["owner"] for s in json.loads(cli(dsn, "status", "--json").stdout)[
        "schedules"]}
    assert left == {"cleanup_jobs": "", "theirs": "mdm/other"}
    cur = await conn.execute("SELECT actor_principal_id AS actor, payload FROM mdm.aa_audit_log"
                             " WHERE action = 'schedules_retired'")
    [audit] = await cur.fetchall()
    assert audit["actor"] == "user:carol"
    assert audit["payload"]["owner"] == "mdm/gone"
    assert sorted(audit["payload"]["schedules"]) == ["hourly-a", "hourly-b"]

    again = cli(dsn, "schedules", "retire", "mdm/gone", check=False)
    assert again.returncode == 2
    assert ("pool 'mdm/gone' owns no schedule (pools that own schedules: mdm/other (1); the "
            "built-in ones belong to no pool)") in again.stderr
    builtin = cli(dsn, "schedules", "retire", "", check=False)
    assert builtin.returncode == 2
    cur = await conn.execute("SELECT count(*)::int AS n FROM mdm.aa_schedule"
                             " WHERE name = 'cleanup_jobs'")
    assert await cur.fetchone() == {"n": 1}
