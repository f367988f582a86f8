"""The console pauses a (tenant, kind) pair from the jobs table and resumes it, audited as
the token's subject."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect

from .conftest import Seeded, screenshot, token
from .test_console import sign_in

pytestmark = pytest.mark.browser


def _pause_audit(dsn: str) -> list[tuple[str, str, Any]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT action::text, actor_principal_id, payload FROM mdm.aa_audit_log"
            " WHERE action IN ('work_paused', 'work_resumed') ORDER BY id").fetchall()


def test_pause_a_pair_from_the_jobs_table_and_resume_it(
    page: Any, console: str, dsn: str, seeded: Seeded
) -> None:
    sign_in(page, console, token("oncall@example.com"))
    pair = page.locator("#overview-counts tr[data-pair='acme email_send']")
    pair.get_by_role("button", name="Pause…").click()
    expect(page.locator("#pause-tenant")).to_have_value("acme")
    expect(page.locator("#pause-kind")).to_have_value("email_send")
    page.fill("#pause-reason", "mail provider down")
    page.click("#pause-submit")
    expect(page.locator("#confirm-text")).to_contain_text(
        "Pause tenant acme, kind email_send? Its ready jobs stay pending")
    page.click("#confirm-ok")
    expect(page.locator("#flash")).to_have_text("Paused tenant acme, kind email_send.")
    paused = page.locator("#overview-paused tr[data-pause='tenant acme, kind email_send']")
    expect(paused).to_contain_text("mail provider down")
    expect(paused).to_contain_text("token:oncall@example.com")
    expect(pair.get_by_role("button", name="Resume")).to_be_visible()
    screenshot(page, "paused")

    paused.get_by_role("button", name="Resume").click()
    page.click("#confirm-ok")
    expect(page.locator("#flash")).to_have_text("Resumed tenant acme, kind email_send.")
    expect(page.locator("#overview-paused")).to_contain_text("Nothing is paused.")
    assert [(action, actor, payload["kind"]) for action, actor, payload in _pause_audit(dsn)] == [
        ("work_paused", "token:oncall@example.com", "email_send"),
        ("work_resumed", "token:oncall@example.com", "email_send")]
    page.goto("about:blank")  # no overview refresh once the server stops
