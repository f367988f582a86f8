"""bulk_import: validate staged records and commit them into `mdm.ddm_entity` in batches.

Payload: `ImportPayload`, {"import_job_id": int, "batch_size": int (default 1000, at most
10,000)}; `jobpool import FILE --tenant T --type K` stages a file and enqueues it.

Each record is checked against the type's attributes (`kinds/entities/attributes.py`); valid ones
are upserted on (tenant, type, external key), so a rerun never duplicates; rejected ones keep
their line number and a message naming the field in `mdm.aa_import_row`. One bad record never
sinks its batch, and a file of only bad records completes with all of them rejected.
Batches commit on a side connection with the progress marker (`batches.py`), so a retry
after a crash continues after the last committed batch. Result (also in
`aa_import_job`): {"import_job_id", "rows", "inserted", "updated", "unchanged", "rejected"}.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from psycopg import AsyncConnection

from jobpool.db.connect import open_side_connection
from jobpool.db.queries import One
from jobpool.errors import PermanentError
from jobpool.job import Job
from jobpool.kinds.entities.payload_fields import DEFAULT_BATCH, BatchSize, PositiveId
from jobpool.kinds.imports.batches import load_import, run_batch
from jobpool.registry import kind

FINISH_IMPORT = One("finish_import")

log = logging.getLogger(__name__)


class ImportPayload(msgspec.Struct, frozen=True, omit_defaults=True):
    """A bulk_import payload: the staged import, and its records per committed batch."""

    import_job_id: PositiveId
    batch_size: BatchSize = DEFAULT_BATCH


@kind("bulk_import", priority=100, max_attempts=20, stale_ttl=3600, timeout=4 * 3600,
      backoff_base=30, backoff_max=24 * 3600, backoff_jitter=0.1, payload=ImportPayload)
async def bulk_import(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Import one staged file batch by batch, then mark it done with the job."""
    request: ImportPayload = job.payload
    async with await open_side_connection(
        tx, application_name=f"jobpool bulk_import job {job.id}"
    ) as side:
        spec = await load_import(side, request.import_job_id, job.tenant_id)
        if spec is None:
            raise PermanentError(f"no import job {request.import_job_id} for this tenant")
        batches = 0
        while spec.status != "done":
            counts = await run_batch(side, job, spec, request.batch_size)
            if counts is None:
                break
            batches += 1
            log.debug("import %d: committed up to line %d", spec.id, counts.last_line)
    done = await FINISH_IMPORT(tx, {
        "id": spec.id, "job_id": job.id, "actor": job.context.actor})
    assert done is not None
    return {"import_job_id": spec.id, "rows": done["total_rows"], "inserted": done["inserted"],
            "updated": done["updated"], "unchanged": done["unchanged"],
            "rejected": done["rejected"], "batches_this_attempt": batches}
