"""Faults of a local pool's lane processes, for `jobpool run pool.yaml --import pool_faults`.

Importing this module fails in the lane named `broken` (its processes get JOBPOOL_LANE), so
that one lane fails at start while the pool itself and the other lanes import it fine. Kind
`test_crash_once` ends its worker process the first time it runs (a crash after start).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

import jobpool
from jobpool.job import Job

BROKEN_LANE = "broken"

if os.environ.get("JOBPOOL_LANE") == BROKEN_LANE:
    raise RuntimeError("this lane cannot start")


@jobpool.kind("test_crash_once", max_attempts=5)
async def crash_once(job: Job, tx: AsyncConnection[Any]) -> None:
    """End the worker process at once (exit status 3) unless `payload.marker` exists; create
    it first, so that the job runs to done once it is run again."""
    marker = Path(job.payload["marker"])
    if not marker.exists():
        marker.touch()
        os._exit(3)
