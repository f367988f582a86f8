"""A real `jobpool api` process on a fresh database, and headless Chromium driven by Playwright.

Chromium is Debian's (`apt-get install chromium`; `.ci/run` installs it), never a browser
downloaded by `playwright install`: set JOBPOOL_CHROMIUM to use another binary. Tests here
are skipped, naming the reason, where it is absent.

With JOBPOOL_SCREENSHOTS=1 the tests write the screenshots of docs/console.md to docs/console/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import psycopg
import pytest
from ports import free_port
from psycopg.rows import dict_row

from jobpool.db.queries import Exec
from jobpool.db.store import kind_rows
from jobpool.enqueue import NewJob, enqueue_many_sync
from jobpool.registry import load_kind_modules

REGISTER_KINDS = Exec("register_kinds")

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "console"
CHROMIUM = os.environ.get("JOBPOOL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
AUDIENCE = "jobpool-admin"
SECRET = "browser-tests-secret-browser-tests-secret"
KINDS = ("email_send", "outbox_dispatch", "bulk_import")


def token(sub: str = "oncall@example.com", *, tenants: Any = "*",
          permissions: tuple[str, ...] = ("manage_metadata",)) -> str:
    """A token the API under test accepts; tenants None leaves the claim out."""
    claims: dict[str, Any] = {"sub": sub, "aud": AUDIENCE, "exp": int(time.time()) + 3600,
                              "permissions": list(permissions)}
    if tenants is not None:
        claims["tenants"] = tenants
    return jwt.encode(claims, SECRET, algorithm="HS256")


@dataclass
class Seeded:
    """The jobs the tests start from, by name."""

    ids: dict[str, int]
    tenants: dict[str, uuid.UUID]


@pytest.fixture
def seeded(dsn: str) -> Seeded:
    """Two tenants and their jobs: three in the DLQ, one ready, one waiting, one running.

    Synchronous: Playwright's synchronous API keeps an event loop of its own in this thread.
    """
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        registry = load_kind_modules()
        REGISTER_KINDS.sync(conn, kind_rows([registry.get(kind) for kind in KINDS]))
        tenants: dict[str, uuid.UUID] = {}
        for key, metadata in (("acme", '{"rate_limit": {"email_send": {"rps": 5, "burst": 10}}}'),
                              ("globex", "{}")):
            cur = conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES "
                                     "(%s, %s::jsonb) RETURNING id", (key, metadata))
            row = cur.fetchone()
            assert row is not None
            tenants[key] = row["id"]
        specs = [
            ("bounced", "acme", "email_send",
             {"to": "ada@example.com", "subject": "Welcome", "text": "Hello"},
             "dlq", "SMTP 550 5.1.1 <ada@example.com>: mailbox unavailable"),
            ("hostile", "acme", "email_send",
             {"to": "eve@example.com",
              "subject": "<script>window.pwned = 1</script><img src=x id=injected>",
              "text": "<b>not bold</b>"},
             "dlq", "SMTP 554 5.7.1 rejected: <html><script>alert(1)</script></html>"),
            ("import", "globex", "bulk_import", {"import_job_id": 42},
             "dlq", "row 17: attribute 'price' must be a number"),
            ("ready", "acme", "email_send",
             {"to": "bob@example.com", "subject": "Hi", "text": "Hello"}, "pending", None),
            ("later", "acme", "email_send",
             {"to": "cy@example.com", "subject": "Hi", "text": "Hello"}, "waiting", None),
            ("running", "globex", "outbox_dispatch", {"event_id": 7}, "running", None),
        ]
        made = enqueue_many_sync(conn, [NewJob(tenants[t], kind, payload)
                                         for _, t, kind, payload, _, _ in specs])
        ids = {spec[0]: job.id for spec, job in zip(specs, made, strict=True)}
        for name, _, _, _, state, error in specs:
            if state == "dlq":
                conn.execute(
                    "UPDATE mdm.aa_job SET status = 'dlq', attempts = max_attempts, "
                    "completed_at = now(), last_error = %s, "
                    "created_at = now() - interval '2 hours' WHERE id = %s", (error, ids[name]))
            elif state == "waiting":
                conn.execute("UPDATE mdm.aa_job SET available_at = now() + "
                                   "interval '40 seconds' WHERE id = %s", (ids[name],))
            elif state == "running":
                conn.execute(
                    "UPDATE mdm.aa_job SET status = 'running', attempts = 1, "
                    "claimed_by = 'jobpool-default-7d9f/1/3f2a', claimed_at = now(), "
                    "heartbeat_at = now() WHERE id = %s", (ids[name],))
        conn.execute("UPDATE mdm.aa_job SET available_at = now() - interval '75 seconds' "
                           "WHERE id = %s", (ids["ready"],))
        return Seeded(ids, tenants)


@pytest.fixture
def console(dsn: str, seeded: Seeded) -> Iterator[str]:
    """`jobpool api --pool examples/pool.yaml` on a free port; yields the console's URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBPOOL_")}
    env.update(JOBPOOL_DSN=dsn, JOBPOOL_API_JWT_SECRET=SECRET,
               JOBPOOL_API_JWT_AUDIENCE=AUDIENCE)
    process = subprocess.Popen(
        [sys.executable, "-m", "jobpool", "api", "--host", "127.0.0.1", "--port", str(port),
         "--pool", str(REPO / "examples" / "pool.yaml")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    output = process.communicate()[0]
                    raise AssertionError(f"jobpool api did not start:\n{output}") from None
                time.sleep(0.1)
        yield f"{base}/console/"
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture(scope="module")
def chromium(template_db: str) -> Iterator[Any]:
    """The browser, once per module: Playwright's synchronous API runs an event loop in this
    thread while it is open, which would stop later tests from starting theirs (so it is
    closed with the module, and opened after the template database, which asyncio.run
    makes)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set "
                    "JOBPOOL_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh tab (its own sessionStorage); fails the test on any page error or CSP report."""
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on("console", lambda msg: problems.append(f"console: {msg.text}")
           if msg.type == "error" and "status of 40" not in msg.text else None)
    yield tab
    context.close()
    assert problems == []


def screenshot(page: Any, name: str) -> None:
    """Write docs/console/<name>.png when JOBPOOL_SCREENSHOTS=1 (docs/console.md's pictures)."""
    if os.environ.get("JOBPOOL_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
