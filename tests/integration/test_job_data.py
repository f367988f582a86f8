"""One job's data never stops the worker or strands its neighbours.

Whatever a handler returns or raises, and whatever a payload holds, only that job fails:
the worker keeps running and the other jobs of its claim and completion batch finish.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar
from jobpool import admin
from jobpool.db.connect import connect

Conn = psycopg.AsyncConnection[dict[str, Any]]

EXPECTED_ERRORS = {
    "nul_result": "PermanentError: handler returned a result that cannot be stored: result.t "
                  "contains a NUL character (\\u0000), which PostgreSQL cannot store",
    "surrogate_result": "PermanentError: handler returned a result that cannot be stored: "
                        "result.t contains a lone surrogate (U+D800) at index 1, which is not "
                        "valid Unicode",
    "nan_result": "PermanentError: handler returned a result that cannot be stored: result.x "
                  "is nan, which JSON cannot hold",
    "object_result": "PermanentError: handler returned a result that cannot be stored: "
                     "result.x is of type object, which is not JSON",
    "deep_result": "PermanentError: handler returned a result that cannot be stored: result is "
                   "nested more than 100 levels deep",
    "list_result": "PermanentError: handler returned list, expected a mapping or None",
    "nul_error": "RuntimeError: a\\x00b",
    "surrogate_error": "RuntimeError: x\\ud800y",
    "exit": "HandlerExit: handler raised SystemExit: 3; a handler must not stop the worker",
    "unprintable_error": "Unprintable: (its message could not be built: RuntimeError)",
    "exit_in_str": "ExitInStr: (its message could not be built: SystemExit)",
    "interrupt_in_repr": "InterruptInRepr: (its message could not be built: KeyboardInterrupt)",
    "cancel_in_str": "CancelInStr: (its message could not be built: CancelledError)",
    "base_exit_in_str": "HandlerExit: handler raised BaseExitInStr: (its message could not be "
                        "built: SystemExit); a handler must not stop the worker",
    "exit_on_iter_result": "PermanentError: handler returned a result that cannot be stored: "
                           "SystemExit: 6",
    "own_timeout": "TimeoutError: smtp server did not answer in 30s",
}


async def second_tenant(conn: Conn) -> uuid.UUID:
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('globex') RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


async def normal_jobs(conn: Conn, tenants: list[uuid.UUID], count: int = 12,
                      kind: str = "test_noop") -> list[int]:
    """`count` jobs of `kind` (no-op ones, or `test_record`, whose handler writes and so ends
    on its slot connection) with max_attempts 1, spread over `tenants`: one lost attempt
    would put them in the DLQ."""
    made = await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenants[n % len(tenants)], kind, {"n": n}, max_attempts=1)
        for n in range(count)])
    return [m.id for m in made]


async def statuses(conn: Conn, ids: list[int]) -> set[str]:
    return {(await job(conn, i))["status"] for i in ids}


async def test_whatever_a_handler_returns_or_raises_only_its_job_fails(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    normal = await normal_jobs(conn, [tenant, await second_tenant(conn)])
    bad = {}
    for do in EXPECTED_ERRORS:
        for write in (False, True):
            bad[(do, write)] = (await jobpool.enqueue(
                conn, tenant_id=tenant, kind="test_misbehave",
                payload={"do": do, "write": write})).id
    normal += await normal_jobs(conn, [tenant])

    await run_until_empty(dsn, "test_noop", "test_misbehave", slots=8)

    assert await statuses(conn, normal) == {"done"}
    for (do, _), job_id in bad.items():
        row = await job(conn, job_id)
        assert (row["status"], row["attempts"]) == ("dlq", 1), (do, row)
        assert row["last_error"].startswith(EXPECTED_ERRORS[do]), (do, row["last_error"])
    assert await scalar(conn, "SELECT count(*) FROM test_runs") == 0  # all rolled back
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'running'") == 0


async def test_a_payload_too_deep_to_decode_goes_to_the_dlq_at_claim(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Written by SQL past enqueue's checks: the claim that holds it runs its other jobs."""
    await prepare(conn)
    normal = await normal_jobs(conn, [tenant, await second_tenant(conn)])
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts) "
        "SELECT %s, 'test_noop', p::jsonb, 5 FROM unnest(%s::text[]) AS p RETURNING id",
        (tenant, ['{"a":' * 980 + "1" + "}" * 980, '{"n": ' + "7" * 5000 + "}", "[1, 2]"]))
    deep, long_number, array = [row["id"] for row in await cur.fetchall()]

    await run_until_empty(dsn, "test_noop", slots=8)

    assert await statuses(conn, normal) == {"done"}
    assert await outcome(conn, deep) == (
        "dlq", "PermanentError: payload cannot be decoded: nested 980 levels deep, more than "
        "the limit of 100")
    status, error = await outcome(conn, long_number)
    assert status == "dlq"
    assert error.startswith("PermanentError: payload cannot be decoded: ValueError: Exceeds "
                            "the limit (4300 digits)")
    assert await outcome(conn, array) == (
        "dlq", "PermanentError: payload must be a JSON object, got array")


async def outcome(conn: Conn, job_id: int) -> tuple[str, str]:
    """Status and last error (this test connection decodes payloads with plain json)."""
    cur = await conn.execute("SELECT status::text AS status, last_error FROM mdm.aa_job "
                             "WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None
    return row["status"], row["last_error"]


REFUSALS = {
    # a constraint the result breaks (an integrity violation)
    "check": ("CHECK (result IS NULL OR NOT result ? 'refuse')",
              "CheckViolation: new row for relation \"aa_job\" violates check constraint "
              "\"test_refuse_result\")"),
    # a result past a server limit (SQLSTATE class 54, as jsonb past 256 MB is): raised
    # here by a function, as a result of that size would be
    "limit": ("CHECK (result IS NULL OR NOT test_past_limit(result))",
              "ProgramLimitExceeded: total size of jsonb object elements exceeds the maximum "
              "of 268435455 bytes)"),
}


@pytest.mark.parametrize("writes", [False, True], ids=["batched", "writing"])
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
async def test_a_done_the_database_refuses_fails_its_job_alone(
    conn: Conn, dsn: str, tenant: uuid.UUID, refusal: str, writes: bool
) -> None:
    """A `done` the database refuses for the result it records fails that job alone, to the
    DLQ naming the refusal without the result's text: in a batch (recorded job by job, the
    rest of its batch done) and in a writing job's transaction (its write rolled back)."""
    await prepare(conn)
    await conn.execute(
        "CREATE FUNCTION test_past_limit(result jsonb) RETURNS boolean IMMUTABLE"
        " LANGUAGE plpgsql AS $$ BEGIN IF result ? 'refuse' THEN RAISE EXCEPTION"
        " 'total size of jsonb object elements exceeds the maximum of 268435455 bytes'"
        " USING ERRCODE = 'program_limit_exceeded'; END IF; RETURN false; END $$")
    constraint, error = REFUSALS[refusal]
    await conn.execute(f"ALTER TABLE mdm.aa_job ADD CONSTRAINT test_refuse_result {constraint}")
    normal = await normal_jobs(conn, [tenant, await second_tenant(conn)], count=30)
    refused = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_misbehave",
                                     payload={"do": "refused_result", "write": writes})).id
    normal += await normal_jobs(conn, [tenant], count=30)

    await run_until_empty(dsn, "test_noop", "test_misbehave", slots=8)

    assert await statuses(conn, normal) == {"done"}
    row = await job(conn, refused)
    assert (row["status"], row["attempts"]) == ("dlq", 1)
    assert row["last_error"] == (
        f"ResultRefused: the database refused to record the job done with its result ({error}")
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                        (refused,)) == 0


TEN_YEARS = 10 * 365 * 86_400


@pytest.mark.parametrize(("delay", "far"), [("inf", True), ("1e300", True), ("nan", False),
                                            ("-5", False)])
async def test_any_retry_after_delay_is_stored(
    conn: Conn, dsn: str, tenant: uuid.UUID, delay: str, far: bool
) -> None:
    """An out-of-range RetryAfter is cut to 0 .. 10 years instead of failing to be stored
    (which left the job running until its stale TTL)."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_retry_after",
                                    payload={"delay": delay})).id
    await run_until_empty(dsn, "test_retry_after")
    cur = await conn.execute(
        "SELECT status::text AS status, attempts, last_error, "
        "extract(epoch FROM available_at - now())::float8 AS wait FROM mdm.aa_job WHERE id = %s",
        (job_id,))
    row = await cur.fetchone()
    assert row is not None
    if far:
        assert (row["status"], row["attempts"]) == ("pending", 1), row
        assert TEN_YEARS - 3600 < row["wait"] <= TEN_YEARS
    else:  # a delay of 0: retried at once until out of attempts
        assert (row["status"], row["attempts"]) == ("dlq", 3), row
    assert row["last_error"] == "RetryAfter: not yet"


async def test_a_handlers_own_json_loader_ends_with_its_job(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """`set_json_loads(json.loads, tx)` on the pooled connection: a later claim of a payload
    3000 levels deep is still read with jobpool's loader (to the DLQ, not a RecursionError
    that stops the worker)."""
    await prepare(conn)
    await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenant, "test_abuse_tx", {"do": "json_loader"}, priority=0)
        for _ in range(8)])
    normal = await normal_jobs(conn, [tenant])
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts) "
        "SELECT %s, 'test_noop', %s::jsonb, 1 FROM generate_series(1, 4) RETURNING id",
        (tenant, '{"a":' * 3000 + "1" + "}" * 3000))
    deep = [row["id"] for row in await cur.fetchall()]

    await run_until_empty(dsn, "test_noop", "test_abuse_tx", slots=2)

    assert await statuses(conn, normal) == {"done"}
    for job_id in deep:
        assert await outcome(conn, job_id) == (
            "dlq", "PermanentError: payload cannot be decoded: nested 3000 levels deep, more "
                   "than the limit of 100")


async def test_a_handler_that_leaves_its_transaction_under_another_role_is_told_why(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """`SET LOCAL ROLE` without a RESET ROLE: the worker's done, in the same transaction, is
    refused; the job goes to the DLQ at once with the reason, not a bare permission error."""
    await prepare(conn)
    abused = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_abuse_tx",
                                    payload={"do": "local_role"})).id
    normal = await normal_jobs(conn, [tenant], count=20)
    await run_until_empty(dsn, "test_noop", "test_abuse_tx", slots=1)
    status, error = await outcome(conn, abused)
    assert status == "dlq"
    assert error.startswith("PermanentError: the job's done, written in its transaction, was "
                            "refused under the role the handler left that transaction in")
    assert "InsufficientPrivilege" in error
    assert await statuses(conn, normal) == {"done"}


async def test_a_handler_that_leaves_its_transaction_read_only_is_told_why(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Its done was refused on every attempt, retried as if the failure could pass."""
    await prepare(conn)
    abused = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_abuse_tx",
                                    payload={"do": "read_only_transaction"},
                                    max_attempts=5)).id
    await run_until_empty(dsn, "test_abuse_tx", slots=1)
    status, error = await outcome(conn, abused)
    assert (status, (await job(conn, abused))["attempts"]) == ("dlq", 1)
    assert error.startswith("PermanentError: the job's done, written in its transaction, was "
                            "refused: the handler made that transaction read-only")


async def test_a_handlers_prepared_statements_end_with_its_job(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """A handler that left prepared statements named as psycopg names its own (`_pg3_0`,
    ...) fails no later job, claim or `done` on that connection."""
    await prepare(conn)
    abuse = [m.id for m in await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenant, "test_abuse_tx", {"do": "prepare"}, priority=0)
        for _ in range(4)])]
    normal = await normal_jobs(conn, [tenant, await second_tenant(conn)], count=200,
                               kind="test_record")

    await run_until_empty(dsn, "test_record", "test_abuse_tx", slots=1)

    assert await statuses(conn, [*abuse, *normal]) == {"done"}


async def test_a_handler_deallocating_psycopgs_statements_fails_no_later_job(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Deallocating the statements psycopg prepared on that connection (its claim, its
    `done`) one by one, which psycopg cannot notice: the connection is replaced instead of
    failing the next job that uses it."""
    await prepare(conn)
    tenants = [tenant, await second_tenant(conn)]
    normal = await normal_jobs(conn, tenants, count=60, kind="test_record")
    abuse = [m.id for m in await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenant, "test_abuse_tx", {"do": "deallocate_all"}) for _ in range(6)])]
    normal += await normal_jobs(conn, tenants, count=120, kind="test_record")

    await run_until_empty(dsn, "test_record", "test_abuse_tx", slots=1)

    assert await statuses(conn, normal) == {"done"}
    # the handler's own `done`, on the connection it broke, may fail: its job alone
    assert await statuses(conn, abuse) <= {"done", "dlq"}


async def test_claims_failing_on_a_live_connection_do_not_stop_the_worker(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The first three claims fail with an error that is not a lost connection: the worker
    replaces its connections, claims again after a pause, and runs every job."""
    await prepare(conn)
    await conn.execute("""
        CREATE SEQUENCE test_claim_failures;
        CREATE FUNCTION test_refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('test_claim_failures') <= 3 THEN
                RAISE EXCEPTION 'claim refused for the test';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER test_refuse_claim BEFORE UPDATE ON mdm.aa_job FOR EACH ROW
            WHEN (OLD.status = 'pending' AND NEW.status = 'running')
            EXECUTE FUNCTION test_refuse_claim();
    """)
    normal = await normal_jobs(conn, [tenant, await second_tenant(conn)], count=20)

    await run_until_empty(dsn, "test_noop", slots=4)

    assert await statuses(conn, normal) == {"done"}
    assert await scalar(conn, "SELECT last_value FROM test_claim_failures") > 3


async def drop_time_checks(conn: Conn) -> None:
    """As a database migrated before the checks on job times existed."""
    cur = await conn.execute("SELECT conname FROM pg_constraint "
                             "WHERE conname LIKE 'aa_job_%%_in_range'")
    for row in await cur.fetchall():
        await conn.execute(f'ALTER TABLE mdm.aa_job DROP CONSTRAINT "{row["conname"]}"')


async def test_jobs_with_times_python_cannot_hold_run_and_stay_readable(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """'-infinity', 'infinity' and year 10000, written by SQL: the claim holding them runs its
    other jobs, and the admin reads (job, DLQ list) show them as infinity."""
    await prepare(conn)
    await drop_time_checks(conn)
    normal = await normal_jobs(conn, [tenant, await second_tenant(conn)])
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, available_at, created_at) "
        "VALUES (%(t)s, 'test_noop', 1, '-infinity', now()), "
        "       (%(t)s, 'test_noop', 1, now(), 'infinity'), "
        "       (%(t)s, 'test_noop', 1, now(), '10000-01-01') RETURNING id", {"t": tenant})
    odd = [row["id"] for row in await cur.fetchall()]
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, status, created_at, "
        "completed_at) VALUES (%s, 'test_noop', 1, 'dlq', '-infinity', 'infinity') "
        "RETURNING id", (tenant,))
    parked = (await cur.fetchone() or {})["id"]

    await run_until_empty(dsn, "test_noop", slots=8)

    assert {(await outcome(conn, i))[0] for i in [*normal, *odd]} == {"done"}
    async with await connect(dsn) as reader:
        shown = await admin.get_job(reader, odd[1])
        listed = await admin.list_dlq(reader)
    assert shown["created_at"].isoformat() == "infinity"
    assert shown["created_at"] > shown["completed_at"]
    assert [(r["id"], str(r["created_at"]), str(r["dlq_at"])) for r in listed] == [
        (parked, "-infinity", "infinity")]


async def test_a_transaction_that_fails_at_commit_fails_its_job_and_leaves_the_session_clean(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The COMMIT that ends a writing job also resets its session (one round trip); when the
    COMMIT fails, the job's writes and its `done` roll back, the job fails with the error, and
    the next job on the same connection inherits none of its session."""
    await prepare(conn)
    bad = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_fails_at_commit",
                                 payload={"twice": True}, priority=0)).id
    good = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_fails_at_commit",
                                  payload={"twice": False}, priority=0)).id
    probes = [m.id for m in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_session_probe")] * 3)]
    await run_until_empty(dsn, "test_fails_at_commit", "test_session_probe", slots=1)
    failed = await job(conn, bad)
    assert failed["status"] == "dlq"
    assert failed["last_error"].startswith("UniqueViolation: "), failed["last_error"]
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (bad,)) == 0
    assert (await job(conn, good))["status"] == "done"  # its temp table dropped with the reset
    assert await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (good,)) == 1
    assert await statuses(conn, probes) == {"done"}, [await job(conn, i) for i in probes]


async def test_a_writing_jobs_reset_is_not_cut_short_by_the_handlers_statement_timeout(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """The query that ends a writing job resets the session inside the job's transaction,
    before its COMMIT, without the handler's statement timeout (here 5 ms, where dropping
    500 temp tables takes far longer): cut short, the reset would roll the job back. The job
    is done with its row, and the next job on that connection inherits nothing of the
    session."""
    await prepare(conn)
    slow = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_slow_reset", priority=0,
                                  payload={"tables": 500, "timeout_ms": 5})).id
    probes = [m.id for m in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_session_probe")] * 3)]
    await run_until_empty(dsn, "test_slow_reset", "test_session_probe", slots=1)
    ran = await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (slow,))
    assert ((await job(conn, slow))["status"], ran) == ("done", 1)
    assert await statuses(conn, probes) == {"done"}, [await job(conn, i) for i in probes]


@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
@pytest.mark.parametrize("apart", [False, True], ids=["one-query", "statements-apart"])
async def test_a_writing_jobs_done_is_not_cut_short_by_the_handlers_timeouts(
    conn: Conn, dsn: str, tenant: uuid.UUID, apart: bool, setting: str
) -> None:
    """The job's `done` waits for its row's lock (here another session holds it for 300 ms
    after the handler returns) without the handler's statement or lock timeout of 5 ms: cut
    short, it would roll the job and its write back and, with one attempt, park it in the
    DLQ. So too when the job ends in statements of their own (a handler changed its
    connection's psycopg attributes). The job is done with its row, and the next jobs on that
    connection run without the timeout."""
    await prepare(conn)
    waits = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_done_waits", priority=0,
                                   payload={"hold_ms": 300, "timeout_ms": 5, "apart": apart,
                                            "setting": setting})).id
    probes = [m.id for m in await jobpool.enqueue_many(
        conn, [jobpool.NewJob(tenant, "test_session_probe")] * 3)]
    await run_until_empty(dsn, "test_done_waits", "test_session_probe", slots=1)
    ran = await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s", (waits,))
    assert ((await job(conn, waits))["status"], ran) == ("done", 1), await job(conn, waits)
    assert await statuses(conn, probes) == {"done"}, [await job(conn, i) for i in probes]
