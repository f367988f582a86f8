"""Typed payloads: checked at enqueue (nothing written) and in the worker (DLQ naming the field)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
import psycopg
import pytest
from psycopg.types.json import Jsonb

import jobpool
from integration.helpers import scalar
from jobpool import testing
from jobpool.job import Job

Conn = psycopg.AsyncConnection[dict[str, Any]]


class Line(msgspec.Struct, frozen=True):
    sku: str
    cents: Annotated[int, msgspec.Meta(ge=0)]


class Invoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    invoice_id: Annotated[int, msgspec.Meta(ge=1)]
    lines: list[Line]
    currency: str = "EUR"


@jobpool.kind("tp_invoice", payload=Invoice)
async def invoice(job: Job, tx: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    """Sum the typed lines; the handler sees an `Invoice`, never raw JSON."""
    assert isinstance(job.payload, Invoice)
    return {"total": sum(line.cents for line in job.payload.lines),
            "currency": job.payload.currency}


async def test_a_typed_payload_reaches_the_handler_as_its_model(
    dsn: str, tenant: uuid.UUID
) -> None:
    run = await testing.run_job(dsn, "tp_invoice", {"invoice_id": 7, "lines": [
        {"sku": "a", "cents": 250}, {"sku": "b", "cents": 100}]}, tenant="acme")
    assert (run.status, run.result) == ("done", {"total": 350, "currency": "EUR"})


async def test_an_instance_of_the_model_is_enqueued_as_its_json(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await testing.register_kinds(conn)
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="tp_invoice",
                                payload=Invoice(7, [Line("a", 1)]))
    assert await scalar(conn, "SELECT payload FROM mdm.aa_job WHERE id = %s", (job.id,)) == {
        "invoice_id": 7, "lines": [{"sku": "a", "cents": 1}], "currency": "EUR"}


@pytest.mark.parametrize(("payload", "named"), [
    ({"lines": []}, "missing required field `payload.invoice_id`"),
    ({"invoice_id": 7, "lines": [{"sku": "a", "cents": -1}]}, "`payload.lines[0].cents`"),
    ({"invoice_id": "7", "lines": []}, "Expected `int`, got `str` - at `payload.invoice_id`"),
    ({"invoice_id": 7, "lines": [], "cc": 1}, "unknown field `payload.cc`"),
])
async def test_enqueue_refuses_a_payload_that_does_not_match_and_writes_nothing(
    conn: Conn, tenant: uuid.UUID, payload: dict[str, Any], named: str
) -> None:
    await testing.register_kinds(conn)
    with pytest.raises(jobpool.InvalidPayloadError) as caught:
        await jobpool.enqueue(conn, tenant_id=tenant, kind="tp_invoice", payload=payload)
    assert named in str(caught.value) and "tp_invoice" in str(caught.value)
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0


async def test_the_worker_sends_a_payload_that_does_not_match_to_the_dlq_at_once(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """A row written past `enqueue` (plain SQL) is checked before the handler runs."""
    await testing.register_kinds(conn)
    await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts)"
        " VALUES (%s, 'tp_invoice', %s, 3)",
        (tenant, Jsonb({"invoice_id": 0, "lines": []})))
    assert await testing.drain(dsn, kinds=["tp_invoice"]) == {"dlq": 1}
    [job] = await testing.enqueued(conn, kind="tp_invoice")
    assert (job.status, job.attempts) == ("dlq", 1)
    assert job.last_error == (
        "InvalidPayloadError: payload of job kind 'tp_invoice' is invalid: "
        "Expected `int` >= 1 - at `payload.invoice_id`")


def test_a_payload_model_must_be_a_struct() -> None:
    with pytest.raises(TypeError, match=r"msgspec\.Struct"):
        jobpool.kind("tp_untyped", payload=dict)  # type: ignore[arg-type]
