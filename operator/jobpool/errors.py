"""Errors a caller or a handler sees.

Every exception class jobpool defines derives from `JobpoolError` (a unit test walks the
package to keep it so). Those for a bad value derive from ValueError too, and lookups from
LookupError, so that `except ValueError` also catches them, as it catches the plain
ValueError jobpool raises for a bad argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from jobpool.core.suggestions import did_you_mean


class JobpoolError(Exception):
    """Base of every exception class jobpool defines: `except JobpoolError` catches jobpool's
    own failures, never those of a bug or of a library below it."""


class PermanentError(JobpoolError):
    """Raised by a handler when retrying cannot help: the job goes to the DLQ at once."""


class InvalidPayloadError(PermanentError, ValueError):
    """A payload that does not match its kind's payload model; the message names the field.

    Raised by `enqueue*` (nothing is written), and in the worker before the handler runs: the
    job goes to the DLQ at once, since no retry can change its payload.
    """


class TransactionEndedError(PermanentError):
    """A handler tried to end its job's transaction itself: `tx.commit()`,
    `tx.set_autocommit(True)`, `tx.close()`, `tx.tpc_begin()`, or the COMMIT of a psycopg
    transaction of its own, refused before anything commits; a COMMIT or PREPARE TRANSACTION
    sent as SQL, found after it ran (what the handler wrote before is committed, or
    prepared); statements sent after a ROLLBACK in the same text or pipeline, which ran
    outside the job's transaction and committed on their own; or a COMMIT sent through a
    cursor class of the handler's own, whose answer the worker does not read, found at the
    handler's next statement or its end. The worker commits the job's transaction, with its
    `done`, so that a job is done if and only if its writes committed. A bug of the handler,
    which no retry mends: the job goes to the DLQ at once, also when the handler raised an
    error of its own afterwards (a retry would commit again what it committed apart)."""


class JobEndedError(JobpoolError):
    """A job's `tx`, or a cursor or connection taken from it, used after the job ended (by a
    task its handler started and left running): refused, since the connection went back to
    the worker and may already hold the next job's transaction."""


class NoSessionError(PermanentError):
    """A handler needs a database session that keeps its state across statements (a session
    advisory lock, session settings, CREATE INDEX CONCURRENTLY next to them), and its worker
    connects through a transaction pooler with no direct DSN (`JOBPOOL_LISTEN_DSN`) to open
    one on. No retry mends the worker's configuration: the job goes to the DLQ at once, to be
    retried from there once the lane has that DSN."""


MAX_RETRY_DELAY = 10 * 365 * 86_400.0
"""Seconds (10 years): the longest delay a retry is stored with; PostgreSQL's timestamps end."""


class RetryAfter(JobpoolError):
    """Raised by a handler to retry after `delay` seconds instead of the kind's backoff.

    The delay is cut to 0 .. MAX_RETRY_DELAY (NaN counts as 0), so that whatever a handler
    passes, the retry can be stored. The attempt counts; a job out of attempts still goes
    to the DLQ.
    """

    def __init__(self, delay: float, message: str) -> None:
        super().__init__(message)
        try:
            seconds = float(delay)
        except OverflowError:  # an int beyond float's range, e.g. 10**400
            seconds = math.inf if delay > 0 else 0.0
        self.delay = 0.0 if math.isnan(seconds) else min(max(0.0, seconds), MAX_RETRY_DELAY)


class UnknownKindError(JobpoolError, LookupError):
    """A job kind that no worker has registered."""

    def __init__(self, kind: str, known: Iterable[str] = (), place: str = "") -> None:
        """known: the kinds registered in this process, for a "did you mean" among them (a
        kind of this process that the database lacks is said to be so). place: where the job
        is in a batch, to begin the message ("job 3 of 5 in the batch: ")."""
        known = tuple(known)
        where = (" is registered in this process but not in the database" if kind in known
                 else f"{did_you_mean(kind, known)}: no worker has registered it")
        super().__init__(
            f"{place}unknown job kind {kind!r}{where} (start a worker that "
            "serves it, run `jobpool migrate` where the worker extra is installed for the "
            "built-in kinds, or register yours with `jobpool kinds list --import MODULE`)"
        )
        self.kind = kind


class UnknownTenantError(JobpoolError, LookupError):
    """A tenant key or id that is not in mdm.aa_tenant."""

    def __init__(self, ref: str, known: Iterable[str] = (), place: str = "") -> None:
        """known: tenant keys the caller may see, for a "did you mean" among them. place:
        where the job is in a batch, to begin the message ("job 3 of 5 in the batch: ")."""
        super().__init__(f"{place}unknown tenant {ref!r}{did_you_mean(ref, known)}: no row "
                         "in mdm.aa_tenant has that key or id")
        self.ref = ref


class JobStateError(JobpoolError):
    """An admin action that the job's status does not allow (e.g. replay of a pending job)."""


class JobNotFoundError(JobpoolError, LookupError):
    """No job with that id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class DatabaseUnavailableError(JobpoolError):
    """The embedded PostgreSQL could not be started (bad data folder, no permission, ...)."""


class ConnectionBudgetError(JobpoolError):
    """The database lets a worker open too few connections for even one slot (the role's
    CONNECTION LIMIT or the server's max_connections); the message names the limit and the
    need."""


class SchemaNotMigratedError(JobpoolError):
    """The database lacks the jobpool schema, or an older version of it."""


class MigrationLockError(JobpoolError):
    """A migration gave up: the locks it needs stayed held by other transactions for longer
    than `jobpool migrate` waits (the message names those sessions). It is not recorded as
    applied: a migration in one transaction left nothing, one outside a transaction may have
    done some of its steps, each safe to do again. Run `jobpool migrate` again once those
    transactions ended. Also raised, before any migration, when another session held the
    migration lock (it applies the same migrations) for that long."""


class SchemaPrivilegeError(SchemaNotMigratedError):
    """The worker's role may not execute the schema's functions a writing job ends with.

    A kind of SchemaNotMigratedError because a worker treats both alike: it waits, not ready,
    naming the problem, and starts once a migration or a GRANT fixed it; every writing job's
    `done` would be refused meanwhile."""


class AttachmentNotFoundError(JobpoolError, LookupError):
    """No attachment with that id for that tenant."""


class FetchError(JobpoolError):
    """An attachment's bytes could not be read this time (not there yet, store unavailable).

    Raised by a fetcher (`jobpool.register_fetcher`) for a failure worth
    retrying: the virus_scan job retries with backoff; raise PermanentError for one that is
    not.
    """
