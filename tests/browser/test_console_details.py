"""The console's details are exact: DLQ age, whole errors and snapshots, every attempt in a
job's history, who acted, aligned numbers, times with their zone."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect

from .conftest import Seeded, token
from .test_console import dlq_row, sign_in

pytestmark = pytest.mark.browser

ZONED = re.compile(r"\d{1,2}:\d{2}:\d{2}\s*(AM|PM)?\s*(UTC|GMT([+-]\d{1,2}(:\d{2})?)?|[A-Z]{2,5})$")
"""A time as the console writes it: the browser's locale, then the zone's short name."""


def test_dlq_age_counts_from_entering_the_dlq_and_numbers_align_with_headers(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    """"Age" counted from the job's creation (2 h here), not from its move to the DLQ."""
    bounced = seeded.ids["bounced"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE mdm.aa_job SET created_at = now() - interval '2 hours', "
                     "completed_at = now() - interval '7 minutes' WHERE id = %s", (bounced,))
    sign_in(page, console, token())
    page.goto(f"{console}#/dlq")
    row = dlq_row(page, bounced)
    age = row.locator("td").nth(6)
    expect(age).to_have_text(re.compile(r"^7 min \d+ s$"))
    assert "in the DLQ since" in (age.get_attribute("title") or "")
    headers = page.locator("#dlq-table thead th")
    for column in (4, 6):  # Attempts, In the DLQ for
        expect(headers.nth(column)).to_have_css("text-align", "right")
        expect(row.locator("td").nth(column)).to_have_css("text-align", "right")
    expect(headers.nth(5)).to_have_css("text-align", "left")
    page.goto(f"{console}#/overview")
    counts = page.locator("#overview-counts thead th")
    expect(counts.nth(2)).to_have_text("Pending")
    expect(counts.nth(2)).to_have_css("text-align", "right")
    expect(page.locator("#overview-counts tbody td").nth(2)).to_have_css("text-align", "right")


def test_a_long_error_opens_whole_and_a_preview_is_marked_as_cut(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    """The last error was cut at 200 characters without a mark; the DLQ list now sends a
    preview of 500 characters with the whole length and a flag."""
    bounced, hostile = seeded.ids["bounced"], seeded.ids["hostile"]
    long_error = "SMTP 451 4.7.0 greylisted " + "x" * 400 + " END-OF-ERROR"
    longer_error = "SMTP 554 rejected " + "y" * 2000
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE mdm.aa_job SET last_error = %s WHERE id = %s",
                     (long_error, bounced))
        conn.execute("UPDATE mdm.aa_job SET last_error = %s WHERE id = %s",
                     (longer_error, hostile))
    sign_in(page, console, token())
    page.goto(f"{console}#/dlq")
    cell = dlq_row(page, bounced).locator("td.error-text")
    expect(cell.locator("summary")).to_contain_text("SMTP 451 4.7.0 greylisted")
    expect(cell.locator("pre")).to_be_hidden()
    cell.locator("summary").click()
    expect(cell.locator("pre")).to_have_text(long_error)
    expect(cell.locator(".cut")).to_have_count(0)
    cut = dlq_row(page, hostile).locator("td.error-text")
    cut.locator("summary").click()
    expect(cut.locator(".cut")).to_contain_text(
        f"Cut at 500 of {len(seeded_error(dsn, hostile)):,} characters: job #{hostile}")


def seeded_error(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT last_error FROM mdm.aa_job WHERE id = %s",
                           (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_history_shows_every_attempt_who_acted_and_a_whole_snapshot(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    """History showed job_enqueued and job_dlq, not the attempts between them; a discard's
    snapshot was cut mid-value; actors did not say whether a person or a machine acted."""
    job = seeded.ids["import"]
    tenant = seeded.tenants["globex"]
    big = {"rows": ["r" * 40 for _ in range(30)], "last": "END-OF-SNAPSHOT"}
    rows = [
        ("system:serviceaccount:mdm:jobpool-worker", "job_retry",
         {"kind": "bulk_import", "error": "row 17: attribute 'price' must be a number",
          "attempt": 1, "delay_seconds": 30.0}),
        ("system:serviceaccount:mdm:jobpool-worker", "job_dlq",
         {"kind": "bulk_import", "last_error": "row 17: still not a number", "attempts": 2}),
        ("user:alice@ops-1", "job_replay", {"tenant_scope": "*"}),
        ("token:admin@globex.example", "job_discard", big),
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for actor, action, payload in rows:
            conn.execute("INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, "
                         "action, payload) VALUES (%s, %s, %s, %s, %s::jsonb)",
                         (actor, tenant, job, action, json.dumps(payload)))
    sign_in(page, console, token())
    page.goto(f"{console}#/jobs/{job}")
    history = page.locator("#job-body table").last
    retry = history.locator("tr[data-action='job_retry']")
    expect(retry).to_contain_text(
        "Attempt 1 failed; retried in 30 s: row 17: attribute 'price' must be a number")
    expect(retry).to_contain_text("jobpool-worker")
    expect(retry.locator(".badge")).to_have_text("service account")
    expect(history.locator("tr[data-action='job_dlq']")).to_contain_text(
        "Attempt 2 failed; moved to the DLQ: row 17: still not a number")
    replay = history.locator("tr[data-action='job_replay']")
    expect(replay.locator("td.actor")).to_have_text("alice@ops-1 person")
    discard = history.locator("tr[data-action='job_discard']")
    expect(discard.locator("td.actor")).to_have_text("admin@globex.example token")
    discard.locator("summary").click()
    expect(discard.locator("pre")).to_contain_text('"last": "END-OF-SNAPSHOT"')
    when = retry.locator("td").first
    expect(when).to_have_text(ZONED)
    assert (when.get_attribute("title") or "").endswith("Z")
    expect(page.locator("#job-body dl.fields dd").nth(5)).to_have_text(ZONED)  # Created
