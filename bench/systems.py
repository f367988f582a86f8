"""The systems behind one interface: schema, enqueue, and the worker command line."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncpg
import bench_kinds
import peer_programs
import peers
import psycopg
from common import BENCH, python
from psycopg.rows import dict_row

import jobpool
from jobpool.db.migrate import migrate
from jobpool.db.store import register_kinds
from jobpool.registry import REGISTRY
from jobpool.settings import default_of

BENCH_TENANT = uuid.UUID("00000000-0000-0000-0000-0000000000be")
Enqueue1 = Callable[[str, dict[str, Any]], Awaitable[None]]
"""Enqueue one job of a kind with a payload, in its own transaction."""
EnqueueMany = Callable[[str, Sequence[dict[str, Any]]], Awaitable[None]]
"""Enqueue jobs of a kind, one per payload, in one call (the steady scenario's producer)."""
Close = Callable[[], Awaitable[None]]

assert bench_kinds.LATENCY_FILE  # the kinds register on import


@dataclass(frozen=True)
class System:
    """One queue under test."""

    name: str
    default_concurrency: int
    concurrency_flag: str
    """What the concurrency number means for this system (slots, batch size, ...)."""
    title: str
    """The system's name in tables."""
    default_setting: str
    """Its configuration at default concurrency, for the note under a table."""
    best_setting: str = "{flag} {n}"
    """Its configuration at its best setting, `{n}` the concurrency."""
    bounded_setting: str | None = None
    """Its like-for-like configuration, `{n}` the concurrency: no more jobs fetched ahead of
    its free workers than the system allows to bound (jobpool: prefetch 0, no job claimed
    beyond its free slots); None where it has none."""
    unfinished_sql: str = ""
    """Counts the jobs a drain left unfinished (must be 0)."""
    done_sql: str = ""
    """Counts the jobs the system records as finished with success (a drain must count as
    many as it drained); empty where it keeps no record (graphile-worker deletes them)."""
    job_table: str = ""
    """The table the system keeps its jobs in (the steady scenario samples its size)."""

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

    async def producer(self, dsn: str) -> tuple[EnqueueMany, Close]:
        """An enqueue-a-batch function on an open connection (the system's batch enqueue),
        and its close function."""
        raise NotImplementedError

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop", profile: str = "default") -> list[str]:
        """argv of one worker process serving `kind` and `bench_latency`: `drain` exits when
        the queue is empty, `serve` runs until SIGTERM. Every run serves two kinds, so that a
        drain of `bench_write` and one of `bench_noop` differ only in the handler. `profile`
        is `default`, `best` or `bounded` (see the `*_setting` fields): what the system is
        configured with beyond its concurrency."""
        raise NotImplementedError

    def workers(self, dsn: str, mode: str, concurrency: int, processes: int,
                kind: str = "bench_noop", profile: str = "default") -> list[list[str]]:
        """argv of each process of a run with `processes` worker processes (copies of one)."""
        return [self.worker(dsn, mode, concurrency, kind, profile)] * processes

    def setting(self, profile: str, concurrency: int | str) -> str:
        """The configuration a `profile` stands for at `concurrency` (a number, or a name such
        as "N"), in words."""
        text = {"default": self.default_setting, "best": self.best_setting,
                "bounded": self.bounded_setting or self.best_setting}[profile]
        n1 = concurrency + 1 if isinstance(concurrency, int) else f"{concurrency} + 1"
        return text.format(flag=self.concurrency_flag, n=concurrency, n1=n1)


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

    async def producer(self, dsn: str) -> tuple[EnqueueMany, Close]:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)

        async def many(kind: str, payloads: Sequence[dict[str, Any]]) -> None:
            await jobpool.enqueue_many(conn, [jobpool.NewJob(BENCH_TENANT, kind, p)
                                              for p in payloads])

        return many, conn.close

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop", profile: str = "default") -> list[str]:
        argv = [python(), "-m", "jobpool", "run", "--dsn", dsn, "--kinds",
                f"{kind},bench_latency", "--slots", str(concurrency), "--import",
                "bench_kinds", "--log-level", "warning", "--metrics-port", "0"]
        if profile == "bounded":  # like-for-like: no job claimed beyond the free slots
            argv += ["--prefetch", "0"]
        return [*argv, "--until-empty"] if mode == "drain" else argv

    def workers(self, dsn: str, mode: str, concurrency: int, processes: int,
                kind: str = "bench_noop", profile: str = "default") -> list[list[str]]:
        """One `jobpool run --processes N`: the worker's own multi-process mode."""
        return [[*self.worker(dsn, mode, concurrency, kind, profile),
                 "--processes", str(processes)]]


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

    async def producer(self, dsn: str) -> tuple[EnqueueMany, Close]:
        conn = await asyncpg.connect(dsn)
        queue = peers.PgqueuerSingle(conn)
        return queue.enqueue_many, conn.close

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop", profile: str = "default") -> list[str]:
        return [python(), str(BENCH / "peers.py"), "pgqueuer", mode, dsn, str(concurrency), kind,
                profile]


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

    async def producer(self, dsn: str) -> tuple[EnqueueMany, Close]:
        app = peers.procrastinate_app(dsn, pool_size=2)
        await app.open_async()

        async def many(kind: str, payloads: Sequence[dict[str, Any]]) -> None:
            await app.tasks[kind].batch_defer_async(*payloads)

        return many, app.close_async

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop", profile: str = "default") -> list[str]:
        return [python(), str(BENCH / "peers.py"), "procrastinate", mode, dsn, str(concurrency),
                kind]


class Graphile(System):
    """graphile-worker (Node.js), one `runOnce`/`run` process of bench/peers/graphile-worker;
    jobs enqueued with its SQL functions `add_jobs` (batch) and `add_job` (single)."""

    PROFILES: ClassVar[dict[str, str]] = {"default": "default", "best": "published",
                                          "bounded": "bounded"}

    async def install(self, dsn: str) -> None:
        await asyncio.to_thread(peer_programs.graphile_migrate, dsn)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(bench_kinds.WRITES_DDL)

    async def enqueue(self, dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                      batch: int) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for start in range(0, len(payloads), batch):
                chunk = payloads[start:start + batch]
                if batch == 1:
                    await conn.execute(peer_programs.ADD_JOB, (kind, json.dumps(chunk[0])))
                else:
                    specs = [{"identifier": kind, "payload": p} for p in chunk]
                    await conn.execute(peer_programs.ADD_JOBS, (json.dumps(specs),))

    async def single(self, dsn: str) -> tuple[Enqueue1, Callable[[], Awaitable[None]]]:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)

        async def one(kind: str, payload: dict[str, Any]) -> None:
            await conn.execute(peer_programs.ADD_JOB, (kind, json.dumps(payload)))

        return one, conn.close

    async def producer(self, dsn: str) -> tuple[EnqueueMany, Close]:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)

        async def many(kind: str, payloads: Sequence[dict[str, Any]]) -> None:
            specs = [{"identifier": kind, "payload": p} for p in payloads]
            await conn.execute(peer_programs.ADD_JOBS, (json.dumps(specs),))

        return many, conn.close

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop", profile: str = "default") -> list[str]:
        return peer_programs.graphile_argv(mode, dsn, self.PROFILES[profile], str(concurrency),
                                           kind)


class River(System):
    """River (Go), the driver program of bench/peers/river: one client per process."""

    PROFILES: ClassVar[dict[str, str]] = {"default": "default", "best": "fast", "bounded": "fast"}

    async def install(self, dsn: str) -> None:
        await asyncio.to_thread(peer_programs.river_migrate, dsn)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(bench_kinds.WRITES_DDL)

    async def enqueue(self, dsn: str, kind: str, payloads: Sequence[dict[str, Any]],
                      batch: int) -> None:
        await peer_programs.river_enqueue(dsn, kind, payloads, batch)

    async def single(self, dsn: str) -> tuple[Enqueue1, Callable[[], Awaitable[None]]]:
        return await peer_programs.river_single(dsn)

    async def producer(self, dsn: str) -> tuple[EnqueueMany, Close]:
        return await peer_programs.river_producer(dsn)

    def worker(self, dsn: str, mode: str, concurrency: int,
               kind: str = "bench_noop", profile: str = "default") -> list[str]:
        return peer_programs.river_argv(mode, dsn, str(concurrency), self.PROFILES[profile],
                                        kind)


JOBPOOL_PREFETCH = default_of("prefetch")
"""jobpool's default prefetch bound (jobs), which the bench runs it with."""

SYSTEMS: dict[str, System] = {
    "jobpool": Jobpool(
        "jobpool", 4, "--slots", "jobpool", f"4 slots, prefetch up to {JOBPOOL_PREFETCH}",
        f"{{n}} slots, prefetch up to {JOBPOOL_PREFETCH}",
        "{n} slots, prefetch 0 (no job claimed beyond its free slots)",
        unfinished_sql="SELECT count(*) FROM mdm.aa_job WHERE status <> 'done'",
        done_sql="SELECT count(*) FROM mdm.aa_job WHERE status = 'done'",
        job_table="mdm.aa_job"),
    "pgqueuer": Pgqueuer(
        "pgqueuer", 10, "batch_size", "PgQueuer", "batch_size 10", "batch_size {n}",
        "max_concurrent_tasks {n}, batch_size {n} / 2",
        unfinished_sql="SELECT count(*) FROM pgqueuer", job_table="pgqueuer",
        done_sql="SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"),
    "procrastinate": Procrastinate(
        "procrastinate", 1, "concurrency", "Procrastinate", "concurrency 1", "concurrency {n}",
        "concurrency {n} (one job fetched per free worker)",
        unfinished_sql="SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
        done_sql="SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        job_table="procrastinate_jobs"),
    "graphile": Graphile(
        "graphile", 1, "-j", "graphile-worker", "-j 1, no local queue",
        "-j {n}, localQueue 500, maxPoolSize {n1}, completion batching 0 ms (its published "
        "setting)", "-j {n}, localQueue {n1}, maxPoolSize {n1}, completion batching 0 ms",
        unfinished_sql="SELECT count(*) FROM graphile_worker._private_jobs",
        job_table="graphile_worker._private_jobs"),
    "river": River(
        "river", 100, "MaxWorkers", "River", "MaxWorkers 100, FetchCooldown 100 ms, "
        "FetchPollInterval 1 s", "MaxWorkers {n}, FetchCooldown 2 ms, FetchPollInterval 20 ms "
        "(`river bench`)", "MaxWorkers {n}, FetchCooldown 2 ms, FetchPollInterval 20 ms",
        unfinished_sql="SELECT count(*) FROM river_job WHERE state <> 'completed'",
        done_sql="SELECT count(*) FROM river_job WHERE state = 'completed'",
        job_table="river_job"),
}
"""Each system with its default concurrency (jobpool slots 4, PgQueuer batch_size 10,
Procrastinate concurrency 1, graphile-worker concurrentJobs 1, River MaxWorkers 100: River
has no default, 100 is its documentation's) and the settings its profiles stand for."""


def now() -> float:
    """Wall clock in seconds (latencies compare it across processes on one host)."""
    return time.time()
