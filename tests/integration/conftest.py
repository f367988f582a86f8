"""Fixtures shared by the integration tests (the database fixtures are tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from integration.helpers import prepare
from jobpool.db.connect import open_pool
from jobpool.db.store import QueueStore


@pytest.fixture
async def store(conn: psycopg.AsyncConnection[Any], dsn: str) -> AsyncIterator[QueueStore]:
    """A worker's queue store (worker id `host/1/store`) on the test's database, prepared
    (`prepare`), with a pool of its own."""
    await prepare(conn)
    pool = open_pool(dsn, size=8)
    await pool.open()
    try:
        async with QueueStore(pool, worker_id="host/1/store", actor="w") as store:
            yield store
    finally:
        await pool.close()
