"""Registries of a test's own, and the context of a job made by hand."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg

from jobpool import settings
from jobpool.job import Job, JobContext
from jobpool.registry import REGISTRY, Registry
from jobpool.settings import Settings

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ROW: dict[str, Any] = {
    "id": 1, "tenant_id": uuid.UUID(int=1), "job_kind": "x", "payload": {}, "status": "running",
    "priority": 100, "available_at": NOW, "created_at": NOW, "claimed_by": "w",
    "claimed_at": NOW, "attempts": 1, "max_attempts": 1, "last_error": None,
    "idempotency_key": None, "extra": 0}


def test_a_registry_of_a_tests_own_is_apart_from_the_process_one() -> None:
    own = Registry()

    @own.kind("context_isolated", max_attempts=2)
    async def handler(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
        return None

    async def fetch(uri: str) -> AsyncIterator[bytes]:
        yield b""

    own.register_fetcher("S3", fetch)

    @own.cleanup_step("context_isolated")
    async def step(tx: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        return {}

    assert own.get("context_isolated").defaults.max_attempts == 2
    assert dict(own.fetchers()) == {"s3": fetch}
    assert own.steps() == (("context_isolated", step),)
    assert REGISTRY.find("context_isolated") is None
    assert "s3" not in REGISTRY.fetchers()
    assert "context_isolated" not in dict(REGISTRY.steps())
    copy = REGISTRY.copy()
    copy.register_fetcher("s3", fetch)
    assert "s3" not in REGISTRY.fetchers()
    assert copy.names() == REGISTRY.names()


def test_a_job_made_by_hand_runs_in_the_default_context_not_the_process_settings() -> None:
    previous = settings.current()
    settings.configure(replace(previous, service_account="process-wide", smtp_from="a@b.c"))
    try:
        job = Job.from_row(ROW)
    finally:
        settings.configure(previous)
    assert job.context == JobContext()
    assert job.context.actor == "jobpool-worker"
    assert job.context.settings == Settings()
    assert job.context.registry is REGISTRY
    given = JobContext(actor="svc", registry=Registry())
    assert Job.from_row(ROW, given).context is given
    assert replace(job, context=given) == job  # the context is no part of the row
