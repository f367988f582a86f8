"""index_sync: build or drop an attribute's expression index online.

Payload: `SyncPayload` (the trigger on `mdm.ddm_entity_type_attribute` writes it when `searchable`,
`sortable` or `is_unique` changes): {"attribute_id": int, "type_key": str, "attr_key": str},
optional "lock_timeout" / "statement_timeout" in seconds (defaults `DEFAULT_TIMEOUTS`).

The attribute's current flags decide, not the payload: searchable or sortable wants a btree
index on its typed expression, partial on its entity type (UNIQUE when `is_unique`); neither
(or a deleted attribute) wants none. Drift check first (`index_plans.plan_index`),
then CREATE/DROP INDEX CONCURRENTLY on a side autocommit connection; the job's own
transaction runs nothing until the DDL is over, then records `index_status`
(active/dropped) and an audit row. On the last attempt, or a permanent error, index_status
becomes failed with the error.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb

from jobpool.core.retry import truncate_error
from jobpool.db.connect import open_side_connection
from jobpool.db.queries import Exec, One, Row
from jobpool.errors import PermanentError
from jobpool.job import Job
from jobpool.kinds.entities.attributes import DataType
from jobpool.kinds.entities.payload_fields import PositiveId, check_entity_keys
from jobpool.kinds.indexes.index_builds import (
    IndexOutcome,
    IndexWork,
    is_last_attempt,
    record_failure,
    sync_index,
    template,
)
from jobpool.kinds.indexes.index_plans import (
    AttributeIndex,
    BuildPayload,
    BuildTimeouts,
    attribute_index_name,
    expression_function,
    sample_value,
)
from jobpool.registry import kind

ATTRIBUTE_BY_ID = One("attribute_by_id")
AUDIT_DATA_JOB = Exec("audit_data_job")
SET_ATTRIBUTE_INDEX_STATUS = Exec("set_attribute_index_status")
CREATE_ATTRIBUTE_INDEX = Exec("create_attribute_index")
CREATE_UNIQUE_ATTRIBUTE_INDEX = Exec("create_unique_attribute_index")
EXPLAIN_ATTRIBUTE_EQUALITY = One("explain_attribute_equality")
EXPLAIN_ATTRIBUTE_SORT = One("explain_attribute_sort")

DEFAULT_TIMEOUTS = BuildTimeouts(lock_timeout=60.0, statement_timeout=3 * 3600.0)
"""Per-kind build limits (seconds); a payload may override either."""



class SyncPayload(BuildPayload, frozen=True, kw_only=True):
    """An index_sync payload: the attribute (its id, and its keys for the index name when it
    was deleted), and the build limits."""

    attribute_id: PositiveId
    type_key: str
    attr_key: str

    def __post_init__(self) -> None:
        check_entity_keys(self, "type_key", "attr_key")


def wanted_index(tenant_id: uuid.UUID, request: SyncPayload,
                 attribute: Row | None) -> tuple[str, AttributeIndex | None]:
    """The index name, and the index the attribute needs now (None: no index)."""
    if attribute is None:
        return attribute_index_name(str(tenant_id), request.type_key, request.attr_key), None
    name = attribute_index_name(str(tenant_id), attribute["type_key"], attribute["attr_key"])
    if not (attribute["searchable"] or attribute["sortable"]):
        return name, None
    data_type: DataType = attribute["data_type"]
    return name, AttributeIndex(
        name=name, entity_type_id=attribute["entity_type_id"], attr_key=attribute["attr_key"],
        function=expression_function(data_type), unique=attribute["is_unique"],
        searchable=attribute["searchable"], sortable=attribute["sortable"],
    )


def index_work(name: str, index: AttributeIndex | None) -> IndexWork:
    """The DDL and canonical-query EXPLAINs for `index` (drop `name` when None)."""
    if index is None:
        return IndexWork(name, None)
    parts: dict[str, sql.Composable] = {
        "index": sql.Identifier(name), "function": sql.Identifier("mdm", index.function),
        "attr_key": sql.Literal(index.attr_key),
        "entity_type_id": sql.Literal(index.entity_type_id),
    }
    statement = CREATE_UNIQUE_ATTRIBUTE_INDEX if index.unique else CREATE_ATTRIBUTE_INDEX
    create = template(statement, **parts)
    del parts["index"]
    explains: dict[str, sql.Composed] = {}
    if index.sortable:
        explains["sort"] = template(EXPLAIN_ATTRIBUTE_SORT, **parts)
    if index.searchable:
        sample = json.dumps({index.attr_key: sample_value(index.function)})
        explains["equality"] = template(EXPLAIN_ATTRIBUTE_EQUALITY, **parts,
                                        sample=sql.Literal(sample))
    return IndexWork(name, index.signature, create, explains)


async def _load_attribute(side: AsyncConnection[Any], attribute_id: int,
                          tenant_id: uuid.UUID) -> Row | None:
    row: Row | None = await ATTRIBUTE_BY_ID(side, {"id": attribute_id})
    if row is not None and row["tenant_id"] != tenant_id:
        raise PermanentError(f"attribute {attribute_id} belongs to another tenant")
    return row


def _status_params(attribute: Row, status: str, error: str | None) -> dict[str, Any]:
    return {"id": attribute["id"], "status": status, "error": error,
            "searchable": attribute["searchable"], "sortable": attribute["sortable"],
            "is_unique": attribute["is_unique"]}


async def _record(tx: AsyncConnection[Any], job: Job, attribute: Row | None,
                  outcome: IndexOutcome, result: dict[str, Any]) -> None:
    if attribute is not None:
        status = "active" if outcome.present else "dropped"
        await SET_ATTRIBUTE_INDEX_STATUS(tx,
                         _status_params(attribute, status, None))
    if outcome.plan.action in ("build", "rebuild", "drop"):
        action = "index_dropped" if outcome.plan.action == "drop" else "index_built"
        await AUDIT_DATA_JOB(tx, {
            "actor": job.context.actor, "tenant_id": job.tenant_id,
            "job_id": job.id, "action": action, "payload": Jsonb(result)})


@kind("index_sync", priority=200, max_attempts=3, stale_ttl=2 * 3600, timeout=6 * 3600,
      backoff_base=60, backoff_max=3600, backoff_jitter=0.1, payload=SyncPayload)
async def index_sync(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Bring one attribute's expression index in line with its flags (see module docstring)."""
    request: SyncPayload = job.payload
    async with await open_side_connection(
        tx, application_name=f"jobpool index_sync job {job.id}", session=True
    ) as side:
        attribute = await _load_attribute(side, request.attribute_id, job.tenant_id)
        name, wanted = wanted_index(job.tenant_id, request, attribute)
        try:
            outcome = await sync_index(side, index_work(name, wanted),
                                       timeouts=request.timeouts(DEFAULT_TIMEOUTS),
                                       tx_pid=tx.info.backend_pid)
        except Exception as exc:
            if attribute is not None and is_last_attempt(job.attempts, job.max_attempts, exc):
                await record_failure(side, SET_ATTRIBUTE_INDEX_STATUS, _status_params(
                    attribute, "failed", truncate_error(f"{type(exc).__name__}: {exc}")))
            raise
    result = {"attribute_id": request.attribute_id, **outcome.as_result(name)}
    await _record(tx, job, attribute, outcome, result)
    return result
