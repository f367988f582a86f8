"""reindex: rebuild `search_vector` of one tenant's entities of one type.

Payload: `ReindexPayload`, {"type_key": str, "batch_size": int (default 1000, at most
10,000)}. The trigger on `mdm.ddm_entity_type_attribute` enqueues one when an attribute's
`searchable` changes; a steward or maintenance task may enqueue one any time.

The vector is `to_tsvector('simple', <searchable attribute values in attr_key order>)`
(`mdm.entity_search_vector`). Batches of ids in order, each one UPDATE in its own short
transaction on a side autocommit connection: row locks are held for one batch only, rows
whose vector is already right are not written, and each row's vector is computed from the
row version the UPDATE writes, so it is safe to run twice and alongside writes. The job's
transaction records the audit row `search_reindexed` at the end.
"""

from __future__ import annotations

from typing import Any

import msgspec
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from jobpool.db.connect import open_side_connection
from jobpool.db.queries import Exec, Many, One
from jobpool.job import Job
from jobpool.kinds.entities.entity_types import require_entity_type
from jobpool.kinds.entities.payload_fields import DEFAULT_BATCH, BatchSize, check_entity_keys
from jobpool.registry import kind

AUDIT_DATA_JOB = Exec("audit_data_job")
ENTITY_TYPE_ATTRIBUTES = Many("entity_type_attributes")
REINDEX_BATCH = One("reindex_batch")


class ReindexPayload(msgspec.Struct, frozen=True, omit_defaults=True):
    """A reindex payload: the entity type, and entities per committed batch."""

    type_key: str
    batch_size: BatchSize = DEFAULT_BATCH

    def __post_init__(self) -> None:
        check_entity_keys(self, "type_key")


async def _search_keys(side: AsyncConnection[Any], entity_type_id: int) -> list[str]:
    return [row["attr_key"] for row in await ENTITY_TYPE_ATTRIBUTES(side,
                             {"entity_type_id": entity_type_id}) if row["searchable"]]


async def rebuild_vectors(side: AsyncConnection[Any], entity_type_id: int,
                          search_keys: list[str], batch_size: int) -> dict[str, int]:
    """Recompute the type's vectors batch by batch; return scanned/updated/batches counts."""
    totals = {"scanned": 0, "updated": 0, "batches": 0}
    after = 0
    while True:
        row = await REINDEX_BATCH(side, {
            "entity_type_id": entity_type_id, "after": after, "limit": batch_size,
            "search_keys": search_keys})
        if row is None or row["last_id"] is None:
            return totals
        after = row["last_id"]
        totals["scanned"] += row["scanned"]
        totals["updated"] += row["updated"]
        totals["batches"] += 1


@kind("reindex", priority=150, max_attempts=20, stale_ttl=3600, timeout=4 * 3600, backoff_base=30,
      backoff_max=24 * 3600, backoff_jitter=0.1, payload=ReindexPayload)
async def reindex(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Rebuild one type's search vectors in short batches (see module docstring)."""
    request: ReindexPayload = job.payload
    async with await open_side_connection(
        tx, application_name=f"jobpool reindex job {job.id}"
    ) as side:
        entity_type = await require_entity_type(side, job.tenant_id, request.type_key)
        keys = await _search_keys(side, entity_type["id"])
        totals = await rebuild_vectors(side, entity_type["id"], keys, request.batch_size)
    result = {"type_key": request.type_key, "search_keys": keys, **totals}
    await AUDIT_DATA_JOB(tx, {
        "actor": job.context.actor, "tenant_id": job.tenant_id,
        "job_id": job.id, "action": "search_reindexed", "payload": Jsonb(result)})
    return result
