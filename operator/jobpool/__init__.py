"""jobpool: a PostgreSQL-backed pool of background workers.

Public API: `kind` (register a handler), `enqueue` / `enqueue_many` (async, on the
caller's connection), `enqueue_sync` / `enqueue_many_sync`, `NewJob`, `Enqueued`, `Job`,
and the errors (README "Errors"): `JobpoolError`, the base of them all; `PermanentError`
and `RetryAfter`, raised by handlers; `UnknownKindError`, `UnknownTenantError`,
`JobNotFoundError`, `JobStateError`, `AttachmentNotFoundError`, `FetchError`,
`WebhookVerificationError`, `DatabaseUnavailableError`, `SchemaNotMigratedError`.
They, `jobpool.outbox` and `jobpool.attachments` need no extra: `pip install jobpool` is enough
(README "Install").
"""

from jobpool.core.webhooks import WebhookVerificationError
from jobpool.enqueue import Enqueued, NewJob, enqueue, enqueue_many, enqueue_many_sync, enqueue_sync
from jobpool.errors import (
    AttachmentNotFoundError,
    DatabaseUnavailableError,
    FetchError,
    JobNotFoundError,
    JobpoolError,
    JobStateError,
    PermanentError,
    RetryAfter,
    SchemaNotMigratedError,
    UnknownKindError,
    UnknownTenantError,
)
from jobpool.job import Job
from jobpool.registry import kind

__all__ = [
    "AttachmentNotFoundError", "DatabaseUnavailableError", "Enqueued", "FetchError", "Job",
    "JobNotFoundError", "JobStateError", "JobpoolError", "NewJob", "PermanentError",
    "RetryAfter", "SchemaNotMigratedError", "UnknownKindError", "UnknownTenantError",
    "WebhookVerificationError", "enqueue", "enqueue_many", "enqueue_many_sync", "enqueue_sync",
    "kind",
]
