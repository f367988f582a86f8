"""The peers doing the benchmark's work: PgQueuer and Procrastinate (pinned in requirements.txt).

Run as a worker process: `python bench/peers.py SYSTEM MODE DSN CONCURRENCY [KIND [PROFILE]]`
with MODE `drain` (exit once the queue is empty) or `serve` (run until SIGTERM); KIND
(`bench_noop`, the default, or `bench_write`) is served besides `bench_latency`. PROFILE
`bounded` caps PgQueuer's picked jobs at CONCURRENCY (`max_concurrent_tasks`, with batches of
CONCURRENCY // 2, the largest it accepts); any other PROFILE runs PgQueuer with batch_size
CONCURRENCY and no cap. Procrastinate fetches one job per free worker whatever PROFILE says,
and by queue, not by task, so its worker has every task whatever KIND says.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import procrastinate
from bench_kinds import WRITES_DDL, record_latency
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Context as PgqContext
from pgqueuer.models import Job as PgqJob
from pgqueuer.types import QueueExecutionMode

# -- PgQueuer -------------------------------------------------------------------------------


async def pgqueuer_install(dsn: str) -> None:
    """Create PgQueuer's schema and the table `bench_write` jobs insert into."""
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
        await conn.execute(WRITES_DDL)
    finally:
        await conn.close()


async def pgqueuer_enqueue(dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                           batch: int) -> None:
    """Enqueue `payloads` as jobs of entrypoint `kind`, `batch` per statement."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, len(payloads), batch):
            chunk = payloads[start:start + batch]
            if batch == 1:
                await queries.enqueue(kind, json.dumps(chunk[0]).encode())
            else:
                await queries.enqueue([kind] * len(chunk),
                                      [json.dumps(p).encode() for p in chunk], [0] * len(chunk))
    finally:
        await conn.close()


class PgqueuerSingle:
    """One connection enqueueing one job per call (for the latency and single-enqueue runs), or
    a batch (the steady scenario's producer)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.queries = Queries(AsyncpgDriver(conn))

    async def enqueue(self, kind: str, payload: dict[str, Any]) -> None:
        await self.queries.enqueue(kind, json.dumps(payload).encode())

    async def enqueue_many(self, kind: str, payloads: Sequence[dict[str, Any]]) -> None:
        """Enqueue one job per payload in one statement (PgQueuer's batch enqueue)."""
        await self.queries.enqueue([kind] * len(payloads),
                                   [json.dumps(p).encode() for p in payloads],
                                   [0] * len(payloads))


async def pgqueuer_worker(dsn: str, mode: str, batch_size: int, kind: str,
                          max_concurrent_tasks: int | None = None) -> None:
    """One PgQueuer QueueManager on one asyncpg connection (its documented setup) serving
    `kind` and `bench_latency`, picking at most `max_concurrent_tasks` jobs at a time if given
    (PgQueuer requires at least twice `batch_size`).

    `bench_write` inserts through an asyncpg pool (asyncpg's default size, 10) handed to the
    handlers as a shared resource, PgQueuer's documented way to give handlers a database: the
    insert commits on its own, apart from PgQueuer's acknowledgement of the job.
    """
    conn = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn) if kind == "bench_write" else None
    qm = QueueManager(Queries(AsyncpgDriver(conn)), resources={"pool": pool})

    async def noop(job: PgqJob) -> None:
        """Nothing."""

    async def write(job: PgqJob, ctx: PgqContext) -> None:
        """Insert the job's id and payload into bench_writes."""
        await ctx.resources["pool"].execute(
            "INSERT INTO bench_writes (job_id, payload) VALUES ($1, $2::jsonb)",
            job.id, (job.payload or b"{}").decode())

    handlers = {"bench_noop": noop, "bench_write": write}
    qm.entrypoint(kind, accepts_context=kind == "bench_write")(handlers[kind])

    @qm.entrypoint("bench_latency")
    async def latency(job: PgqJob) -> None:
        """Record enqueue-to-start."""
        record_latency(json.loads(job.payload or b"{}"))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    try:
        await qm.run(
            batch_size=batch_size, dequeue_timeout=timedelta(seconds=2),
            max_concurrent_tasks=max_concurrent_tasks,
            mode=QueueExecutionMode.drain if mode == "drain" else QueueExecutionMode.continuous,
        )
    finally:
        if pool is not None:
            await pool.close()


# -- Procrastinate --------------------------------------------------------------------------


def procrastinate_app(dsn: str, pool_size: int = 10) -> procrastinate.App:
    """An App with the benchmark's tasks on a psycopg pool of `pool_size`."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=1, max_size=pool_size))

    @app.task(name="bench_noop")
    async def noop() -> None:
        """Nothing."""

    @app.task(name="bench_latency")
    async def latency(t0: float, warmup: bool = False) -> None:
        """Record enqueue-to-start."""
        record_latency({"t0": t0, "warmup": warmup})

    @app.task(name="bench_write", pass_context=True)
    async def write(context: procrastinate.JobContext, **payload: Any) -> None:
        """Insert the job's id and payload into bench_writes through the app's connector
        (its pool; the insert commits on its own, apart from the job's status update)."""
        assert context.job.id is not None
        await context.app.connector.execute_query_async(
            "INSERT INTO bench_writes (job_id, payload) VALUES (%(id)s, %(payload)s)",
            id=context.job.id, payload=payload)

    return app


async def procrastinate_install(dsn: str) -> None:
    """Create Procrastinate's schema and the table `bench_write` jobs insert into."""
    app = procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await app.connector.execute_query_async(WRITES_DDL)


async def procrastinate_enqueue(dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                                batch: int) -> None:
    """Defer `payloads` as jobs of task `kind`, `batch` per call."""
    app = procrastinate_app(dsn)
    async with app.open_async():
        task = app.tasks[kind]
        for start in range(0, len(payloads), batch):
            chunk = payloads[start:start + batch]
            if batch == 1:
                await task.defer_async(**chunk[0])
            else:
                await task.batch_defer_async(*chunk)


async def procrastinate_worker(dsn: str, mode: str, concurrency: int) -> None:
    """One Procrastinate worker with `concurrency` (its default is 1)."""
    app = procrastinate_app(dsn, pool_size=max(10, concurrency + 4))
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=mode != "drain",
                                   fetch_job_polling_interval=2.0)


def main(argv: Sequence[str]) -> int:
    system, mode, dsn, concurrency = argv[0], argv[1], argv[2], int(argv[3])
    kind = argv[4] if len(argv) > 4 else "bench_noop"
    profile = argv[5] if len(argv) > 5 else "default"
    started = time.monotonic()
    if system == "pgqueuer" and profile == "bounded":
        asyncio.run(pgqueuer_worker(dsn, mode, max(1, concurrency // 2), kind, concurrency))
    elif system == "pgqueuer":
        asyncio.run(pgqueuer_worker(dsn, mode, concurrency, kind))
    elif system == "procrastinate":
        asyncio.run(procrastinate_worker(dsn, mode, concurrency))
    else:
        raise SystemExit(f"unknown system {system}")
    print(f"{system} {mode}: {time.monotonic() - started:.2f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
