"""How a batch of NewJobs becomes the enqueue statements' columns (no database needed)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from jobpool.db.queries import Many, One
from jobpool.enqueue import NewJob, _Batch
from jobpool.errors import UnknownKindError

ENQUEUE_JOBS = Many("enqueue_jobs")
ENQUEUE_UNKEYED_JOBS = One("enqueue_unkeyed_jobs")

TENANT = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
WHEN = datetime(2030, 1, 1, tzinfo=UTC)


def test_a_batch_without_keys_takes_the_plain_insert_and_sends_no_empty_columns() -> None:
    batch = _Batch([NewJob(TENANT, "k_one", {"n": 1}), NewJob(str(TENANT), "k_two")])
    query, params = batch.statement([0, 1], None, True)
    assert query == ENQUEUE_UNKEYED_JOBS.text
    assert "ON CONFLICT" not in query
    assert json.loads(params["payloads"]) == [{"n": 1}, {}]
    assert params["tenant_ids"] == f"{TENANT},{TENANT}"
    assert params["kinds"] == "k_one,k_two"
    assert params["priorities"] is None and params["available_at"] is None
    assert params["max_attempts"] is None and "idempotency_keys" not in params


def test_a_later_round_sends_only_the_pending_jobs_columns() -> None:
    """The keyed jobs whose key's holder vanished go again, each with its own fields."""
    jobs = [NewJob(TENANT, "k_one", {"n": 0}, priority=1),
            NewJob(TENANT, "k_two", {"n": 1}, idempotency_key="a", available_at=WHEN),
            NewJob(TENANT, "k_one", {"n": 2}),
            NewJob(TENANT, "k_three", {"n": 3}, idempotency_key="b", max_attempts=4)]
    batch = _Batch(jobs)
    query, params = batch.statement([1, 3], "me", False)
    assert query == ENQUEUE_JOBS.text
    assert json.loads(params["payloads"]) == [{"n": 1}, {"n": 3}]
    assert params["kinds"] == "k_two,k_three"
    assert params["priorities"] == [None, None]
    assert params["available_at"] == [WHEN, None]
    assert params["max_attempts"] == [None, 4]
    assert params["idempotency_keys"] == ["a", "b"]
    assert (params["actor"], params["notify"]) == ("me", False)


def test_the_first_job_at_fault_is_named() -> None:
    good = NewJob(TENANT, "k_one")
    with pytest.raises(ValueError, match=r"job 2 of 3 in the batch: idempotency_key of a job "
                                         r"of kind k_one contains a NUL"):
        _Batch([good, NewJob(TENANT, "k_one", idempotency_key="a\x00"),
                NewJob("nope", "k_one")])
    with pytest.raises(ValueError, match=r"job 2 of 3 in the batch: tenant_id must be a UUID"):
        _Batch([good, NewJob("nope", "k_one"), NewJob(TENANT, "Bad")])
    with pytest.raises(ValueError, match="tenant_id must be a UUID, got"):
        _Batch([good, NewJob(["unhashable"], "k_one")])  # type: ignore[arg-type]
    with pytest.raises(UnknownKindError, match="'Bad'"):
        _Batch([good, NewJob(TENANT, "Bad"), NewJob("nope", "k_one")])


def test_both_enqueue_statements_audit_and_notify_alike() -> None:
    """The audit row per job and the NOTIFY per kind are written once, in two statements:
    they must not drift apart."""

    def audit_and_notify(query: str) -> str:
        return query[query.index("), audited AS ("):query.rindex("\nSELECT")]  # the last one

    unkeyed = ENQUEUE_UNKEYED_JOBS.text
    keyed = ENQUEUE_JOBS.text
    assert "'job_enqueued'" in audit_and_notify(unkeyed)
    assert "pg_notify('jobpool', job_kind)" in audit_and_notify(unkeyed)
    assert audit_and_notify(unkeyed) == audit_and_notify(keyed)


def test_a_batch_whose_payloads_together_pass_what_jsonb_holds_is_refused_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each payload passes alone, the batch's one JSON array does not: refused before anything
    is sent (the server would abort the caller's transaction), telling to split it. The limit
    is lowered here (its own size is tested in test_jsondata.py)."""
    monkeypatch.setattr("jobpool.core.jsondata.MAX_JSONB_BYTES", 1000)
    _Batch([NewJob(TENANT, "k_one", {"t": "x" * 900})])
    with pytest.raises(ValueError) as caught:
        _Batch([NewJob(TENANT, "k_one", {"t": "x" * 600}) for _ in range(2)])
    assert str(caught.value).startswith(
        "cannot enqueue the 2 jobs in one batch: their payloads together are more JSON than "
        "one jsonb value holds (payloads is 1,222 bytes of JSON, more than the 1,000")
    assert str(caught.value).endswith("; enqueue them in smaller batches")
    with pytest.raises(ValueError, match=r"job 2 of 2 in the batch: payload of a job of kind "
                                         r"k_one is refused: payload is 1,009 bytes of JSON"):
        _Batch([NewJob(TENANT, "k_one"), NewJob(TENANT, "k_one", {"t": "x" * 1000})])
