"""Import batches: each one commits its entities, row outcomes and progress marker together.

The worker gives bulk_import one transaction, but an import must keep its
progress across a crash. So batches commit on a side connection, each in its own transaction
that also moves `aa_import_job.last_line`; a batch is either wholly committed with its marker
or not at all, and a retry continues after the marker. The job's transaction only marks the
import done (with the job's `done`). Upserts on the external key make even a repeated batch
harmless. The marker row is locked per batch and the job's claim checked, so two workers that
both believe they own the job cannot interleave.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from jobpool.db.failures import primary_message, refuses_value
from jobpool.db.queries import Exec, Many, One
from jobpool.errors import JobpoolError
from jobpool.job import Job
from jobpool.kinds.entities.attributes import AttributeSpec, DataType, UnknownKeys
from jobpool.kinds.imports.batch_plan import (
    MAX_BATCH_CHARS,
    BatchPlan,
    Entity,
    RowStatus,
    StagedRow,
    plan_batch,
)

ADVANCE_IMPORT = Exec("advance_import")
ENTITY_TYPE_ATTRIBUTES = Many("entity_type_attributes")
IMPORT_JOB_FOR_RUN = One("import_job_for_run")
LOCK_IMPORT_PROGRESS = One("lock_import_progress")
MARK_IMPORT_ROWS = Exec("mark_import_rows")
NEXT_IMPORT_ROWS = Many("next_import_rows")
UPSERT_ENTITIES = Many("upsert_entities")

log = logging.getLogger(__name__)

Conn = AsyncConnection[dict[str, Any]]


class ImportClaimLostError(JobpoolError):
    """The job no longer holds its claim; another run owns the import now."""


@dataclass(frozen=True)
class ImportSpec:
    """An import job and its entity type's attributes, read once at the start of a run."""

    id: int
    tenant_id: uuid.UUID
    entity_type_id: int
    type_key: str
    key_field: str
    unknown_keys: UnknownKeys
    status: str
    attributes: dict[str, AttributeSpec]
    searchable: frozenset[str] = frozenset()

    @property
    def search_keys(self) -> list[str]:
        """The searchable attributes, in key order (as reindex uses them)."""
        return sorted(self.searchable)


@dataclass(frozen=True)
class BatchCounts:
    """What one committed batch did."""

    last_line: int
    inserted: int
    updated: int
    unchanged: int
    rejected: int


def attribute_spec(row: dict[str, Any]) -> AttributeSpec:
    """An AttributeSpec from an `entity_type_attributes` row."""
    values = row["enum_values"]
    return AttributeSpec(row["attr_key"], cast(DataType, row["data_type"]), row["required"],
                         tuple(values) if values is not None else None)


async def load_import(side: Conn, import_job_id: int, tenant_id: uuid.UUID) -> ImportSpec | None:
    """The import job of this tenant with its type's attributes, or None."""
    job = await IMPORT_JOB_FOR_RUN(side,
                             {"id": import_job_id, "tenant_id": tenant_id})
    if job is None:
        return None
    rows = await ENTITY_TYPE_ATTRIBUTES(side,
                             {"entity_type_id": job["entity_type_id"]})
    return ImportSpec(
        id=job["id"], tenant_id=job["tenant_id"], entity_type_id=job["entity_type_id"],
        type_key=job["type_key"], key_field=job["key_field"],
        unknown_keys=cast(UnknownKeys, job["unknown_keys"]), status=job["status"],
        attributes={row["attr_key"]: attribute_spec(row) for row in rows},
        searchable=frozenset(row["attr_key"] for row in rows if row["searchable"]),
    )


async def _upsert(side: Conn, spec: ImportSpec, chunk: list[Entity]) -> tuple[int, int]:
    written = await UPSERT_ENTITIES(side, {
        "tenant_id": spec.tenant_id, "entity_type_id": spec.entity_type_id,
        "search_keys": spec.search_keys,
        "external_keys": [e.external_key for e in chunk],
        "attributes": [Jsonb(e.attributes) for e in chunk],
    })
    inserted = sum(1 for row in written if row["inserted"])
    return inserted, len(written) - inserted


async def _upsert_one_by_one(side: Conn, spec: ImportSpec, chunk: list[Entity],
                             plan: BatchPlan) -> tuple[int, int]:
    """Fallback when the database refuses a chunk: reject only the rows it refuses."""
    inserted = updated = 0
    for entity in chunk:
        try:
            async with side.transaction():
                one_inserted, one_updated = await _upsert(side, spec, [entity])
        except psycopg.Error as exc:
            if not refuses_value(exc):
                raise
            plan.reject(entity.line_no, None,
                        f"line {entity.line_no}: refused by the database: "
                        f"{primary_message(exc)}")
            continue
        inserted += one_inserted
        updated += one_updated
    return inserted, updated


async def _write_entities(side: Conn, spec: ImportSpec, plan: BatchPlan) -> tuple[int, int, int]:
    inserted = updated = unchanged = 0
    for chunk in plan.chunks:
        try:
            async with side.transaction():
                chunk_inserted, chunk_updated = await _upsert(side, spec, chunk)
        except psycopg.Error as exc:
            if not refuses_value(exc):
                raise
            log.warning("import %d: a chunk was refused (%s); retrying row by row", spec.id,
                        primary_message(exc))
            chunk_inserted, chunk_updated = await _upsert_one_by_one(side, spec, chunk, plan)
        refused = sum(plan.outcomes[e.line_no].status == "rejected" for e in chunk)
        inserted += chunk_inserted
        updated += chunk_updated
        unchanged += len(chunk) - refused - chunk_inserted - chunk_updated
    return inserted, updated, unchanged


def _staged(row: dict[str, Any]) -> StagedRow:
    return StagedRow(row["line_no"], row["raw"], cast(RowStatus, row["status"]),
                     row["error_field"], row["error"])


async def run_batch(side: Conn, job: Job, spec: ImportSpec, batch_size: int) -> BatchCounts | None:
    """Commit the next batch after the progress marker; None when no staged row is left.

    Raises ImportClaimLostError when the job lost its claim (nothing of the batch commits).
    """
    async with side.transaction():
        progress = await LOCK_IMPORT_PROGRESS(side, {
            "id": spec.id, "job_id": job.id, "claimed_by": job.claimed_by,
            "attempts": job.attempts})
        if progress is None:
            raise ImportClaimLostError(
                f"job {job.id} no longer holds its claim on import {spec.id}")
        rows = [_staged(row) for row in await NEXT_IMPORT_ROWS(side, {
            "id": spec.id, "after": progress["last_line"], "limit": batch_size,
            "max_chars": MAX_BATCH_CHARS})]
        if not rows:
            return None
        plan = plan_batch(rows, spec.attributes, key_field=spec.key_field,
                          unknown_keys=spec.unknown_keys, type_key=spec.type_key)
        inserted, updated, unchanged = await _write_entities(side, spec, plan)
        outcomes = sorted(plan.outcomes.values(), key=lambda o: o.line_no)
        await MARK_IMPORT_ROWS(side, {
            "id": spec.id, "line_nos": [o.line_no for o in outcomes],
            "statuses": [o.status for o in outcomes],
            "error_fields": [o.error_field for o in outcomes],
            "errors": [o.error for o in outcomes]})
        counts = BatchCounts(plan.last_line, inserted, updated, unchanged, plan.rejected)
        await ADVANCE_IMPORT(side, {
            "id": spec.id, "last_line": counts.last_line, "inserted": counts.inserted,
            "updated": counts.updated, "unchanged": counts.unchanged,
            "rejected": counts.rejected})
    return counts
