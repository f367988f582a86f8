"""The operations console in headless Chromium, against a real `jobpool api` and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect

from .conftest import Seeded, screenshot, token

pytestmark = pytest.mark.browser


def sign_in(page: Any, console: str, bearer: str) -> None:
    page.goto(console)
    page.fill("#token", bearer)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#who")).to_be_visible()


def audit_rows(dsn: str, job_id: int) -> list[tuple[str, str, Any]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT action::text, actor_principal_id, payload "
                            "FROM mdm.aa_audit_log WHERE job_id = %s ORDER BY id",
                            (job_id,)).fetchall()


def job_status(dsn: str, job_id: int) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT status::text FROM mdm.aa_job WHERE id = %s",
                           (job_id,)).fetchone()
    return row[0] if row else None


def dlq_row(page: Any, job_id: int) -> Any:
    return page.locator(f"#dlq-table tr[data-job='{job_id}']")


def test_sign_in_replay_a_dlq_job_and_see_its_audit_row(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    sign_in(page, console, token("oncall@example.com"))
    expect(page.locator("#who-scope")).to_have_text("all tenants")
    counts = page.locator("#overview-counts")
    expect(counts).to_contain_text("email_send")
    expect(page.locator("#overview-lanes")).to_contain_text("bulk_import, reindex")
    expect(page.locator("#overview-limits")).to_contain_text("5/s, burst 10")
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("sessionStorage.getItem('jobpool.token')")
    assert "eyJ" not in page.url
    screenshot(page, "overview")

    page.click("#nav-dlq")
    bounced = seeded.ids["bounced"]
    row = dlq_row(page, bounced)
    expect(row).to_contain_text("SMTP 550 5.1.1")
    expect(row).to_contain_text("acme")
    expect(row).to_contain_text("email_send")
    screenshot(page, "dlq")

    row.get_by_role("button", name="Replay").click()
    dialog = page.locator("#confirm")
    expect(dialog).to_be_visible()
    expect(page.locator("#confirm-text")).to_contain_text(
        f"Replay job #{bounced}? It goes back to pending with attempts 0")
    screenshot(page, "confirm")
    page.click("#confirm-ok")
    expect(page.locator("#flash")).to_have_text(f"Replayed job #{bounced}.")
    expect(row).to_have_count(0)
    assert job_status(dsn, bounced) == "pending"

    page.goto(f"{console}#/jobs/{bounced}")
    history = page.locator("#job-body tr[data-action='job_replay']")
    expect(history).to_contain_text("oncall@example.com")
    expect(page.locator("#job-title")).to_contain_text("pending")
    screenshot(page, "job")
    replays = [(actor, payload["tenant_scope"]) for action, actor, payload
               in audit_rows(dsn, bounced) if action == "job_replay"]
    assert replays == [("token:oncall@example.com", "*")]


def test_a_payload_with_markup_shows_as_text_and_never_runs(
    page: Any, console: str, seeded: Seeded
) -> None:
    sign_in(page, console, token())
    hostile = seeded.ids["hostile"]
    page.goto(f"{console}#/dlq")
    expect(dlq_row(page, hostile)).to_contain_text("rejected: <html><script>")
    page.goto(f"{console}#/jobs/{hostile}")
    payload = page.locator("#job-body details.json pre")
    expect(payload).to_contain_text('"subject": "<script>window.pwned = 1</script><img src=x')
    expect(page.locator("#job-body pre.error-text")).to_contain_text("<script>alert(1)</script>")
    assert page.locator("#injected").count() == 0
    assert page.locator("#job-body script, #job-body img, #job-body b").count() == 0
    assert page.evaluate("window.pwned") is None


@pytest.mark.parametrize(("bearer", "refusal"), [
    (token("viewer@example.com", permissions=("read_metadata",)),
     "Refused: token of 'viewer@example.com' lacks the permission 'manage_metadata'"),
    (token("legacy@example.com", tenants=None),
     "Refused: token of 'legacy@example.com' lacks the 'tenants' claim"),
])
def test_a_token_without_the_permission_or_scope_sees_the_refusal(
    page: Any, console: str, dsn: str, seeded: Seeded, bearer: str, refusal: str
) -> None:
    page.goto(console)
    page.fill("#token", bearer)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text(refusal)
    expect(page.locator("#nav")).to_be_hidden()
    page.goto(f"{console}#/dlq")
    expect(page.locator("#view-dlq")).to_be_hidden()
    if "manage_metadata" in refusal:
        screenshot(page, "refused")
    assert job_status(dsn, seeded.ids["bounced"]) == "dlq"


def test_a_tenant_scoped_token_sees_and_changes_only_its_tenant(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    sign_in(page, console, token("admin@globex.example", tenants=["globex"]))
    expect(page.locator("#who-scope")).to_have_text("tenants: globex")
    counts = page.locator("#overview-counts")
    expect(counts).to_contain_text("globex")
    expect(counts).not_to_contain_text("acme")
    expect(page.locator("#overview-limits")).to_contain_text("No tenant sets a rate limit")
    expect(page.locator("#overview-lanes")).not_to_contain_text("acme")

    page.goto(f"{console}#/dlq")
    expect(dlq_row(page, seeded.ids["import"])).to_be_visible()
    expect(page.locator("#dlq-table tbody tr")).to_have_count(1)

    bounced = seeded.ids["bounced"]  # acme's
    page.goto(f"{console}#/jobs/{bounced}")
    expect(page.locator("#job-body")).to_contain_text(f"no job with id {bounced}")
    expect(page.locator("#job-actions button")).to_have_count(0)
    page.goto(f"{console}#/dlq?tenant=acme")
    expect(page.locator("#dlq-table")).to_contain_text("unknown tenant 'acme'")
    assert job_status(dsn, bounced) == "dlq"

    page.goto(f"{console}#/dlq")
    dlq_row(page, seeded.ids["import"]).get_by_role("button", name="Discard").click()
    page.click("#confirm-ok")
    expect(page.locator("#flash")).to_have_text(f"Discarded job #{seeded.ids['import']}.")
    discards = [(actor, payload["tenant_scope"]) for action, actor, payload
                in audit_rows(dsn, seeded.ids["import"]) if action == "job_discard"]
    assert discards == [("token:admin@globex.example", ["globex"])]


def test_select_several_jobs_filter_and_discard_them(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    sign_in(page, console, token())
    page.click("#nav-dlq")
    expect(page.locator("#dlq-table tbody tr")).to_have_count(3)
    page.fill("#dlq-tenant", "acme")
    page.click("#dlq-filter button[type=submit]")
    expect(page.locator("#dlq-table tbody tr")).to_have_count(2)
    assert "tenant=acme" in page.url
    page.check("#dlq-table thead input[type=checkbox]")
    expect(page.locator("#dlq-discard-selected")).to_have_text("Discard selected (2)")
    page.click("#dlq-discard-selected")
    ids = sorted((seeded.ids["bounced"], seeded.ids["hostile"]))
    expect(page.locator("#confirm-text")).to_contain_text(
        f"Discard 2 jobs (#{ids[0]}, #{ids[1]})? Each is deleted for good")
    page.click("#confirm-cancel")
    assert [job_status(dsn, i) for i in ids] == ["dlq", "dlq"]
    page.click("#dlq-discard-selected")
    page.click("#confirm-ok")
    expect(page.locator("#flash")).to_have_text(f"Discarded 2 jobs (#{ids[0]}, #{ids[1]}).")
    expect(page.locator("#dlq-table")).to_contain_text("The DLQ is empty for this filter.")
    assert [job_status(dsn, i) for i in ids] == [None, None]


def test_stop_a_running_job_from_its_detail_page(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    sign_in(page, console, token())
    running = seeded.ids["running"]
    page.goto(f"{console}#/jobs/{running}")
    expect(page.locator("#job-body")).to_contain_text("jobpool-default-7d9f/1/3f2a")
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#confirm-text")).to_contain_text(
        "a worker running it now interrupts its handler and its writes are rolled back")
    page.click("#confirm-ok")
    expect(page.locator("#job-title")).to_contain_text("failed")
    expect(page.locator("#job-body tr[data-action='job_stop']")).to_be_visible()
    assert job_status(dsn, running) == "failed"


def test_the_overview_refreshes_by_itself(page: Any, console: str, dsn: str,
                                          seeded: Seeded) -> None:
    sign_in(page, console, token())
    globex = page.locator("#overview-counts tr", has_text="bulk_import")
    expect(globex).to_contain_text(re.compile(r"globex\s*bulk_import\s*0"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE mdm.aa_job SET status = 'pending', attempts = 0, "
                     "completed_at = NULL WHERE id = %s", (seeded.ids["import"],))
    expect(globex).to_contain_text(re.compile(r"globex\s*bulk_import\s*1\s*1"), timeout=15_000)
    page.goto(f"{console}#/dlq")
    page.reload()
    expect(page.locator("#who")).to_be_visible()  # the token outlives a reload in this tab
    page.click("#sign-out")
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('jobpool.token')") is None


def test_the_dlq_pages_by_keyset(page: Any, console: str, dsn: str, seeded: Seeded) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, status, attempts, "
            "max_attempts, completed_at, last_error) SELECT %s, 'email_send', "
            "jsonb_build_object('n', g), 'dlq', 3, 3, now(), 'bounce ' || g "
            "FROM generate_series(1, 50) g", (seeded.tenants["acme"],))
    sign_in(page, console, token())
    page.goto(f"{console}#/dlq")
    rows = page.locator("#dlq-table tbody tr")
    expect(rows).to_have_count(50)
    expect(page.locator("#dlq-first")).to_be_hidden()
    first_page = rows.locator("td:nth-child(2)").all_text_contents()
    page.click("#dlq-next")
    expect(rows).to_have_count(3)  # 53 DLQ jobs in all
    expect(page.locator("#dlq-next")).to_be_hidden()
    second_page = rows.locator("td:nth-child(2)").all_text_contents()
    assert not set(first_page) & set(second_page)
    page.click("#dlq-first")
    expect(rows).to_have_count(50)
