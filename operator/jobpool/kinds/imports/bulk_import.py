"""bulk_import: validate staged records and commit them into `mdm.ddm_entity` in batches.

Payload: {"import_job_id": int, "batch_size": int (default 1000, at
most 10,000)}; `jobpool import FILE --tenant T --type K` stages a file and enqueues it.

Each record is checked against the type's attributes (`kinds/entities/attributes.py`); valid ones
are upserted on (tenant, type, external key), so a rerun never duplicates; rejected ones keep
their line number and a message naming the field in `mdm.aa_import_row`. One bad record never
sinks its batch, and a file of only bad records completes with all of them rejected.
Batches commit on a side connection with the progress marker (`jobpool.kinds.imports.batches`), so a
retry after a crash continues after the last committed batch. Result (also in
`aa_import_job`): {"import_job_id", "rows", "inserted", "updated", "unchanged", "rejected"}.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from jobpool import settings
from jobpool.db.connect import open_side_connection
from jobpool.errors import PermanentError
from jobpool.job import Job
from jobpool.kinds.entities.payloads import as_object, positive_int
from jobpool.kinds.imports.batches import load_import, run_batch
from jobpool.registry import kind
from jobpool.sql import QUERIES

log = logging.getLogger(__name__)

DEFAULT_BATCH = 1000
MAX_BATCH = 10_000


@dataclass(frozen=True)
class ImportRequest:
    """A checked bulk_import payload."""

    import_job_id: int
    batch_size: int


def parse_payload(payload: Any) -> ImportRequest:
    """Check the payload; raises PermanentError naming the bad field."""
    body = as_object("bulk_import", payload)
    return ImportRequest(positive_int(body, "import_job_id"),
                         positive_int(body, "batch_size", default=DEFAULT_BATCH,
                                      maximum=MAX_BATCH))


@kind("bulk_import", priority=100, max_attempts=20, stale_ttl=3600, timeout=4 * 3600,
              backoff_base=30, backoff_max=24 * 3600, backoff_jitter=0.1)
async def bulk_import(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Import one staged file batch by batch, then mark it done with the job."""
    request = parse_payload(job.payload)
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
    cur = await tx.execute(QUERIES["finish_import"].text, {
        "id": spec.id, "job_id": job.id, "actor": settings.current().service_account})
    done = await cur.fetchone()
    assert done is not None
    return {"import_job_id": spec.id, "rows": done["total_rows"], "inserted": done["inserted"],
            "updated": done["updated"], "unchanged": done["unchanged"],
            "rejected": done["rejected"], "batches_this_attempt": batches}
