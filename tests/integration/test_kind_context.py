"""A worker's handlers audit as the worker's actor and read the worker's own settings
(`job.context`), never the process-wide ones: through `jobpool.testing`, through `Worker`
and through `jobpool run`."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobpool
from integration.helpers import add_tenant
from integration.test_outbox_dispatch import LOOPBACK, Receiver, Reply, _serve
from jobpool import settings, testing
from jobpool.cli import main
from jobpool.job import Job
from jobpool.registry import REGISTRY, Registry
from jobpool.settings import Settings
from jobpool.worker.config import WorkerConfig
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async for served in _serve("127.0.0.1"):
        yield served


@pytest.fixture
def process_wide(dsn: str) -> Iterator[Settings]:
    """Process-wide settings that no worker below is given: an actor of their own and an
    allow-list that opens loopback."""
    previous = settings.current()
    chosen = replace(previous, dsn=dsn, service_account="process-wide",
                     webhook_allow_networks=LOOPBACK)
    settings.configure(chosen)
    yield chosen
    settings.configure(previous)


async def _gone_event(conn: Conn, tenant: uuid.UUID, receiver: Receiver, path: str) -> None:
    """A subscription whose receiver answers 410, and an event for it (its fan-out job
    enqueued by the outbox trigger)."""
    await jobpool.subscribe_webhook(conn, tenant_id=tenant, url=receiver.answer(path, Reply(410)),
                                    event_types=["order.paid"])
    await jobpool.publish_event(conn, tenant_id=tenant, event_type="order.paid",
                                payload={"order": 1})


async def _actors(conn: Conn, tenant: uuid.UUID, action: str) -> list[str]:
    cur = await conn.execute(
        "SELECT actor_principal_id FROM mdm.aa_audit_log WHERE tenant_id = %s"
        " AND action = %s::mdm.audit_action ORDER BY id", (tenant, action))
    return [row["actor_principal_id"] for row in await cur.fetchall()]


async def _enqueued_by(conn: Conn, tenant: uuid.UUID, kind: str) -> list[str]:
    """Who enqueued the tenant's jobs of `kind`, by their `job_enqueued` audit rows."""
    cur = await conn.execute(
        "SELECT a.actor_principal_id FROM mdm.aa_audit_log a JOIN mdm.aa_job j ON j.id = a.job_id"
        " WHERE a.tenant_id = %s AND a.action = 'job_enqueued' AND j.job_kind = %s"
        "   AND j.payload ? 'delivery_id' ORDER BY a.id", (tenant, kind))
    return [row["actor_principal_id"] for row in await cur.fetchall()]


async def test_jobpool_testing_runs_the_handlers_as_its_own_actor(
    conn: Conn, dsn: str, receiver: Receiver, process_wide: Settings
) -> None:
    tenant = await add_tenant(conn, "acme")
    await _gone_event(conn, tenant, receiver, "/gone")
    assert await testing.drain(dsn, kinds=["outbox_dispatch"]) == {"done": 2}
    # the fan-out's follow-up job and the 410's deactivation are the handlers' writes
    assert await _enqueued_by(conn, tenant, "outbox_dispatch") == [testing.ACTOR]
    assert await _actors(conn, tenant, "webhook_disabled") == [testing.ACTOR]


async def test_two_workers_in_one_process_keep_their_actor_and_settings(
    conn: Conn, dsn: str, receiver: Receiver, process_wide: Settings
) -> None:
    """Worker A may reach loopback receivers, worker B (like the defaults) may not; the
    process-wide settings, which allow loopback, are neither's."""
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    await _gone_event(conn, a, receiver, "/a")
    await _gone_event(conn, b, receiver, "/b")

    def worker(tenant: str, actor: str, allow: str | None) -> Worker:
        config = WorkerConfig(kinds=("outbox_dispatch",), tenants=(tenant,), until_empty=True,
                              poll_interval=0.2)
        own = Settings(dsn=dsn, service_account=f"{actor}-setting", webhook_allow_networks=allow)
        return Worker(dsn, REGISTRY, config, actor=actor, settings=own)

    for _ in range(3):  # an until-empty worker may stop before its follow-up job is due
        await asyncio.gather(worker("a", "svc-a", LOOPBACK).run(),
                             worker("b", "svc-b", None).run())
    assert receiver.paths() == ["/a"]
    assert await _enqueued_by(conn, a, "outbox_dispatch") == ["svc-a"]
    assert await _actors(conn, a, "webhook_disabled") == ["svc-a"]
    assert await _enqueued_by(conn, b, "outbox_dispatch") == ["svc-b"]
    [refused] = await testing.enqueued(conn, tenant=b, kind="outbox_dispatch", status="dlq")
    assert refused.last_error is not None and "127.0.0.1" in refused.last_error


def test_jobpool_run_audits_as_its_service_account(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fan-out's follow-up job is the handler's write (its receiver, which nothing
    serves here, is never reached: the delivery waits for a retry)."""

    async def prepare() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            tenant = await add_tenant(conn, "acme")
            await jobpool.subscribe_webhook(conn, tenant_id=tenant, url="http://127.0.0.1:9/x",
                                            event_types=["order.paid"])
            await jobpool.publish_event(conn, tenant_id=tenant, event_type="order.paid",
                                        payload={"order": 1})
            return tenant

    async def enqueued_by(tenant: uuid.UUID) -> list[str]:
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
            return await _enqueued_by(conn, tenant, "outbox_dispatch")

    tenant = asyncio.run(prepare())
    previous = settings.current()
    monkeypatch.setenv("JOBPOOL_DSN", dsn)
    monkeypatch.setenv("JOBPOOL_SERVICE_ACCOUNT", "svc-cli")
    try:
        assert main(["run", "--until-empty", "--kinds", "outbox_dispatch", "--metrics-port",
                     "0", "--poll-interval", "0.2"]) == 0
    finally:
        settings.configure(previous)
    assert asyncio.run(enqueued_by(tenant)) == ["svc-cli"]


async def test_jobpool_testing_runs_a_registry_and_settings_of_the_tests_own(
    conn: Conn, dsn: str, tenant: uuid.UUID, process_wide: Settings
) -> None:
    own = Registry()

    @own.kind("context_probe")
    async def probe(job: Job, tx: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
        return {"actor": job.context.actor, "from": job.context.settings.smtp_from,
                "kinds": job.context.registry.names()}

    chosen = Settings(smtp_from="probe@example.com")
    run = await testing.run_job(dsn, "context_probe", tenant="acme", registry=own,
                                settings=chosen)
    assert run.result == {"actor": testing.ACTOR, "from": "probe@example.com",
                          "kinds": ["context_probe"]}
    assert REGISTRY.find("context_probe") is None
    await jobpool.enqueue(conn, tenant_id=tenant, kind="context_probe")
    assert await testing.drain(dsn, registry=own) == {"done": 1}


async def test_the_example_of_the_docs_page_runs(dsn: str, tenant: uuid.UUID) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "job-context.md").read_text("utf-8")
    [block] = re.findall(r"^```python\n(.*?)^```$", page, flags=re.S | re.M)
    example: dict[str, Any] = {}
    exec(compile(block, "docs/job-context.md", "exec"), example)
    await example["test_a_greeting_names_who_sent_it"](dsn)
    assert REGISTRY.find("greeting") is None
