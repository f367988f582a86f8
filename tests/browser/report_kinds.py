"""A long-running kind for the console's stuck-lane scenario: `jobpool run --import
browser.report_kinds` (with tests/ on PYTHONPATH)."""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection

import jobpool
from jobpool.job import Job


@jobpool.kind("slow_report", max_attempts=1, stale_ttl=3600.0, timeout=3600.0)
async def slow_report(job: Job, tx: AsyncConnection[Any]) -> None:
    """Take `payload.seconds` seconds, as a report over a big tenant would."""
    await asyncio.sleep(float(job.payload["seconds"]))
