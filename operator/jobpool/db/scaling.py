"""Job counts per lane for the scaler: one grouped query (`count_lane_jobs` in scaling.sql)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from jobpool.core.poolspec import Lane
from jobpool.core.scaling import LaneJobs
from jobpool.sql import QUERIES

CONNECT_TIMEOUT = 10
"""Seconds to wait for the database before a scaling round gives up."""


def lanes_parameter(lanes: Sequence[Lane]) -> str:
    """The `lanes` JSON parameter of `count_lane_jobs`: name, kinds, exclude_kinds, tenants."""
    return json.dumps(
        [
            {
                "name": lane.name,
                "kinds": None if lane.kinds is None else list(lane.kinds),
                "exclude_kinds": list(lane.exclude_kinds),
                "tenants": list(lane.tenants),
            }
            for lane in lanes
        ]
    )


async def count_lane_jobs(
    conn: psycopg.AsyncConnection[Any], lanes: Sequence[Lane]
) -> dict[str, LaneJobs]:
    """Ready and running jobs per lane name, counted by the database at its `now()`.

    Every lane gets an entry (zeros when it has no jobs). A lane naming a tenant that does
    not exist counts nothing for it.
    """
    if not lanes:
        return {}
    async with conn.cursor() as cur:
        await cur.execute(QUERIES["count_lane_jobs"].text, {"lanes": lanes_parameter(lanes)})
        rows = await cur.fetchall()
    counts = {lane.name: LaneJobs() for lane in lanes}
    for row in rows:
        name, ready, running = _row(row)
        counts[name] = LaneJobs(ready=ready, running=running)
    return counts


async def count_lane_jobs_at(dsn: str, lanes: Sequence[Lane]) -> dict[str, LaneJobs]:
    """`count_lane_jobs` on a short-lived connection to `dsn` (the scaler runs once a period)."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name="jobpool-operator"
    ) as conn:
        return await count_lane_jobs(conn, lanes)


def _row(row: Sequence[Any] | Mapping[str, Any]) -> tuple[str, int, int]:
    if isinstance(row, Mapping):
        return str(row["lane"]), int(row["ready"]), int(row["running"])
    return str(row[0]), int(row[1]), int(row[2])
