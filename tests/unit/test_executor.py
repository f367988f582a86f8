"""The executor's outcomes for handlers that never touch `tx`, on fakes of its protocols.

A handler's SQL in its transaction, the commit and the session reset run against
PostgreSQL in tests/integration (test_lifecycle.py, test_job_data.py, test_outages.py);
here each outcome an attempt can have without a statement is driven on purpose.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest

import jobpool
from jobpool.core.kinds import KindDefaults
from jobpool.db.store import Completion
from jobpool.errors import PermanentError
from jobpool.job import Job
from jobpool.metrics import WorkerMetrics
from jobpool.registry import KindSpec
from jobpool.worker.completer import ResultRefused
from jobpool.worker.executor import LOGGED_RESULT_LIMIT, JobExecutor, logged_result, refused_done
from jobpool.worker.slot_connections import SlotConnections
from jobpool.worker.token_store import TokenStore

T = TypeVar("T")


class FakeStore:
    """Records each outcome write; `held` False: this worker lost the claim."""

    pool: Any = None

    def __init__(self) -> None:
        self.writes: list[tuple[str, int, dict[str, Any]]] = []
        self.held = True

    async def complete(self, conn: Any, job_id: int, attempts: int, result: str | None) -> bool:
        raise AssertionError("a handler that sent nothing has nothing to commit with")

    async def committed_done(self, job_id: int, attempts: int) -> bool:
        raise AssertionError("not reached without a commit")

    async def retry(self, job_id: int, attempts: int, *, delay: float, error: str) -> bool:
        self.writes.append(("retry", job_id, {"delay": delay, "error": error}))
        return self.held

    async def dead_letter(self, job_id: int, attempts: int, *, error: str) -> bool:
        self.writes.append(("dlq", job_id, {"error": error}))
        return self.held

    async def release(self, job_id: int, attempts: int, *, delay: float = 0.0) -> bool:
        self.writes.append(("release", job_id, {"delay": delay}))
        return self.held


class Writer:
    async def write(self, write: Callable[[], Awaitable[T]]) -> T:
        return await write()


class Batch:
    def __init__(self, held: bool = True) -> None:
        self.completions: list[Completion] = []
        self.held = held

    async def complete(self, completion: Completion) -> bool:
        self.completions.append(completion)
        return self.held


class Leases:
    def __init__(self) -> None:
        self.finishing_ids: list[int] = []

    def finishing(self, job_id: int) -> None:
        self.finishing_ids.append(job_id)


def job(payload: Any = None, *, attempts: int = 1, max_attempts: int = 3) -> Job:
    now = datetime.now(UTC)
    return Job(id=7, tenant_id=uuid.uuid4(), job_kind="k", payload={} if payload is None
               else payload, status="running", priority=0, available_at=now, created_at=now,
               claimed_by="w", claimed_at=now, attempts=attempts, max_attempts=max_attempts,
               last_error=None, idempotency_key=None)


def executor(handler: Any, store: FakeStore, batch: Batch | None = None,
             leases: Leases | None = None) -> JobExecutor:
    spec = KindSpec("k", handler, KindDefaults(timeout=5.0))
    return JobExecutor(store, writer=Writer(), completer=batch or Batch(),
                       slot_connections=SlotConnections(1), leases=leases or Leases(),
                       limiter=TokenStore(), specs={"k": spec},
                       wake=asyncio.Event(), metrics=WorkerMetrics(), rng=random.Random(1))


async def test_a_handler_that_sent_nothing_is_done_through_the_batch() -> None:
    async def handler(j: Job, tx: Any) -> dict[str, int]:
        return {"n": 1}

    store, batch, leases = FakeStore(), Batch(), Leases()
    assert await executor(handler, store, batch, leases).execute(job()) == "done"
    assert batch.completions == [Completion(7, 1, '{"n": 1}')]
    assert leases.finishing_ids == [7] and store.writes == []


async def test_a_batched_done_whose_claim_was_lost_is_a_lost_claim() -> None:
    async def handler(j: Job, tx: Any) -> None:
        return None

    assert await executor(handler, FakeStore(), Batch(held=False)).execute(job()) == "lost_claim"


async def test_a_failed_attempt_is_retried_with_the_kinds_backoff() -> None:
    async def handler(j: Job, tx: Any) -> None:
        raise RuntimeError("the mail server did not answer")

    store = FakeStore()
    ex = executor(handler, store)
    assert await ex.execute(job()) == "retry"
    [(what, job_id, args)] = store.writes
    assert (what, job_id) == ("retry", 7) and args["delay"] > 0
    assert args["error"] == "RuntimeError: the mail server did not answer"


async def test_a_permanent_error_or_the_last_attempt_goes_to_the_dlq() -> None:
    async def permanent(j: Job, tx: Any) -> None:
        raise jobpool.PermanentError("no such address")

    async def failing(j: Job, tx: Any) -> None:
        raise RuntimeError("again")

    store = FakeStore()
    assert await executor(permanent, store).execute(job()) == "dlq"
    assert await executor(failing, store).execute(job(attempts=3, max_attempts=3)) == "dlq"
    assert [what for what, _, _ in store.writes] == ["dlq", "dlq"]


async def test_a_payload_that_is_no_object_goes_to_the_dlq_without_running_the_handler() -> None:
    async def handler(j: Job, tx: Any) -> None:
        raise AssertionError("not run")

    store = FakeStore()
    assert await executor(handler, store).execute(job(payload=[1, 2])) == "dlq"
    assert store.writes == [("dlq", 7, {"error": "PermanentError: payload must be a JSON "
                                                 "object, got array"})]


async def test_a_lost_connection_under_the_handler_hands_the_job_back_uncounted() -> None:
    async def handler(j: Job, tx: Any) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    store = FakeStore()
    assert await executor(handler, store).execute(job()) == "released"
    assert store.writes == [("release", 7, {"delay": 0.0})]


async def test_a_failure_whose_claim_was_lost_is_not_recorded() -> None:
    async def handler(j: Job, tx: Any) -> None:
        raise RuntimeError("boom")

    store = FakeStore()
    store.held = False
    assert await executor(handler, store).execute(job()) == "lost_claim"


async def test_a_handler_that_would_stop_the_worker_fails_its_attempt_instead() -> None:
    async def handler(j: Job, tx: Any) -> None:
        raise SystemExit(3)

    store = FakeStore()
    assert await executor(handler, store).execute(job()) == "retry"
    assert store.writes[0][2]["error"] == (
        "HandlerExit: handler raised SystemExit: 3; a handler must not stop the worker")


async def test_a_cancelled_attempt_is_handed_back_and_the_cancellation_goes_on() -> None:
    started = asyncio.Event()

    async def handler(j: Job, tx: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    store = FakeStore()
    ex = executor(handler, store)
    ex.releasing = True  # the grace period is over
    task = asyncio.create_task(ex.execute(job()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.writes == [("release", 7, {"delay": 0.0})]


def test_a_refused_done_is_read_by_what_refused_it() -> None:
    """A role the handler left refuses the done for good (the DLQ, with the reason); the
    worker's own role without EXECUTE on the done's function is an operator's GRANT away, so
    that job is retried; a value the column refuses is the result's fault."""
    left_role = psycopg.errors.InsufficientPrivilege("permission denied for table aa_job")
    assert isinstance(refused_done(left_role), PermanentError)
    no_grant = psycopg.errors.InsufficientPrivilege(
        "permission denied for function aa_job_done")
    assert refused_done(no_grant) is no_grant
    assert isinstance(refused_done(psycopg.errors.CheckViolation("no")), ResultRefused)
    lost = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    assert refused_done(lost) is lost


def test_a_large_result_is_logged_cut() -> None:
    """A result of megabytes is stored whole; its log line is not."""
    shown = logged_result({"x": "y" * 5_000_000})
    assert len(shown) == LOGGED_RESULT_LIMIT and shown.startswith("{'x': 'yyy")
    assert shown.endswith("…[truncated]")
    assert logged_result({"ok": 1}) == "{'ok': 1}"
