"""jobpool: a PostgreSQL-backed pool of background workers.

Public API: `kind` (register a handler), `enqueue` / `enqueue_many` (async, on the
caller's connection), `enqueue_sync` / `enqueue_many_sync`, `NewJob`, `Enqueued`, `Job`,
and the errors `PermanentError`, `RetryAfter`, `UnknownKindError`, `UnknownTenantError`.
They, `jobpool.outbox` and `jobpool.attachments` need no extra: `pip install jobpool` is enough
(README "Install").
"""

from jobpool.enqueue import Enqueued, NewJob, enqueue, enqueue_many, enqueue_many_sync, enqueue_sync
from jobpool.errors import (
    JobNotFoundError,
    JobpoolError,
    JobStateError,
    PermanentError,
    RetryAfter,
    UnknownKindError,
    UnknownTenantError,
)
from jobpool.job import Job
from jobpool.registry import kind

__all__ = [
    "Enqueued", "Job", "JobNotFoundError", "JobStateError", "JobpoolError", "NewJob",
    "PermanentError", "RetryAfter", "UnknownKindError", "UnknownTenantError", "enqueue",
    "enqueue_many", "enqueue_many_sync", "enqueue_sync", "kind",
]
