"""The end of a job whose handler wrote: its `done`, COMMIT and session reset in one query."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kinds_for_tests
import psycopg
import pytest
from psycopg.pq import TransactionStatus

import jobpool
from integration.helpers import job, prepare, run_until_empty, scalar
from integration.test_slot_connections import client_messages
from jobpool.db.connect import RESET_BEFORE_COMMIT, NotCommittedError, open_pool, reset_session
from jobpool.db.store import CLAIM_NOT_HELD, QueueStore
from jobpool.worker.executor import JobTransaction
from jobpool.worker.slot_connections import SlotConnections

Conn = psycopg.AsyncConnection[dict[str, Any]]
WORKER = "h/1/end"
ACTOR = "o'brien \\ 100%s"
"""An actor whose name needs quoting (a quote, a backslash, a placeholder-like %s)."""
INSERT_RUN = "INSERT INTO test_runs (job_id, attempt, worker_pid) VALUES (%s, %s, 0)"


@pytest.fixture
async def claimed(conn: Conn, dsn: str, tenant: uuid.UUID) -> AsyncIterator[
        tuple[QueueStore, SlotConnections, dict[str, Any]]]:
    """A store of worker `WORKER`, one slot connection, and a test_record job it claimed."""
    await prepare(conn)
    await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    pool = open_pool(dsn, size=2)
    await pool.open()
    store = QueueStore(pool, worker_id=WORKER, actor=ACTOR)
    slots = SlotConnections(1)
    try:
        [row] = await store.claim(kinds=["test_record"], tenants=None, limit=1)
        await slots.fill(pool, timeout=5.0)
        yield store, slots, row
    finally:
        await slots.close()
        await store.close()
        await pool.close()


async def done_audits(conn: Conn, job_id: int) -> int:
    return int(await scalar(conn, "SELECT count(*) FROM mdm.aa_audit_log "
                                  "WHERE action = 'job_done' AND job_id = %s", (job_id,)))


async def runs(conn: Conn, job_id: int) -> int:
    """How many test_runs rows of job `job_id` committed."""
    return int(await scalar(conn, "SELECT count(*) FROM test_runs WHERE job_id = %s",
                            (job_id,)))


async def nothing_committed(conn: Conn, job_id: int) -> bool:
    """Whether job `job_id` is still running (no `done` committed) and none of its writes
    committed."""
    return (await job(conn, job_id))["status"] == "running" and await runs(conn, job_id) == 0


async def test_a_writing_job_takes_two_round_trips_and_commits_its_writes_with_its_done(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]], tmp_path: Path,
) -> None:
    """The handler's first statement goes out with the BEGIN; the `done`, the session reset
    and the COMMIT go out as one query, the COMMIT last: one Sync and one Query in all, one
    transaction."""
    store, slots, row = claimed
    tx = JobTransaction(slots, 0)
    taken = tx.connection()
    path = tmp_path / "trace"
    with path.open("w") as out:
        taken.pgconn.trace(out.fileno())
        await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
        await tx.end(store.done_statement(row["id"], row["attempts"], '{"n": 1}'))
        taken.pgconn.untrace()
    trace = path.read_text()
    sent = client_messages(trace)
    assert (sent.count("Sync"), sent.count("Query")) == (1, 1), sent
    records = re.split(r"\n(?=\S+ \S+\t[FB]\t)", trace)  # a message's text may span lines
    [query] = [record for record in records if "\tF\t" in record and "\tQuery\t" in record]
    assert query.rstrip().endswith('COMMIT;"'), query  # one transaction: nothing after it
    done = await job(conn, row["id"])
    assert (done["status"], done["result"], done["claimed_by"]) == ("done", {"n": 1}, WORKER)
    assert await done_audits(conn, row["id"]) == 1
    assert await runs(conn, row["id"]) == 1
    assert taken.info.transaction_status == TransactionStatus.IDLE


async def test_a_claim_lost_before_the_end_rolls_the_handlers_writes_back(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """The `done` fails (SQLSTATE JP001) before the COMMIT in its query can run: nothing the
    handler wrote commits, the other worker's claim is untouched, no audit row is written,
    and the connection is reset and serves the next job."""
    store, slots, row = claimed
    tx = JobTransaction(slots, 0)
    await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await conn.execute("UPDATE mdm.aa_job SET claimed_by = 'other/1/x' WHERE id = %s",
                       (row["id"],))
    with pytest.raises(NotCommittedError) as failed:
        await tx.end(store.done_statement(row["id"], row["attempts"], None))
    assert failed.value.error.sqlstate == CLAIM_NOT_HELD and failed.value.by_done
    after = await job(conn, row["id"])
    assert (after["status"], after["claimed_by"]) == ("running", "other/1/x")
    assert await done_audits(conn, row["id"]) == 0
    assert await runs(conn, row["id"]) == 0
    following = JobTransaction(slots, 0)
    cur = await following.execute("SELECT %s::int AS n", (5,))
    assert await cur.fetchone() == {"n": 5}
    await following.release()


async def test_a_result_the_column_refuses_is_not_committed(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """A result jsonb cannot hold (a NUL escape): the `done` fails in the transaction, so
    the handler's writes are rolled back with it and the job stays claimed."""
    store, slots, row = claimed
    tx = JobTransaction(slots, 0)
    await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
    with pytest.raises(NotCommittedError) as failed:
        await tx.end(store.done_statement(row["id"], row["attempts"],
                                          '{"t": "a\\u0000b"}'))
    assert isinstance(failed.value.error, psycopg.errors.DataError) and failed.value.by_done
    assert await nothing_committed(conn, row["id"])


async def test_the_done_statements_literals_arrive_as_they_were(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """The values go into the statement as literals: a result and an actor with quotes,
    backslashes, `%s` and non-ASCII text are stored exactly."""
    store, slots, row = claimed
    result = '{"q": "it\'s a \\\\ at 100%s, grüße", "e": "\\u00e9"}'
    tx = JobTransaction(slots, 0)
    await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await tx.end(store.done_statement(row["id"], row["attempts"], result))
    assert (await job(conn, row["id"]))["result"] == {"q": "it's a \\ at 100%s, grüße",
                                                       "e": "é"}
    assert await scalar(conn, "SELECT actor_principal_id FROM mdm.aa_audit_log "
                              "WHERE action = 'job_done' AND job_id = %s", (row["id"],)) == ACTOR


@pytest.mark.parametrize(("encoding", "text"), [
    ("LATIN1", "it's a \\ and grüße, 5 €"),  # € is not LATIN1: escaped, it needs not be
    ("SJIS", "¥100 and ¥'"),  # SJIS and EUC_JP send ¥ as the byte of a backslash
    ("EUC_JP", "¥'; COMMIT; --"),
])
async def test_literals_survive_the_quoting_and_encoding_a_handler_left(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]], encoding: str,
    text: str,
) -> None:
    """A handler that turned standard_conforming_strings off and switched the client encoding:
    the `done`'s literals (ASCII, other characters escaped) still arrive as they were, and
    the reset restores both settings."""
    store, slots, row = claimed
    tx = JobTransaction(slots, 0)
    await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await tx.execute("SET standard_conforming_strings = off")
    await tx.execute(f"SET client_encoding = '{encoding}'")
    result = json.dumps({"q": text}, ensure_ascii=False)
    await tx.end(store.done_statement(row["id"], row["attempts"], result))
    assert (await job(conn, row["id"]))["result"] == {"q": text}
    assert await scalar(conn, "SELECT actor_principal_id FROM mdm.aa_audit_log "
                              "WHERE action = 'job_done' AND job_id = %s", (row["id"],)) == ACTOR
    following = JobTransaction(slots, 0)
    cur = await following.execute(
        "SELECT current_setting('standard_conforming_strings') AS scs, "
        "current_setting('client_encoding') AS encoding, %s::int AS n", (1,))
    assert await cur.fetchone() == {"scs": "on", "encoding": "UTF8", "n": 1}
    await following.release()


async def advisory_holders(conn: Conn, key: int) -> int:
    return int(await scalar(conn, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                  "AND objid = %s AND granted", (key,)))


async def test_a_refused_end_resets_a_session_changed_through_the_handlers_own_cursor(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """A handler that wrote only through a cursor it built itself (not `tx.cursor()`): when
    the end is refused (the claim lost), the session it changed is still reset, so no session
    advisory lock of the job outlives it."""
    store, slots, row = claimed
    tx = JobTransaction(slots, 0)
    own = psycopg.AsyncClientCursor(tx.connection())
    await own.execute("SELECT pg_advisory_lock(%s)", (77001,))
    await own.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await conn.execute("UPDATE mdm.aa_job SET claimed_by = 'other/1/x' WHERE id = %s",
                       (row["id"],))
    with pytest.raises(NotCommittedError):
        await tx.end(store.done_statement(row["id"], row["attempts"], None))
    assert await advisory_holders(conn, 77001) == 0


FAILING_RESET = """
CREATE OR REPLACE FUNCTION mdm.aa_reset_session()
RETURNS TABLE (prepared integer, handler_made text[]) LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('test.fail_reset', true) = 'on' THEN
        RAISE EXCEPTION 'the reset failed';
    END IF;
    RESET ALL;
    RETURN QUERY SELECT pg_catalog.count(*)::integer, NULL::text[]
                   FROM pg_catalog.pg_prepared_statements WHERE NOT from_sql;
END
$$"""
"""A reset that fails while the session has `test.fail_reset` on: stands for a reset statement
that fails (a handler's temp table that cannot be dropped, say)."""


async def test_a_reset_that_fails_rolls_the_job_back_and_the_session_is_reset_on_its_own(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """The reset runs in the job's transaction, before its COMMIT: when it fails, nothing of
    the job committed (its writes, its `done`), and the connection is reset again after the
    rollback (which undid the handler's SETs, the failing one included), ready for the next
    job."""
    store, slots, row = claimed
    await conn.execute(FAILING_RESET)
    tx = JobTransaction(slots, 0)
    taken = tx.connection()
    own = psycopg.AsyncClientCursor(taken)
    await own.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await own.execute("SET work_mem = '1MB'")
    await own.execute("SET test.fail_reset = 'on'")
    with pytest.raises(NotCommittedError, match="the reset failed") as failed:
        await tx.end(store.done_statement(row["id"], row["attempts"], None))
    assert not failed.value.by_done  # the handler's session, not the job's result
    assert await nothing_committed(conn, row["id"])
    assert not taken.closed
    cur = await taken.execute("SELECT current_setting('work_mem') AS work_mem")
    assert await cur.fetchone() == {"work_mem": "4MB"}


DEFERRED_MARK_DDL = """
CREATE TABLE test_marked (n int);
CREATE TABLE test_marks (mark text, by_role text);
CREATE FUNCTION test_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_marks VALUES (current_setting('test.mark', true), current_user);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_mark AFTER INSERT ON test_marked
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_mark();
"""


async def test_deferred_triggers_run_under_the_handlers_settings_before_the_reset(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """A deferred constraint trigger runs at the end of the job as at a COMMIT that came
    first: under the settings the handler left, not the ones its reset brings back."""
    store, slots, row = claimed
    await conn.execute(DEFERRED_MARK_DDL)
    tx = JobTransaction(slots, 0)
    await tx.execute("SET test.mark = 'the handler''s'")
    await tx.execute("INSERT INTO test_marked VALUES (%s)", (1,))
    await tx.end(store.done_statement(row["id"], row["attempts"], None))
    cur = await conn.execute("SELECT mark, by_role = current_user AS worker_role "
                             "FROM test_marks")
    assert await cur.fetchall() == [{"mark": "the handler's", "worker_role": True}]
    assert (await job(conn, row["id"]))["status"] == "done"


async def test_a_deferred_constraint_the_handler_breaks_is_its_own_failure_not_the_dones(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """A deferred foreign key the handler's write breaks fails the job's end before its
    `done` runs: nothing commits, and the failure is the handler's (`by_done` false: the job
    is retried as after any failed write), not a result the job table refused."""
    store, slots, row = claimed
    await conn.execute("CREATE TABLE test_deferred_ref (id int PRIMARY KEY, ref int "
                       "REFERENCES test_deferred_ref (id) DEFERRABLE INITIALLY DEFERRED)")
    tx = JobTransaction(slots, 0)
    await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await tx.execute("INSERT INTO test_deferred_ref VALUES (%s, %s)", (5, 999))
    with pytest.raises(NotCommittedError) as failed:
        await tx.end(store.done_statement(row["id"], row["attempts"], None))
    assert isinstance(failed.value.error, psycopg.errors.ForeignKeyViolation)
    assert not failed.value.by_done
    assert await nothing_committed(conn, row["id"])


async def test_a_held_cursor_is_closed_before_the_commit_not_run_to_its_end(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """A COMMIT keeps a `WITH HOLD` cursor by running its query to the end; the reset closes
    it before the COMMIT, so rows the handler did not fetch are never computed (here the
    third would divide by zero) and the job ends done with its write."""
    store, slots, row = claimed
    tx = JobTransaction(slots, 0)
    await tx.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await tx.execute("DECLARE held CURSOR WITH HOLD FOR "
                     "SELECT 1 / (g - 3) FROM generate_series(1, 5) AS g")
    await tx.execute("FETCH 1 FROM held")
    await tx.end(store.done_statement(row["id"], row["attempts"], None))
    assert (await job(conn, row["id"]))["status"] == "done"
    assert await runs(conn, row["id"]) == 1


@pytest.mark.parametrize("scope", ["SET", "SET LOCAL"])
async def test_the_reset_keeps_the_handlers_commit_durability_until_the_commit(
        conn: Conn, scope: str) -> None:
    """The reset before the COMMIT (what a writing job's end sends) leaves the handler's
    `synchronous_commit` in force for the COMMIT, and the session's own once it is over."""
    default = await scalar(conn, "SELECT current_setting('synchronous_commit')")
    assert default == "on"
    await conn.execute("BEGIN")
    await conn.execute(f"{scope} synchronous_commit = 'off'")
    await conn.execute(RESET_BEFORE_COMMIT.text)
    assert await scalar(conn, "SELECT current_setting('synchronous_commit')") == "off"
    await conn.execute("COMMIT")
    assert await scalar(conn, "SELECT current_setting('synchronous_commit')") == "on"


async def test_a_deallocation_psycopg_queued_in_a_job_is_sent_at_its_end(
    claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
) -> None:
    """psycopg drops its prepared statements (DEALLOCATE ALL) after a DROP or ALTER read at a
    pipeline's end, at its next query: that is the job's end, not the next job, whose own
    prepared statement would be dropped with them."""
    _, slots, _ = claimed
    for n in range(6):  # often enough for psycopg to prepare it
        tx = JobTransaction(slots, 0)
        await tx.execute("SELECT %s::int + 1 AS n", (n,))
        await tx.end(b"SELECT 1;")
    tx = JobTransaction(slots, 0)
    async with tx.pipeline():
        await tx.execute("DROP TABLE IF EXISTS nothing_here")
    await tx.end(b"SELECT 1;")
    following = JobTransaction(slots, 0)
    for n in (3, 4):
        cur = await following.execute("SELECT %s::int * 2 AS m", (n,), prepare=True)
        assert await cur.fetchone() == {"m": n * 2}
    await following.end(b"SELECT 1;")


COMMITTED_BEFORE = "what it wrote before committed"
RAN_OUTSIDE = "they ran outside the job's transaction"
UNREAD = "whose answer the worker does not read"


ENDINGS = [
    # refused before it commits
    ("commit", 0, "commit() on tx"), ("autocommit", 0, "set_autocommit(True) on tx"),
    ("cursor_connection", 0, "commit() on tx"), ("close", 0, "close() on tx"),
    # found after the COMMIT ran: named as committed
    ("sql_commit", 1, COMMITTED_BEFORE), ("sql_end", 1, COMMITTED_BEFORE),
    ("sql_in_text", 1, COMMITTED_BEFORE), ("pipeline", 1, COMMITTED_BEFORE),
    # the first row rolled back, the second committed on its own after the ROLLBACK
    ("rollback_then_write_in_text", 1, RAN_OUTSIDE),
    ("rollback_then_write_in_pipeline", 1, RAN_OUTSIDE),
    # a COMMIT whose answer the worker does not read (a cursor class of the handler's own,
    # stream()): found when the handler returns, or at its next statement, which is not sent
    ("own_cursor_commit", 1, UNREAD), ("own_cursor_commit_then_write", 1, UNREAD),
    ("stream_commit", 1, UNREAD),
    # a savepoint's rollback, whose tag is ROLLBACK's, is not taken for the transaction's
    ("own_cursor_commit_after_savepoint", 1, UNREAD),
    # the handler failed after it committed apart: a retry would write it again
    ("own_cursor_commit_then_raise", 1, UNREAD), ("pipeline_then_raise", 1, COMMITTED_BEFORE),
    # psycopg's own commands: refused before they are sent
    ("own_transaction", 0, "COMMIT sent by psycopg on tx"), ("two_phase", 0, "tpc_begin() on tx"),
]
"""How a handler ends its job's transaction (kinds_for_tests.ENDINGS), how many of its rows
committed all the same, and what the job's last_error says."""


@pytest.mark.parametrize(("how", "kept", "says"), ENDINGS)
async def test_a_handler_that_ends_its_jobs_transaction_sends_the_job_to_the_dlq(
        conn: Conn, dsn: str, tenant: uuid.UUID, how: str, kept: int, says: str) -> None:
    """The worker commits the job's transaction with its done; a handler that commits it
    itself, or writes outside it, would leave its writes committed and the job retried,
    writing them again."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_commits_itself",
                                    payload={"how": how})).id
    await run_until_empty(dsn, "test_commits_itself")
    row = await job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("dlq", 1), row
    assert row["last_error"].startswith("TransactionEndedError: "), row["last_error"]
    assert says in row["last_error"], row["last_error"]
    assert await runs(conn, job_id) == kept


@pytest.mark.parametrize("how", ["rollback", "sql_rollback", "rollback_then_begin_in_text",
                                 "rollback_in_pipeline", "rollback_and_chain"])
async def test_a_handler_that_rolls_back_and_goes_on_commits_what_follows_with_its_done(
        conn: Conn, dsn: str, tenant: uuid.UUID, how: str) -> None:
    """A ROLLBACK only undoes: the handler's next statement begins the job's transaction
    again (or the handler's own BEGIN does), and commits with the job's done."""
    assert await rows_of_done_job(conn, dsn, tenant, "test_rolls_back", how) == [1]


@pytest.mark.parametrize("how", ["savepoint_in_text", "savepoint_statements",
                                 "savepoint_in_pipeline"])
async def test_a_rollback_to_a_savepoint_keeps_the_jobs_transaction(
        conn: Conn, dsn: str, tenant: uuid.UUID, how: str) -> None:
    """ROLLBACK TO SAVEPOINT answers with ROLLBACK's command tag, but undoes only what follows
    the savepoint: what the handler writes after it is in the job's transaction, not outside."""
    assert await rows_of_done_job(conn, dsn, tenant, "test_rolls_back", how) == [0, 1]


async def rows_of_done_job(conn: Conn, dsn: str, tenant: uuid.UUID, kind: str,
                           how: str) -> list[int]:
    """Run one job of `kind` with `payload.how`; assert it ended done; return the
    `worker_pid` values of its test_runs rows, in order."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind=kind,
                                    payload={"how": how})).id
    await run_until_empty(dsn, kind)
    row = await job(conn, job_id)
    assert row["status"] == "done", row
    return list(await scalar(conn, "SELECT array_agg(worker_pid ORDER BY worker_pid) "
                                   "FROM test_runs WHERE job_id = %s", (job_id,)))


async def test_a_task_a_handler_left_running_cannot_write_into_the_next_job(
        conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    """A handler left a task running with a cursor of `tx`; on one slot the next job got the
    same connection, and the task's write landed in that job's transaction (committed with
    the wrong job, or rolled back with it). It now fails in the task, with JobEndedError."""
    await prepare(conn)
    ids = [(await jobpool.enqueue(conn, tenant_id=tenant, kind="test_left_running",
                                  payload={"role": role})).id for role in ("leave", "meet")]
    await run_until_empty(dsn, "test_left_running", slots=1)
    assert [(await job(conn, job_id))["status"] for job_id in ids] == ["done", "done"]
    assert kinds_for_tests.LEFT_RUNNING["outcome"].startswith(
        f"JobEndedError: tx of job {ids[0]} used after the job ended"), kinds_for_tests.LEFT_RUNNING
    assert await scalar(conn, "SELECT array_agg(worker_pid ORDER BY job_id) FROM test_runs "
                              "WHERE job_id = ANY(%s)", (ids,)) == [0, 0]


async def test_a_connection_lost_under_its_reset_is_replaced_without_blaming_the_handler(
    conn: Conn, claimed: tuple[QueueStore, SlotConnections, dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server closed the job's connection (a restart, a pooler dropping it): its reset
    failed, and the log said "a handler changed its connection's session", which no handler
    did. The connection is closed for the pool to replace, quietly."""
    caplog.set_level(logging.WARNING)
    _, slots, row = claimed
    tx = JobTransaction(slots, 0)
    taken = tx.connection()
    await taken.execute(INSERT_RUN, (row["id"], row["attempts"]))
    await conn.execute("SELECT pg_terminate_backend(%s)", (taken.info.backend_pid,))
    await reset_session(taken)
    assert taken.closed
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
