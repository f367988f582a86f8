"""The job a handler receives, and the context it runs in."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from operator import itemgetter
from typing import Any

from jobpool.registry import REGISTRY, Registry
from jobpool.settings import Settings

DEFAULT_ACTOR: str = Settings().service_account
"""The audit principal of a job built by hand, without a worker: the workers' default."""


@dataclass(frozen=True)
class JobContext:
    """What a handler works with besides `tx`, given by the worker that runs it.

    actor: the audit principal of what the handler writes (the worker's own; `jobpool run`:
        JOBPOOL_SERVICE_ACCOUNT, `jobpool.testing`: its `ACTOR`).
    settings: the worker's settings (SMTP, clamd, the attachment file root, the networks
        webhooks may reach, ...): a handler reads them here, never from the process-wide
        ones, so that two workers in one process each keep their own.
    registry: the worker's registry (its kinds, maintenance steps and attachment fetchers).

    Handlers reach other connections through these and `tx`: SMTP and clamd through the
    settings, object stores through the registry's fetchers, the database apart from the
    job's transaction through `jobpool.db.connect.open_side_connection(tx, ...)`. Built once
    per worker and shared by its jobs: it is immutable. A `Job` made by hand (a unit test
    calling a handler) gets `JobContext()`: the default actor and settings, not the
    environment's, and the process's registry.
    """

    actor: str = DEFAULT_ACTOR
    settings: Settings = field(default_factory=Settings, repr=False)
    registry: Registry = field(default_factory=lambda: REGISTRY, repr=False)


@dataclass(frozen=True)
class Job:
    """A claimed row of `mdm.aa_job`, one attribute per column, and the context it runs in.

    `attempts` counts this run (the claim increments it); `payload` is the decoded jsonb;
    `context` is the running worker's (`JobContext`).
    """

    id: int
    tenant_id: uuid.UUID
    job_kind: str
    payload: Any
    status: str
    priority: int
    available_at: datetime
    created_at: datetime
    claimed_by: str
    claimed_at: datetime
    attempts: int
    max_attempts: int
    last_error: str | None
    idempotency_key: str | None
    context: JobContext = field(default_factory=JobContext, repr=False, compare=False,
                                kw_only=True)

    @classmethod
    def from_row(cls, row: dict[str, Any], context: JobContext | None = None) -> Job:
        """Build from a `claim_jobs` row (extra columns are ignored), run in `context`
        (None: `JobContext()`).

        The fields go into the new job's `__dict__` in one call: a frozen dataclass's
        `__init__` sets each of its 15 fields through `object.__setattr__`, a cost the worker
        would pay per claimed job."""
        job = cls.__new__(cls)
        values = job.__dict__
        values.update(zip(COLUMNS, _columns(row), strict=True))
        values["context"] = JobContext() if context is None else context
        return job


COLUMNS = tuple(item.name for item in fields(Job) if item.name != "context")
"""The fields of Job that are columns of `mdm.aa_job`."""

_columns = itemgetter(*COLUMNS)
"""A row's values in the order of Job's columns (one C call per job instead of a dict build)."""
