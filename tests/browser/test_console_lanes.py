"""The console explains a backlog that does not move: a real worker holds every slot of its
lane with long jobs while another kind's ready jobs age."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from playwright.sync_api import expect

from jobpool.enqueue import NewJob, enqueue_many_sync

from .conftest import REPO, Seeded, screenshot, token
from .test_console import sign_in

pytestmark = pytest.mark.browser

SLOTS = 4
WAITING = 149


def _until(what: str, check: Any, timeout: float = 60.0) -> Any:
    """The first truthy value of `check()`; the deadline only bounds a hung test."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.1)
    return value


def _one(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def default_lane_worker(dsn: str, seeded: Seeded) -> Iterator[str]:
    """`jobpool run` as the lane `default` of pool mdm-jobs with 4 slots for globex's
    slow_report and email_send jobs; yields its worker id once it has registered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    env.update(JOBPOOL_DSN=dsn, JOBPOOL_POOL="mdm-jobs", JOBPOOL_LANE="default",
               PYTHONPATH=os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "jobpool", "run", "--import", "browser.report_kinds",
         "--kinds", "slow_report,email_send", "--tenants", "globex", "--slots", str(SLOTS),
         "--grace", "1", "--metrics-port", "0", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    def registered() -> Any:
        if process.poll() is not None:
            pytest.fail(f"jobpool run exited:\n{process.communicate()[0]}")
        return _one(dsn, "SELECT worker_id FROM mdm.aa_worker WHERE lane = 'default'")

    try:
        worker_id = _until("the worker's registration", registered)
        yield str(worker_id)
    finally:
        process.terminate()
        process.wait(30)


def test_the_overview_says_why_a_lanes_backlog_does_not_move(
    page: Any, console: str, dsn: str, seeded: Seeded, default_lane_worker: str
) -> None:
    globex = seeded.tenants["globex"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        slow = enqueue_many_sync(conn, [NewJob(globex, "slow_report", {"seconds": 3600},
                                               priority=1) for _ in range(SLOTS)])
    _until("every slot busy with slow_report", lambda: _one(
        dsn, "SELECT count(*) = %s FROM mdm.aa_job WHERE status = 'running' "
        "AND claimed_by = %s", (SLOTS, default_lane_worker)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE mdm.aa_job SET claimed_at = now() - interval '4 minutes' "
                     "WHERE id = ANY(%s)", ([job.id for job in slow],))
        waiting = enqueue_many_sync(conn, [
            NewJob(globex, "email_send", {"to": f"u{n}@example.com", "subject": "Hi",
                                          "text": "Hello"}) for n in range(WAITING)])
        conn.execute("UPDATE mdm.aa_job SET available_at = now() - interval '6 minutes' "
                     "WHERE id = ANY(%s)", ([job.id for job in waiting],))

    sign_in(page, console, token())
    stuck = page.locator("#overview-stuck li[data-lane='default']")
    expect(stuck).to_have_text(
        f"default: all {SLOTS} slots busy with slow_report for 4 min; globex email_send: "
        f"{WAITING} ready, the oldest waiting 6 min", timeout=20_000)
    expect(stuck.locator("code")).to_have_text("slow_report")
    lane = page.locator("#overview-lanes tr[data-lane='default']")
    expect(lane).to_contain_text(f"{SLOTS} of {SLOTS}")
    expect(lane.locator("td").nth(2)).to_have_text("1")       # live workers
    expect(lane.locator("td").nth(4)).to_have_text("0")       # free slots
    expect(lane.locator("td").nth(9)).to_have_text(
        re.compile(r"6 min \d+ s \(globex email_send\)"))
    running = page.locator("#overview-running tbody tr", has_text="slow_report")
    expect(running).to_have_count(SLOTS)
    for row in running.all():
        expect(row).to_contain_text("globex")
        expect(row).to_contain_text("default")
        expect(row).to_contain_text(default_lane_worker)
        expect(row).to_contain_text("4 min")
    # the seeded job whose holder never registered is marked so
    expect(page.locator("#overview-running tr", has_text="outbox_dispatch")).to_contain_text(
        "(not live)")
    worker = page.locator(f"#overview-workers tr[data-worker='{default_lane_worker}']")
    expect(worker).to_contain_text(f"{SLOTS} of {SLOTS}")
    expect(worker).to_contain_text("slow_report, email_send")
    screenshot(page, "lanes")
    page.goto("about:blank")  # no refresh may call the API once the fixtures stop it
