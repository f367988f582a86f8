"""The three systems behind one interface: schema, enqueue, and the worker command line."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import bench_kinds
import peers
import psycopg
from common import BENCH, python
from psycopg.rows import dict_row

import jobpool
from jobpool.db.migrate import migrate
from jobpool.db.store import register_kinds
from jobpool.registry import REGISTRY

BENCH_TENANT = uuid.UUID("00000000-0000-0000-0000-0000000000be")
Enqueue1 = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Enqueue one job of a kind with a payload, in its own transaction."""

assert bench_kinds.LATENCY_FILE  # the kinds register on import


@dataclass(frozen=True)
class System:
    """One queue under test."""

    name: str
    default_concurrency: int
    concurrency_flag: str
    """What the concurrency number means for this system (slots, batch size, ...)."""

    async def install(self, dsn: str) -> None:
        """Create the schema and whatever the benchmark's jobs need."""
        raise NotImplementedError

    async def enqueue(self, dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                      batch: int) -> None:
        """Enqueue `payloads` as jobs of `kind`, `batch` jobs per call (1: one at a time)."""
        raise NotImplementedError

    async def single(self, dsn: str) -> tuple[Enqueue1, Callable[[], Awaitable[None]]]:
        """An enqueue-one function on an open connection, and its close function."""
        raise NotImplementedError

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop") -> list[str]:
        """argv of one worker process serving `kind` and `bench_latency`: `drain` exits when
        the queue is empty, `serve` runs until SIGTERM. Every run serves two kinds, so that a
        drain of `bench_write` and one of `bench_noop` differ only in the handler."""
        raise NotImplementedError

    def workers(self, dsn: str, mode: str, concurrency: int, processes: int,
                kind: str = "bench_noop") -> list[list[str]]:
        """argv of each process of a run with `processes` worker processes (copies of one)."""
        return [self.worker(dsn, mode, concurrency, kind)] * processes


class Jobpool(System):
    """jobpool, from this checkout."""

    async def install(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
            await migrate(conn)
            await conn.execute(
                "INSERT INTO mdm.aa_tenant (id, key) VALUES (%s, 'bench') ON CONFLICT DO NOTHING",
                (BENCH_TENANT,))
            await register_kinds(conn, [REGISTRY.get("bench_noop"),
                                        REGISTRY.get("bench_latency"),
                                        REGISTRY.get("bench_write")])
            await conn.execute(bench_kinds.WRITES_DDL)
            await conn.commit()

    async def enqueue(self, dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                      batch: int) -> None:
        async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, row_factory=dict_row) as conn:
            for start in range(0, len(payloads), batch):
                chunk = payloads[start:start + batch]
                await jobpool.enqueue_many(
                    conn, [jobpool.NewJob(BENCH_TENANT, kind, p) for p in chunk])

    async def single(self, dsn: str) -> tuple[Enqueue1, Callable[[], Awaitable[None]]]:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)

        async def one(kind: str, payload: dict[str, Any]) -> None:
            await jobpool.enqueue(conn, tenant_id=BENCH_TENANT, kind=kind, payload=payload)

        return one, conn.close

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop") -> list[str]:
        argv = [python(), "-m", "jobpool", "run", "--dsn", dsn, "--kinds",
                f"{kind},bench_latency", "--slots", str(concurrency), "--import",
                "bench_kinds", "--log-level", "warning", "--metrics-port", "0"]
        return [*argv, "--until-empty"] if mode == "drain" else argv

    def workers(self, dsn: str, mode: str, concurrency: int, processes: int,
                kind: str = "bench_noop") -> list[list[str]]:
        """One `jobpool run --processes N`: the worker's own multi-process mode."""
        return [[*self.worker(dsn, mode, concurrency, kind), "--processes", str(processes)]]


class Pgqueuer(System):
    """PgQueuer on asyncpg (one connection, its documented setup)."""

    async def install(self, dsn: str) -> None:
        await peers.pgqueuer_install(dsn)

    async def enqueue(self, dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                      batch: int) -> None:
        await peers.pgqueuer_enqueue(dsn, kind, payloads, batch)

    async def single(self, dsn: str) -> tuple[Enqueue1, Callable[[], Awaitable[None]]]:
        conn = await asyncpg.connect(dsn)
        queue = peers.PgqueuerSingle(conn)
        return queue.enqueue, conn.close

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop") -> list[str]:
        return [python(), str(BENCH / "peers.py"), "pgqueuer", mode, dsn, str(concurrency), kind]


class Procrastinate(System):
    """Procrastinate on its psycopg connector."""

    async def install(self, dsn: str) -> None:
        await peers.procrastinate_install(dsn)

    async def enqueue(self, dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                      batch: int) -> None:
        await peers.procrastinate_enqueue(dsn, kind, payloads, batch)

    async def single(self, dsn: str) -> tuple[Enqueue1, Callable[[], Awaitable[None]]]:
        app = peers.procrastinate_app(dsn, pool_size=2)
        await app.open_async()

        async def one(kind: str, payload: dict[str, Any]) -> None:
            await app.tasks[kind].defer_async(**payload)

        return one, app.close_async

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop") -> list[str]:
        return [python(), str(BENCH / "peers.py"), "procrastinate", mode, dsn, str(concurrency),
                kind]


SYSTEMS: dict[str, System] = {
    "jobpool": Jobpool("jobpool", 4, "--slots"),
    "pgqueuer": Pgqueuer("pgqueuer", 10, "batch_size"),
    "procrastinate": Procrastinate("procrastinate", 1, "concurrency"),
}
"""Each system with its default concurrency (jobpool slots 4, PgQueuer batch_size 10,
Procrastinate concurrency 1)."""


def now() -> float:
    """Wall clock in seconds (latencies compare it across processes on one host)."""
    return time.time()
