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
