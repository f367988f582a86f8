"""`jobpool demo`: a pool file's lanes on demo email jobs, delivered to a local SMTP server."""

from __future__ import annotations

import argparse
import asyncio
import email
import os
import socket
import uuid
from dataclasses import replace
from typing import Any

from jobpool import admin
from jobpool.cli_arguments import actor_of
from jobpool.core.poolspec import SHIPPED_EXAMPLES, PoolSpec, load_pool_file
from jobpool.core.tenants import tenant_id_of
from jobpool.db.queries import Exec, One
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.settings import Settings

CREATE_TENANT = One("create_tenant")
SUPPRESS_ADDRESS = Exec("suppress_address")

EXAMPLE_POOL = SHIPPED_EXAMPLES / "pool.yaml"
"""The repository's examples/pool.yaml, shipped with the package: `jobpool demo` runs it from
any folder (a test keeps the two copies equal)."""
UNKNOWN_MAILBOX = "nobody@example.com"
"""The one recipient the demo's SMTP server refuses for good (550), so that a job shows the DLQ."""


class PrintingInbox:
    """aiosmtpd handler that prints every message it receives."""

    def __init__(self) -> None:
        self.received = 0

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        if address == UNKNOWN_MAILBOX:
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content)
        self.received += 1
        message_id = " ".join(str(msg["Message-ID"]).split())  # unfold the folded header
        # one write with its newline, so that a log line of another thread cannot land inside it
        print(f"smtp: received {message_id} to {msg['To']}: {msg['Subject']!r}\n", end="",
              flush=True)
        return "250 Message accepted"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def demo_jobs(tenants: dict[str, uuid.UUID], count: int) -> list[NewJob]:
    """`count` welcome emails spread over the tenants, one to a suppressed address and one to
    the mailbox the server refuses (which goes to the DLQ)."""
    keys = sorted(tenants)
    jobs = [
        NewJob(tenants[keys[i % len(keys)]], "email_send",
               {"to": f"user{i}@example.com", "subject": f"Welcome #{i}",
                "text": f"Hello user {i}"})
        for i in range(count)
    ]
    jobs.append(NewJob(tenants[keys[0]], "email_send",
                       {"to": "bounced@example.com", "subject": "Suppressed", "text": "-"}))
    jobs.append(NewJob(tenants[keys[0]], "email_send",
                       {"to": UNKNOWN_MAILBOX, "subject": "Unknown mailbox", "text": "-"}))
    return jobs


def lane_tenant_keys(pool: PoolSpec) -> set[str]:
    """Tenant keys the pool's lanes name (uuids are left out: they must exist already)."""
    return {ref for lane in pool.lanes for ref in lane.tenants if tenant_id_of(ref) is None}


async def seed(conn: Any, pool: PoolSpec, count: int, actor: str) -> None:
    from psycopg.types.json import Jsonb

    tenants: dict[str, uuid.UUID] = {}
    for key in sorted(lane_tenant_keys(pool) | {"acme", "globex"}):
        row = await CREATE_TENANT(conn, {"key": key, "metadata": Jsonb({})})
        assert row is not None  # an upsert returns its row
        tenants[key] = row["id"]
    await SUPPRESS_ADDRESS(conn, {
        "tenant_id": tenants["acme"], "address": "bounced@example.com", "reason": "hard bounce"})
    from jobpool.db.store import register_kinds
    from jobpool.registry import load_kind_modules

    await register_kinds(conn, load_kind_modules().specs())
    results = await enqueue_many(conn, demo_jobs(tenants, count), actor=actor)
    await conn.commit()
    print(f"enqueued {len(results)} email_send jobs for tenants {', '.join(sorted(tenants))}",
          flush=True)


async def report(conn: Any) -> None:
    print("\njob counts (jobpool status):")
    for row in await admin.job_counts(conn):
        print(f"  {row['tenant_key']:<10} {row['job_kind']:<12} {row['status']:<8} {row['jobs']}")
    dead = await admin.list_dlq(conn)
    for row in dead:
        print(f"DLQ: job {row['id']} ({row['job_kind']}): {row['last_error_preview']}")
    print("\nnext: `jobpool dlq list`, `jobpool jobs show ID`, `jobpool status`")


def run_demo(args: argparse.Namespace, settings: Settings, open_db: Any) -> int:
    """Seed demo jobs, run every lane of `args.pool` until empty, print what happened.

    The lanes' processes get the local SMTP server's URL (and the embedded server's DSN) in
    the environment built for them; this process's own stays as it was.
    """
    from aiosmtpd.controller import Controller

    from jobpool.db.connect import resolve_dsn
    from jobpool.worker.supervisor import lane_processes, supervise

    pool = load_pool_file(args.pool or str(EXAMPLE_POOL))
    inbox = PrintingInbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings = replace(settings, smtp_url=f"smtp://127.0.0.1:{port}")
    print(f"smtp: a local SMTP server listens on 127.0.0.1:{port}", flush=True)
    try:
        async def prepare() -> None:
            async with await open_db(settings) as conn:
                await seed(conn, pool, args.emails, actor_of(args))

        asyncio.run(prepare())
        if not settings.dsn:  # the embedded server, started by prepare()
            settings = replace(settings, dsn=resolve_dsn(None, settings.data_dir))
        code = supervise(lane_processes(pool, settings, imports=(), until_empty=True,
                                        metrics_port=0, inherited=os.environ),
                         grace=pool.grace_seconds, until_empty=True)

        async def summary() -> None:
            async with await open_db(settings) as conn:
                await report(conn)

        asyncio.run(summary())
        print(f"smtp: {inbox.received} message(s) delivered")
        return code
    finally:
        controller.stop()
