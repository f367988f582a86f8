"""The Quickstart's own-email step, as the README gives it: a mail server from aiosmtpd, one
job enqueued, the pool run until empty, the job shown by the id `enqueue` printed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
from integration.helpers import prepare
from ports import free_port

from acceptance.cli import REPO, env
from acceptance.cli import jobpool as cli

Conn = psycopg.AsyncConnection[dict[str, Any]]
PAYLOAD = '{"to": "you@example.com", "subject": "hi", "text": "hello"}'


def test_the_readme_gives_these_commands() -> None:
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for command in (
        "python -m aiosmtpd -n -l 127.0.0.1:8025",
        f"ID=$(jobpool enqueue email_send --tenant acme --payload '{PAYLOAD}'"
        " | awk '{print $2}')",
        "JOBPOOL_SMTP_URL=smtp://127.0.0.1:8025 jobpool run examples/pool.yaml --until-empty",
        'jobpool jobs show "$ID"',
    ):
        assert command in quickstart, command


async def test_an_email_of_your_own_reaches_the_mail_server(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await conn.commit()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "aiosmtpd", "-n", "-l", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env(None))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.1)
        enqueued = cli(dsn, "enqueue", "email_send", "--tenant", "acme", "--payload", PAYLOAD)
        job_id = enqueued.stdout.split()[1]  # what `awk '{print $2}'` takes
        cli(dsn, "run", "examples/pool.yaml", "--until-empty", "--metrics-port", "0",
            JOBPOOL_SMTP_URL=f"smtp://127.0.0.1:{port}", timeout=180)
        shown = json.loads(cli(dsn, "jobs", "show", job_id, "--json").stdout)
        assert shown["status"] == "done", shown
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "Subject: hi" in output and "To: you@example.com" in output, output
