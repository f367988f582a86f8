"""gin_backfill: build a type's partial GIN index on `attributes jsonb_path_ops` online.

Payload: `BackfillPayload` (the trigger on `mdm.ddm_entity_type` writes it when
`is_external_source_target` becomes true): {"type_key": str}, optionally "entity_type_id"
(informational) and "lock_timeout" / "statement_timeout" in seconds (`DEFAULT_TIMEOUTS`).

`type_key` is checked against `attributes.KEY_PATTERN` (the entities base) before any SQL runs.
Index `ix_entity_attributes_gin_<type_key>_<hash>` (see `index_plans`), partial on
the type, with the same drift check and INVALID-index handling as index_sync. A type that is
no longer an external-source target when the job runs is skipped (nothing is dropped).
`gin_index_status` on the type becomes active, or failed on the last attempt.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb

from jobpool.core.retry import truncate_error
from jobpool.db.connect import open_side_connection
from jobpool.db.queries import Exec, One
from jobpool.job import Job
from jobpool.kinds.entities.entity_types import require_entity_type
from jobpool.kinds.entities.payload_fields import check_entity_keys
from jobpool.kinds.indexes.index_builds import (
    IndexWork,
    is_last_attempt,
    record_failure,
    sync_index,
    template,
)
from jobpool.kinds.indexes.index_plans import (
    BuildPayload,
    BuildTimeouts,
    GinIndex,
    gin_index_name,
)
from jobpool.registry import kind

AUDIT_DATA_JOB = Exec("audit_data_job")
SET_GIN_INDEX_STATUS = Exec("set_gin_index_status")
CREATE_GIN_INDEX = Exec("create_gin_index")
EXPLAIN_CONTAINMENT = One("explain_containment")

DEFAULT_TIMEOUTS = BuildTimeouts(lock_timeout=60.0, statement_timeout=6 * 3600.0)
"""Per-kind build limits (seconds); a payload may override either."""

PROBE = json.dumps({"__jobpool_probe__": 1})
"""A containment value for the EXPLAIN of the canonical `attributes @> ...` query."""


class BackfillPayload(BuildPayload, frozen=True, kw_only=True):
    """A gin_backfill payload: the entity type, and the build limits."""

    type_key: str

    def __post_init__(self) -> None:
        check_entity_keys(self, "type_key")


def index_work(index: GinIndex) -> IndexWork:
    """The DDL and the containment-query EXPLAIN of a type's GIN index."""
    type_id = sql.Literal(index.entity_type_id)
    return IndexWork(
        index.name, index.signature,
        template(CREATE_GIN_INDEX, index=sql.Identifier(index.name), entity_type_id=type_id),
        {"containment": template(EXPLAIN_CONTAINMENT, entity_type_id=type_id,
                                 sample=sql.Literal(PROBE))},
    )


@kind("gin_backfill", priority=200, max_attempts=3, stale_ttl=2 * 3600, timeout=6 * 3600,
      backoff_base=60, backoff_max=3600, backoff_jitter=0.1, payload=BackfillPayload)
async def gin_backfill(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Build the type's GIN index if it is an external-source target (see module docstring)."""
    request: BackfillPayload = job.payload
    async with await open_side_connection(
        tx, application_name=f"jobpool gin_backfill job {job.id}", session=True
    ) as side:
        entity_type = await require_entity_type(side, job.tenant_id, request.type_key)
        name = gin_index_name(str(job.tenant_id), request.type_key)
        if not entity_type["is_external_source_target"]:
            return {"type_key": request.type_key, "index": name, "action": "skipped",
                    "reason": "the type is not an external-source target"}
        try:
            outcome = await sync_index(side, index_work(GinIndex(name, entity_type["id"])),
                                       timeouts=request.timeouts(DEFAULT_TIMEOUTS),
                                       tx_pid=tx.info.backend_pid)
        except Exception as exc:
            if is_last_attempt(job.attempts, job.max_attempts, exc):
                await record_failure(side, SET_GIN_INDEX_STATUS, {
                    "id": entity_type["id"], "status": "failed",
                    "error": truncate_error(f"{type(exc).__name__}: {exc}")})
            raise
    result = {"type_key": request.type_key, **outcome.as_result(name)}
    await SET_GIN_INDEX_STATUS(tx,
                     {"id": entity_type["id"], "status": "active", "error": None})
    if outcome.plan.action in ("build", "rebuild"):
        await AUDIT_DATA_JOB(tx, {
            "actor": job.context.actor, "tenant_id": job.tenant_id,
            "job_id": job.id, "action": "index_built", "payload": Jsonb(result)})
    return result
