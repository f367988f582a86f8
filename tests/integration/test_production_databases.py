"""Databases as DBAs configure them: behind a transaction-pooling PgBouncer (and a
session-pooling one for migrations), with a serializable default isolation, restarted under
running jobs, with a role's connection limit below what the worker would open
(docs/operations.md, "Production databases")."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from pgbouncer_server import PgBouncer, find_pgbouncer
from private_postgres import PrivateServer
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from recording_proxy import recording_proxy

import jobpool
from integration import helpers
from integration.helpers import prepare, role_dsn, scalar, worker
from integration.test_api import Client, serving, token
from jobpool import settings as settings_module
from jobpool.cli import main
from jobpool.db import connect as connections
from jobpool.db.connect import connection_allowance
from jobpool.db.lane_counts import LaneCounter
from jobpool.db.migrate import migrate
from jobpool.db.own_sessions import own_backend_pids
from jobpool.errors import SchemaPrivilegeError
from jobpool.job import Job
from jobpool.worker import leases as leases_module
from jobpool.worker.config import POLL_ONLY_INTERVAL
from jobpool.worker.database_link import StartRefusedError
from jobpool.worker.leases import LeaseKeeper
from jobpool.worker.maintenance import run_due_steps
from jobpool.worker.runtime import Worker

Conn = psycopg.AsyncConnection[dict[str, Any]]

DEADLINE = 90.0
"""Seconds a test waits for a state (no kind here has a stale TTL below an hour)."""


@jobpool.kind("test_counter_serializable", max_attempts=1, stale_ttl=3600.0)
async def counter_serializable(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Read-modify-write one shared row at SERIALIZABLE: concurrent runs conflict (40001)."""
    await tx.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    cur = await tx.execute("SELECT n FROM test_counter")
    row = await cur.fetchone()
    assert row is not None
    await asyncio.sleep(0.005)
    await tx.execute("UPDATE test_counter SET n = %s", (row["n"] + 1,))


@jobpool.kind("test_slow_write", max_attempts=1, stale_ttl=3600.0)
async def slow_write(job: Job, tx: psycopg.AsyncConnection[Any]) -> None:
    """Wait `payload.seconds` on the first claim, then record this run."""
    if job.attempts == 1 and not await _ran_before(tx, job.id):
        await asyncio.sleep(float(job.payload.get("seconds", 0)))
    await tx.execute("INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, 0)",
                     (job.id, job.attempts))


async def _ran_before(tx: psycopg.AsyncConnection[Any], job_id: int) -> bool:
    cur = await tx.execute("SELECT count(*) FROM test_slow_starts WHERE job_id = %s", (job_id,))
    row = await cur.fetchone()
    seen = bool(row and row["count"])
    async with await psycopg.AsyncConnection.connect(tx.info.dsn, autocommit=True) as side:
        await side.execute("INSERT INTO test_slow_starts VALUES (%s)", (job_id,))
    return seen


async def wait_until(check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    await helpers.wait_until(check, what, DEADLINE)


async def connect(dsn: str) -> Conn:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)


async def statuses(dsn: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     row_factory=dict_row) as conn:
        cur = await conn.execute("SELECT status::text AS status, count(*)::int AS n"
                                 " FROM mdm.aa_job WHERE job_kind LIKE 'test%' GROUP BY 1")
        return {row["status"]: row["n"] for row in await cur.fetchall()}


async def set_up(dsn: str, jobs: list[tuple[str, dict[str, Any]]]) -> uuid.UUID:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     row_factory=dict_row) as conn:
        await prepare(conn)
        await conn.execute("CREATE TABLE IF NOT EXISTS test_counter (n int NOT NULL);"
                           "INSERT INTO test_counter SELECT 0 WHERE NOT EXISTS"
                           " (SELECT FROM test_counter);"
                           "CREATE TABLE IF NOT EXISTS test_slow_starts (job_id bigint)")
        tenant = uuid.UUID(str(await scalar(conn, "INSERT INTO mdm.aa_tenant (key)"
                                            " VALUES ('acme') RETURNING id")))
        await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, kind, payload)
                                          for kind, payload in jobs])
    return tenant


async def run_until_done(dsn: str, workers: list[Worker], total: int) -> None:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await wait_until(lambda: _all_done(dsn, total), "every job done")
    finally:
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE)


async def _all_done(dsn: str, total: int) -> bool:
    return await statuses(dsn) == {"done": total}


async def attempts_used(dsn: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT DISTINCT attempts FROM mdm.aa_job"
                                 " WHERE job_kind LIKE 'test%' ORDER BY 1")
        return [row[0] for row in await cur.fetchall()]


async def test_a_transaction_pooler_runs_every_job_once_with_no_attempt_burned(
    private_server: PrivateServer, pgbouncer: PgBouncer,
) -> None:
    """No server-side prepared statement reaches PgBouncer: batched `done`s (test_noop,
    max_attempts 1: a refused one would go to the DLQ) and writing jobs all finish at their
    first attempt; without a LISTEN connection the worker polls, and says so."""
    total = 400
    await set_up(private_server.dsn(), [("test_record", {}), ("test_noop", {})] * (total // 2))
    w = worker(pgbouncer.dsn(), ("test_record", "test_noop"), until_empty=False, slots=8,
               pooler="transaction", poll_interval=5.0)
    assert w.poll_interval == POLL_ONLY_INTERVAL
    await run_until_done(private_server.dsn(), [w], total)
    assert await attempts_used(private_server.dsn()) == [1]
    async with await connect(private_server.dsn()) as conn:
        assert await scalar(conn, "SELECT count(DISTINCT job_id) FROM test_runs") == total // 2
        assert await scalar(conn, "SELECT count(*) FROM test_runs") == total // 2
    assert w.not_ready() == []
    assert [note.split(":")[0] for note in w.readiness_notes()] == ["poll-only"]
    assert w.metrics.poll_only._value.get() == 1
    assert "prepared statement" not in pgbouncer.log()


async def test_behind_a_transaction_pooler_listen_goes_to_the_direct_dsn(
    private_server: PrivateServer, pgbouncer: PgBouncer,
) -> None:
    tenant = await set_up(private_server.dsn(), [])
    w = worker(pgbouncer.dsn(), ("test_record",), until_empty=False, pooler="transaction",
               listen_dsn=private_server.dsn(), poll_interval=3600.0)
    task = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: w.listening, "the worker listening on the direct DSN")
        assert w.readiness_notes() == [] and w.not_ready() == []
        async with await psycopg.AsyncConnection.connect(pgbouncer.dsn(), autocommit=True,
                                                         prepare_threshold=None) as conn:
            await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        await wait_until(lambda: _all_done(private_server.dsn(), 1),
                         "the job woken by NOTIFY done long before the hour's poll")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)


async def test_behind_a_transaction_pooler_no_setting_of_the_worker_stays_on_a_server_session(
    private_server: PrivateServer,
) -> None:
    """The lease thread set its lock and statement timeouts (a renewal period, 10 s) for its
    session: behind a transaction pooler that ran on whichever server connection the pooler
    gave it and stayed there, so other clients' statements were cancelled after 10 s. Every
    server connection the pooler holds after a worker ran keeps the server's settings."""
    binary = find_pgbouncer()
    if binary is None:
        pytest.skip("no pgbouncer found: install Debian's package (apt-get install pgbouncer)")
    bouncer = PgBouncer(binary, server_port=private_server.port, run_as=private_server.user,
                        pool_size=2)
    bouncer.start()
    try:
        await set_up(private_server.dsn(), [("test_record", {})] * 20)
        w = worker(bouncer.dsn(), ("test_record",), until_empty=False, slots=1,
                   pooler="transaction", poll_interval=0.2)
        task = asyncio.create_task(w.run())
        try:
            await wait_until(lambda: _all_done(private_server.dsn(), 20), "every job done")
            found = await _server_sessions_settings(bouncer.dsn(), 2)
        finally:
            w.stop()
            await asyncio.wait_for(task, DEADLINE)
        assert found == [("0", "0", "on", "on", "0")] * 2
    finally:
        bouncer.remove()


@pytest.mark.parametrize("direct", [True, False], ids=["direct-dsn", "no-direct-dsn"])
async def test_behind_a_transaction_pooler_an_index_build_takes_its_session_past_it(
    private_server: PrivateServer, pgbouncer: PgBouncer, direct: bool,
) -> None:
    """An online index build holds a session advisory lock and session timeouts across its
    statements: through a transaction pooler each statement met any server connection, the
    lock stayed on one (every later build waited for it) and the settings with it, under other
    clients. It goes straight to PostgreSQL (the worker's JOBPOOL_LISTEN_DSN); with no such
    DSN the job goes to the DLQ at once, naming it."""
    tenant = await set_up(private_server.dsn(), [])
    async with await connect(private_server.dsn()) as conn:
        type_id = await scalar(conn, "INSERT INTO mdm.ddm_entity_type (tenant_id, type_key,"
                               " is_external_source_target) VALUES (%s, 'supplier', true)"
                               " RETURNING id", (tenant,))
        assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job"
                            " WHERE job_kind = 'gin_backfill'") == 1
    async with recording_proxy(private_server.dsn()) as (direct_dsn, sent_direct):
        w = worker(pgbouncer.dsn(), ("gin_backfill",), pooler="transaction",
                   listen_dsn=direct_dsn if direct else None)
        await asyncio.wait_for(w.run(), DEADLINE)
    async with await connect(private_server.dsn()) as conn:
        cur = await conn.execute("SELECT status::text AS status, attempts, last_error"
                                 " FROM mdm.aa_job WHERE job_kind = 'gin_backfill'")
        job = await cur.fetchone()
        gin = await scalar(conn, "SELECT gin_index_status::text FROM mdm.ddm_entity_type"
                           " WHERE id = %s", (type_id,))
        advisory = await scalar(conn, "SELECT count(*) FROM pg_locks"
                                " WHERE locktype = 'advisory'")
    assert job is not None
    sent = b"".join(sent_direct)
    if direct:
        assert (job["status"], job["attempts"], gin) == ("done", 1, "active")
        assert b"pg_try_advisory_lock" in sent and b"CREATE INDEX CONCURRENTLY" in sent
    else:
        assert (job["status"], job["attempts"]) == ("dlq", 1)
        assert "NoSessionError" in job["last_error"]
        assert "JOBPOOL_LISTEN_DSN" in job["last_error"]
        assert sent == b""
    assert advisory == 0


async def _server_sessions_settings(dsn: str, count: int) -> list[tuple[str, ...]]:
    """The settings a worker sets for its own sessions, as `count` clients in transactions at
    once (so on `count` server connections of the pooler) find them."""
    clients = [await psycopg.AsyncConnection.connect(dsn, prepare_threshold=None)
               for _ in range(count)]
    try:
        found = []
        for conn in clients:
            cur = await conn.execute(
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
                " current_setting('enable_seqscan'), current_setting('jit'),"
                " current_setting('idle_session_timeout')")
            found.append(tuple(await cur.fetchone() or ()))
        return found
    finally:
        for conn in clients:
            await conn.close()


async def test_behind_a_session_pooler_a_concurrent_index_build_names_what_it_waits_for(
        private_server: PrivateServer, session_pgbouncer: PgBouncer,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The backend pid a pooler tells its client is not the server's: the migration asks the
    server for its own to find what its CONCURRENTLY step waits for, and names it."""
    from jobpool.db import migrate as migrations_module
    from jobpool.sql import migrations
    monkeypatch.setattr(migrations_module, "WAIT_REPORT_EVERY", 0.1)
    version = next(v for v, name, _ in migrations() if name == "running_by_id")
    async with await psycopg.AsyncConnection.connect(
            session_pgbouncer.dsn(), autocommit=True, row_factory=dict_row) as conn:
        assert conn.info.backend_pid != await scalar(conn, "SELECT pg_backend_pid()")
        await conn.execute("DELETE FROM mdm.jobpool_migration WHERE version = %s", (version,))
        holder = await psycopg.AsyncConnection.connect(private_server.dsn(),
                                                       application_name="nightly-report")
        await holder.execute("SELECT count(*) FROM mdm.aa_job")  # a snapshot held open
        migration = asyncio.create_task(migrate(conn, lock_timeout=0.3, lock_wait=1.0))
        try:
            await wait_until(lambda: any(
                "a CONCURRENTLY step waits" in r.getMessage()
                and f"pid {holder.info.backend_pid} " in r.getMessage()
                and "'nightly-report'" in r.getMessage() for r in caplog.records),
                "the open transaction named")
        finally:
            await holder.close()
        assert await migration == [f"{version:04d}_running_by_id"]


async def test_a_serializable_default_sends_nothing_to_the_dlq_and_strands_nothing(
    dsn: str,
) -> None:
    """The database defaults to SERIALIZABLE: the worker's own transactions are READ
    COMMITTED regardless; a handler that asks for SERIALIZABLE and conflicts is handed back
    and runs again, its attempt not counted (its kind allows one)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        name = conn.info.dbname
        await conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation"
                                   " = serializable").format(sql.Identifier(name)))
    conflicting = 60
    jobs = ([("test_record", {}), ("test_noop", {})] * 170
            + [("test_counter_serializable", {})] * conflicting)
    await set_up(dsn, jobs)
    workers = [worker(dsn, ("test_record", "test_noop", "test_counter_serializable"),
                      until_empty=False, slots=4, poll_interval=0.2) for _ in range(2)]
    await run_until_done(dsn, workers, len(jobs))
    assert await statuses(dsn) == {"done": len(jobs)}
    assert await attempts_used(dsn) == [1]
    async with await connect(dsn) as conn:
        assert await scalar(conn, "SHOW default_transaction_isolation") == "serializable"
        assert await scalar(conn, "SELECT n FROM test_counter") == conflicting


@pytest.mark.parametrize("pooled", [False, True], ids=["direct", "transaction-pooler"])
async def test_under_a_serializable_default_every_connection_of_its_own_reads_committed(
    private_server: PrivateServer, pgbouncer: PgBouncer, pooled: bool,
) -> None:
    """The lease thread's renewals, heartbeats and recovery, the maintenance steps and the
    operator's counts ran at the database's default isolation: under SERIALIZABLE a renewal
    failed on concurrent `done`s ("lease thread failing: SerializationFailure"), and behind a
    transaction pooler a one-off drain refused to start. Each states READ COMMITTED."""
    async with await connect(private_server.dsn()) as conn:
        await conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation"
                                   " = serializable").format(sql.Identifier(conn.info.dbname)))
    dsn = pgbouncer.dsn() if pooled else private_server.dsn()
    keeper = LeaseKeeper(dsn, worker_id="h/1/keeper", actor="w", lease=30.0, recover=False,
                         transaction_pooler=pooled)
    lease = keeper._connection()
    try:
        with keeper._bounded(lease):
            leased = lease.execute(ISOLATION).fetchone()
    finally:
        keeper._drop_connection()

    async def step(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        return {"read_committed": int(await _isolation(conn) == "read committed")}

    maintained = await run_due_steps(dsn, [("isolation", step)], transaction_pooler=pooled)
    counter = LaneCounter()
    try:
        counted = await counter._answer(dsn, _isolation)
    finally:
        await counter.close()
    assert leased is not None and leased["transaction_isolation"] == "read committed"
    assert maintained == {"read_committed": 1}
    assert counted == "read committed"


ISOLATION = "SELECT current_setting('transaction_isolation') AS transaction_isolation"


async def _isolation(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute(ISOLATION)
    row = await cur.fetchone()
    assert row is not None
    return str(row["transaction_isolation"] if isinstance(row, dict) else row[0])


async def test_a_read_only_default_lifted_lets_the_worker_start_on_fresh_sessions(
    dsn: str, limited_role: Any, tenant: uuid.UUID,
) -> None:
    """A role whose sessions begin read-only: the worker waits, not ready, naming it. Its
    pooled sessions began read-only and stay so after the role's default is lifted: it
    stayed not ready for good, its jobs pending. After a refused arrival the next takes a
    fresh pool."""
    limited = await limited_role(-1)
    role = sql.Identifier(conninfo_to_dict(limited)["user"])
    async with await connect(dsn) as conn:
        await conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on")
                           .format(role))
        await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 3)
    w = worker(limited, ("test_record",), until_empty=False, slots=2, poll_interval=0.2)
    task = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: any("read-only" in p for p in w.not_ready()),
                         "the worker not ready, naming the read-only transaction")
        async with await connect(dsn) as conn:
            await conn.execute(sql.SQL("ALTER ROLE {} RESET default_transaction_read_only")
                               .format(role))
        await wait_until(lambda: _done(dsn, 3), "every job done once the role may write")
        assert w.not_ready() == []
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
    assert await attempts_used(dsn) == [1]


async def test_the_api_behind_a_session_pooler_answers_503_when_its_sessions_were_closed(
    private_server: PrivateServer, session_pgbouncer: PgBouncer,
) -> None:
    """The server closed the API's pooled sessions (a restart, an idle timeout): behind a
    session pooler psycopg raises InternalError ("received 2 results from command 'BEGIN
    ...'") on the next call, which the API answered with 500s, one per dead session. Now a
    lost connection: 503 until a new pool answers."""
    await set_up(private_server.dsn(), [])
    async with serving(session_pgbouncer.dsn()) as api:
        assert (await api.call("GET", "/v1/stats", bearer=token()))[0] == 200
        async with await connect(private_server.dsn()) as conn:
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                               " WHERE backend_type = 'client backend'"
                               " AND pid <> pg_backend_pid()")
        answers = [(await api.call("GET", "/v1/stats", bearer=token()))[0] for _ in range(3)]
        await wait_until(
            lambda: _answers(api, 200), "the API serving again from a new pool")
    assert 500 not in answers and answers[0] == 503


async def _answers(api: Client, status: int) -> bool:
    return (await api.call("GET", "/v1/stats", bearer=token()))[0] == status


async def test_the_api_answers_a_read_only_database_with_503_and_writes_once_it_may(
    dsn: str, limited_role: Any, tenant: uuid.UUID,
) -> None:
    """A role whose sessions begin read-only: a pause was a 500 "unexpected error", and still
    after the role's default was lifted (the pool's sessions keep the default they began
    with). Now 503 naming it, and a new pool once the default is lifted."""
    limited = await limited_role(-1)
    role = sql.Identifier(conninfo_to_dict(limited)["user"])
    async with await connect(dsn) as conn:
        await conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on")
                           .format(role))
    path = "/v1/pauses?tenant=acme&kind=test_record"
    async with serving(limited) as api:
        status, body, _ = await api.call("POST", path, bearer=token())
        assert (status, body["detail"]) == (503, "the database refuses writes now (a "
                                                 "read-only transaction: default_transaction_"
                                                 "read_only, or a standby); try again later")
        async with await connect(dsn) as conn:
            await conn.execute(sql.SQL("ALTER ROLE {} RESET default_transaction_read_only")
                               .format(role))
        await wait_until(lambda: _paused(api, path), "the pause written")


async def _paused(api: Client, path: str) -> bool:
    return (await api.call("POST", path, bearer=token()))[0] in (200, 201)


async def test_a_restart_under_running_jobs_hands_them_back_unspent(
    private_server: PrivateServer,
) -> None:
    """Jobs whose connection died with the server run again once it is back, without using
    an attempt (their kind allows one) and without a retry's backoff."""
    running = 4
    await set_up(private_server.dsn(), [("test_slow_write", {"seconds": 2.0})] * running)
    w = worker(private_server.dsn(), ("test_slow_write",), until_empty=False, slots=running,
               poll_interval=0.2)
    task = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: _running(private_server.dsn(), running), "all jobs running")
        await asyncio.to_thread(private_server.restart)
        await wait_until(lambda: _all_done(private_server.dsn(), running), "every job done")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
    assert await attempts_used(private_server.dsn()) == [1]
    async with await connect(private_server.dsn()) as conn:
        assert await scalar(conn, "SELECT count(*) FROM test_runs") == running
        assert await scalar(conn, "SELECT count(*) FROM test_slow_starts") >= running


async def _running(dsn: str, count: int) -> bool:
    return (await statuses(dsn)).get("running", 0) == count


@pytest.fixture
async def limited_role(dsn: str) -> Any:
    """A role of the test's own (no superuser: CONNECTION LIMIT binds it), granted the
    schema; yields a function setting its limit and returning its DSN."""
    role = f"jobpool_limited_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await prepare(conn)
        ident = sql.Identifier(role)
        await conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        for grant in ("GRANT USAGE ON SCHEMA mdm TO {}",
                      "GRANT ALL ON ALL TABLES IN SCHEMA mdm TO {}",
                      "GRANT ALL ON ALL SEQUENCES IN SCHEMA mdm TO {}",
                      "GRANT ALL ON test_runs TO {}"):
            await conn.execute(sql.SQL(grant).format(ident))

        async def limit(connections: int) -> str:
            await conn.execute(sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(
                ident, sql.Literal(connections)))
            return role_dsn(dsn, role)

        try:
            yield limit
        finally:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,))
            await conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            await conn.execute(sql.SQL("DROP ROLE {}").format(ident))


async def test_a_role_limit_below_the_need_starts_fewer_slots_and_runs_everything(
    dsn: str, limited_role: Any, tenant: uuid.UUID,
) -> None:
    """CONNECTION LIMIT 8 against 4 slots (10 connections wanted): the worker starts with the
    2 slots that fit, says so, and runs every job, instead of holding all 8 connections
    while claiming nothing."""
    limited = await limited_role(8)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 10)
    w = worker(limited, ("test_record",), until_empty=False, slots=4, poll_interval=0.2)
    await run_until_done(dsn, [w], 10)
    assert w.slots == 2
    assert w.metrics.slots._value.get() == 2
    assert w.metrics.configured_slots._value.get() == 4
    assert w.readiness_notes() == [
        "running 2 of 4 slot(s): the worker needs 10 (4 slot(s) + own writes + claims + leases "
        "+ probe + LISTEN + maintenance) connections, role "
        f"{conninfo_to_dict(limited)['user']}'s CONNECTION LIMIT 8 - 0 in use by others "
        "leaves 8"]


async def test_the_budget_counts_the_workers_own_sessions_as_its_own(
    dsn: str, limited_role: Any,
) -> None:
    """After an outage the lease thread and LISTEN connect again before the budget is read:
    taken for other clients', they left the worker fewer connections than it had, down to
    none (not ready for good, its claimed jobs leased and never run). Sessions this process
    opened count as its own; others' still count as others'."""
    limited = await limited_role(10)
    own = [await connections.connect(limited, autocommit=True) for _ in range(3)]
    others = [await psycopg.AsyncConnection.connect(limited, autocommit=True) for _ in range(2)]
    try:
        allowance = await connection_allowance(limited, timeout=10)
    finally:
        for conn in own + others:
            await conn.close()
    assert (allowance.role_in_use, allowance.held) == (6, 4)
    assert allowance.free() == (8, f"role {conninfo_to_dict(limited)['user']}'s CONNECTION "
                                   "LIMIT 10 - 2 in use by others")


async def test_a_running_workers_sessions_are_all_counted_as_its_own(
    dsn: str, limited_role: Any, tenant: uuid.UUID,
) -> None:
    """Its lease thread's, claims', LISTEN's and slots' sessions, each opened its own way."""
    limited = await limited_role(20)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    w = worker(limited, ("test_record",), until_empty=False, slots=2, poll_interval=0.2)
    task = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: _done(dsn, 1), "the job done")
        await wait_until(lambda: w.listening, "the worker listens")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT pid, application_name, query FROM pg_stat_activity WHERE usename = %s",
                (conninfo_to_dict(limited)["user"],))
            sessions = await cur.fetchall()
        own = set(own_backend_pids())
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
    names = {name for _, name, _ in sessions}
    assert {"jobpool-leases", "jobpool-claims"} <= names, sessions
    assert any(query.startswith("LISTEN") for _, _, query in sessions), sessions
    assert {pid for pid, _, _ in sessions} <= own, (sessions, own)


async def _done(dsn: str, count: int) -> bool:
    return (await statuses(dsn)).get("done", 0) == count


async def test_a_role_limit_too_small_for_one_slot_is_refused_naming_it(
    dsn: str, limited_role: Any,
) -> None:
    limited = await limited_role(6)
    w = worker(limited, ("test_record",), until_empty=False, slots=4)
    with pytest.raises(jobpool.ConnectionBudgetError, match=r"CONNECTION LIMIT 6 .* needs 10"):
        await asyncio.wait_for(w.run(), DEADLINE)


JOB_END_FUNCTIONS = ("mdm.aa_job_end(bigint, integer, text, text, jsonb), "
                     "mdm.aa_job_done(bigint, integer, text, text, jsonb, boolean), "
                     "mdm.aa_reset_session()")


async def test_a_role_that_may_not_execute_the_job_end_functions_is_told_so_at_start(
    dsn: str, limited_role: Any, tenant: uuid.UUID,
) -> None:
    """Default privileges that keep EXECUTE from PUBLIC: a drain does not start (a served
    worker waits, not ready) and names the GRANT, instead of having every writing job's
    `done` refused; once granted, the same worker runs the job."""
    limited = await limited_role(20)
    role = conninfo_to_dict(limited)["user"]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                     row_factory=dict_row) as conn:
        await conn.execute(f"REVOKE EXECUTE ON FUNCTION {JOB_END_FUNCTIONS} FROM PUBLIC")
        job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
        with pytest.raises(SchemaPrivilegeError,
                           match=f"role {role} may not execute mdm.aa_job_end, "
                                 "mdm.aa_job_done or mdm.aa_reset_session.*"
                                 "GRANT EXECUTE ON FUNCTION"):
            await worker(limited, ("test_record",)).run()
        assert (await helpers.job(conn, job_id))["status"] == "pending"
        await conn.execute(sql.SQL(f"GRANT EXECUTE ON FUNCTION {JOB_END_FUNCTIONS} TO {{}}")
                           .format(sql.Identifier(role)))
        await worker(limited, ("test_record",)).run()
        assert (await helpers.job(conn, job_id))["status"] == "done"


@pytest.mark.parametrize(("setting", "problem"), [
    ("default_transaction_read_only = on", "ReadOnlySqlTransaction"),
    ("statement_timeout = '1ms'", "QueryCanceled"),
])
async def test_a_one_off_drain_the_database_refuses_ends_naming_why(
    dsn: str, limited_role: Any, setting: str, problem: str,
) -> None:
    """A read-only role, or a statement timeout its statements cannot meet: a long-running
    worker waits (not ready) for that to be mended; a one-off drain, which nobody restarts,
    waited without end, logging tracebacks (the timeout as "database unreachable"). The
    timeout may already refuse the drain's first probe, which ended it with the server's bare
    message: it says the same as a refusal after."""
    limited = await limited_role(-1)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        role = conninfo_to_dict(limited)["user"]
        await conn.execute(sql.SQL(f"ALTER ROLE {{}} SET {setting}").format(sql.Identifier(role)))
    w = worker(limited, ("test_record",), until_empty=True)
    with pytest.raises(StartRefusedError, match=rf"refused the start of this one-off drain "
                                                rf"\({problem}: "):
        await asyncio.wait_for(w.run(), DEADLINE)


async def test_a_role_idle_session_timeout_closes_none_of_the_workers_sessions(
    dsn: str, limited_role: Any, tenant: uuid.UUID, caplog: pytest.LogCaptureFixture,
) -> None:
    """A role whose sessions the server closes after 1 s idle: the worker's LISTEN, claim,
    lease and slot sessions wait idle by design, and were closed again and again (each time
    "database connection lost", claims paused, /readyz red). They turn the timeout off for
    themselves, slots again after each writing job's session reset, which brings it back."""
    caplog.set_level(logging.WARNING)
    limited = await limited_role(-1)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        role = conninfo_to_dict(limited)["user"]
        await conn.execute(sql.SQL("ALTER ROLE {} SET idle_session_timeout = '1s'").format(
            sql.Identifier(role)))
        await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 4)
    w = worker(limited, ("test_record",), until_empty=False, slots=2, poll_interval=0.2)
    task = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: _done(dsn, 4), "the first jobs done")
        await asyncio.sleep(2.5)  # every session idle past the role's timeout
        assert w.not_ready() == []
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 4)
        await wait_until(lambda: _done(dsn, 8), "the later jobs done")
        await asyncio.sleep(2.5)
        assert w.not_ready() == []
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
    assert await attempts_used(dsn) == [1]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_command_the_database_refuses_says_it_is_the_databases_error(
    dsn: str, limited_role: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command printed the server's bare message ("jobpool: error: cannot execute INSERT in
    a read-only transaction", "canceling statement due to statement timeout"), naming neither
    the database nor what kind of failure it was."""
    limited = await limited_role(-1)
    async with await connect(dsn) as conn:
        await conn.execute(sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on")
                           .format(sql.Identifier(conninfo_to_dict(limited)["user"])))
    monkeypatch.setattr(settings_module, "_current", None)  # main() configures the process's
    assert await asyncio.to_thread(main, ["tenants", "add", "initech", "--dsn", limited]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "jobpool: error: database error (ReadOnlySqlTransaction): cannot execute INSERT in a "
        "read-only transaction")


async def test_behind_a_session_pooler_sessions_the_server_closed_are_opened_again_unseen(
    private_server: PrivateServer, session_pgbouncer: PgBouncer,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every session closed by the server (a restart) while the worker idles behind a session
    pooler: the lease thread's next BEGIN met the closing message (psycopg's InternalError,
    "received 2 results"), and it reported itself failing, /readyz red, until a later round.
    It opens its connection again at once; every later job runs once."""
    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(leases_module, "RECOVER_EVERY", 0.2)  # a BEGIN every 0.2 s
    tenant = await set_up(private_server.dsn(), [("test_record", {})] * 10)
    w = worker(session_pgbouncer.dsn(), ("test_record",), until_empty=False, slots=2,
               poll_interval=0.2)
    task = asyncio.create_task(w.run())
    try:
        await wait_until(lambda: _all_done(private_server.dsn(), 10), "the first jobs done")
        async with await connect(private_server.dsn()) as conn:
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                               " WHERE backend_type = 'client backend'"
                               " AND pid <> pg_backend_pid()")
        await asyncio.sleep(1.0)  # the lease thread's next rounds meet its closed session
        async with await connect(private_server.dsn()) as conn:
            await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 10)
        await wait_until(lambda: _all_done(private_server.dsn(), 20), "the later jobs done")
    finally:
        w.stop()
        await asyncio.wait_for(task, DEADLINE)
    assert await attempts_used(private_server.dsn()) == [1]
    assert not [r for r in caplog.records if "lease thread failing" in r.getMessage()]
