"""A job's `tx` is its slot's connection, taken on the handler's first use of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from jobpool.db.connect import JobConnection, open_pool
from jobpool.worker.executor import JobTransaction
from jobpool.worker.slot_connections import NoSlotConnectionError, SlotConnections


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[AsyncConnectionPool[JobConnection]]:
    pool = open_pool(dsn, size=4)
    await pool.open(wait=True)
    yield pool
    await pool.close()


async def test_a_handler_that_never_touches_tx_takes_no_connection(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(2)
    await slots.fill(pool, timeout=5.0)
    idle = list(slots.idle)
    tx = JobTransaction(slots)
    assert tx.taken is None
    await tx.release()
    assert (slots.idle, slots.lent) == (idle, 0)
    await slots.close()


async def test_the_first_use_takes_the_connection_and_opens_the_job_transaction_lazily(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(2)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots)
    pid = tx.info.backend_pid  # a plain attribute is a use too
    conn = tx.taken
    assert isinstance(conn, JobConnection) and conn.job_scope
    assert (len(slots.idle), slots.lent) == (1, 1)
    assert conn.info.transaction_status == TransactionStatus.IDLE  # nothing sent yet
    await tx.execute("CREATE TEMP TABLE scratch (x int)")
    assert conn.info.transaction_status == TransactionStatus.INTRANS
    assert pid == conn.info.backend_pid
    await tx.release()
    assert (len(slots.idle), slots.lent) == (2, 0)
    assert conn in slots.idle and not conn.job_scope
    assert conn.info.transaction_status == TransactionStatus.IDLE  # rolled back, reset
    again = JobTransaction(slots)
    cur = await again.execute("SELECT count(*) AS n FROM pg_tables WHERE tablename = 'scratch'")
    assert (await cur.fetchone())["n"] == 0
    await again.release()
    await slots.close()


async def test_a_connection_the_handler_closed_is_replaced(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(2)
    await slots.fill(pool, timeout=5.0)
    tx = JobTransaction(slots)
    closed = tx.connection()
    await tx.close()
    await tx.release()
    assert (len(slots.idle), slots.lent) == (2, 0)
    assert closed not in slots.idle and not any(conn.closed for conn in slots.idle)
    await slots.close()


async def test_with_no_connection_ready_the_job_gets_a_clear_error(
    pool: AsyncConnectionPool[JobConnection],
) -> None:
    slots = SlotConnections(1)
    await slots.fill(pool, timeout=5.0)
    first = JobTransaction(slots)
    first.connection()
    with pytest.raises(NoSlotConnectionError, match="no database connection is ready"):
        JobTransaction(slots).connection()
    await first.release()
    await slots.close()
