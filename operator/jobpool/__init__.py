"""jobpool: a PostgreSQL-backed pool of background workers.

Public API, all on the base install (`pip install jobpool`, README "Install"):
- kinds and jobs: `kind` (register a handler), `enqueue` / `enqueue_many` (async, on the
  caller's connection), `enqueue_sync` / `enqueue_many_sync`, `NewJob`, `Enqueued`, `Job`;
- webhooks (docs/integration-kinds.md): `publish_event` / `publish_event_sync` (an outbox
  event in the caller's transaction), `subscribe_webhook`, `PublishedEvent`, `Subscription`, and for
  a receiver `verify_webhook`;
- attachments (docs/integration-kinds.md): `commit_upload` / `commit_upload_sync`,
  `Upload`, `CommittedUpload`, `register_fetcher`;
- the errors (docs/writing-kinds.md, "Errors"): `JobpoolError`, the base of them all;
  `PermanentError` and `RetryAfter`, raised by handlers; `InvalidPayloadError`, `UnknownKindError`,
  `UnknownTenantError`, `JobNotFoundError`, `JobStateError`, `AttachmentNotFoundError`,
  `FetchError`, `WebhookVerificationError`, `DatabaseUnavailableError`, `SchemaNotMigratedError`
  (and its `SchemaPrivilegeError`), `ConnectionBudgetError`, `MigrationLockError`,
  `NoSessionError`.
"""

from jobpool.enqueue import Enqueued, NewJob, enqueue, enqueue_many, enqueue_many_sync, enqueue_sync
from jobpool.errors import (
    AttachmentNotFoundError,
    ConnectionBudgetError,
    DatabaseUnavailableError,
    FetchError,
    InvalidPayloadError,
    JobEndedError,
    JobNotFoundError,
    JobpoolError,
    JobStateError,
    MigrationLockError,
    NoSessionError,
    PermanentError,
    RetryAfter,
    SchemaNotMigratedError,
    SchemaPrivilegeError,
    TransactionEndedError,
    UnknownKindError,
    UnknownTenantError,
)
from jobpool.job import Job
from jobpool.kinds.attachments.uploads import (
    CommittedUpload,
    Upload,
    commit_upload,
    commit_upload_sync,
)
from jobpool.kinds.webhooks.outbox import (
    PublishedEvent,
    Subscription,
    publish_event,
    publish_event_sync,
    subscribe_webhook,
)
from jobpool.kinds.webhooks.signing import WebhookVerificationError, verify_webhook
from jobpool.registry import kind, register_fetcher

__all__ = [
    "AttachmentNotFoundError", "CommittedUpload", "ConnectionBudgetError",
    "DatabaseUnavailableError", "Enqueued", "FetchError", "InvalidPayloadError", "Job",
    "JobEndedError", "JobNotFoundError", "JobStateError", "JobpoolError", "MigrationLockError",
    "NewJob", "NoSessionError", "PermanentError",
    "PublishedEvent", "RetryAfter", "SchemaNotMigratedError", "SchemaPrivilegeError",
    "Subscription", "TransactionEndedError", "UnknownKindError", "UnknownTenantError", "Upload",
    "WebhookVerificationError", "commit_upload", "commit_upload_sync", "enqueue", "enqueue_many",
    "enqueue_many_sync", "enqueue_sync", "kind", "publish_event", "publish_event_sync",
    "register_fetcher", "subscribe_webhook", "verify_webhook",
]
