"""One tenant's data never stops a worker process: the examples users hit, end to end.

A dozen normal jobs of two tenants (max_attempts 1: one lost attempt would put them in the
DLQ) run beside the bad one in `jobpool run --slots 8 --until-empty`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import kinds_for_tests
import psycopg
from integration.helpers import prepare

import jobpool
from acceptance.cli import jobpool as cli
from acceptance.cli import worker_args

Conn = psycopg.AsyncConnection[dict[str, Any]]
DEEP_980 = '{"a":' * 980 + "1" + "}" * 980


async def twelve_normal_jobs(conn: Conn, tenant: uuid.UUID) -> list[int]:
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('globex') RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    tenants = [tenant, row["id"]]
    made = await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenants[n % 2], "test_noop", {"n": n}, max_attempts=1)
        for n in range(12)])
    return [m.id for m in made]


async def states(conn: Conn, ids: list[int]) -> dict[int, tuple[str, str | None]]:
    cur = await conn.execute("SELECT id, status::text AS status, last_error FROM mdm.aa_job "
                             "WHERE id = ANY(%s)", (ids,))
    return {row["id"]: (row["status"], row["last_error"]) for row in await cur.fetchall()}


async def test_a_result_with_a_nul_fails_its_job_alone(conn: Conn, dsn: str,
                                                       tenant: uuid.UUID) -> None:
    """A handler that sends no SQL and returns {"t": "a\\u0000b"}."""
    await prepare(conn)
    normal = await twelve_normal_jobs(conn, tenant)
    bad = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_misbehave",
                                 payload={"do": "nul_result"})).id

    run = cli(dsn, *worker_args("test_noop", "test_misbehave", slots=8, until_empty=True),
              check=False)

    assert run.returncode == 0, run.stderr
    found = await states(conn, [*normal, bad])
    assert {found[i][0] for i in normal} == {"done"}
    assert found[bad] == ("dlq", "PermanentError: handler returned a result that cannot be "
                                 "stored: result.t contains a NUL character (\\u0000), which "
                                 "PostgreSQL cannot store")


def test_enqueue_refuses_payloads_jsonb_cannot_store_or_we_cannot_read(dsn: str) -> None:
    cli(dsn, "tenants", "add", "acme")
    for payload, problem in [
        (DEEP_980, "argument --payload: payload is nested 980 levels deep, more than the "
                   "limit of 100"),
        ('{"n": "x\\ud800"}', "argument --payload: payload.n contains a lone surrogate "
                              "(U+D800)"),
        ('{"t": "a\\u0000b"}', "argument --payload: payload.t contains a NUL character"),
    ]:
        result = cli(dsn, "enqueue", "test_noop", "--tenant", "acme", "--payload", payload,
                     "--import", "kinds_for_tests", check=False)
        assert result.returncode == 2, result.stderr
        assert problem in result.stderr
        assert "Traceback" not in result.stderr
    result = cli(dsn, "tenants", "add", "globex", "--metadata", DEEP_980, check=False)
    assert result.returncode == 2
    assert "argument --metadata: metadata is nested 980 levels deep" in result.stderr


async def test_a_payload_too_deep_to_decode_fails_its_job_alone_and_stays_readable(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Written by SQL past enqueue's checks: the worker puts it in the DLQ at claim time, the
    others run, and `jobpool jobs show` / `jobpool dlq list` still show it."""
    await prepare(conn)
    normal = await twelve_normal_jobs(conn, tenant)
    cur = await conn.execute("INSERT INTO mdm.aa_job (tenant_id, job_kind, payload, max_attempts)"
                             " VALUES (%s, 'test_noop', %s::jsonb, 5) RETURNING id",
                             (tenant, DEEP_980))
    row = await cur.fetchone()
    assert row is not None
    bad = row["id"]

    run = cli(dsn, *worker_args("test_noop", slots=8, until_empty=True), check=False)

    assert run.returncode == 0, run.stderr
    found = await states(conn, [*normal, bad])
    assert {found[i][0] for i in normal} == {"done"}
    reason = "nested 980 levels deep, more than the limit of 100"
    assert found[bad] == ("dlq", f"PermanentError: payload cannot be decoded: {reason}")

    shown = cli(dsn, "jobs", "show", str(bad))
    assert f'"undecodable": "{reason}"' in shown.stdout
    assert json.loads(cli(dsn, "jobs", "show", str(bad), "--json").stdout)["payload"][
        "undecodable"] == reason
    listed = json.loads(cli(dsn, "dlq", "list", "--json").stdout)
    assert [(item["id"], item["payload_preview"][:12], item["payload_truncated"])
            for item in listed] == [(bad, '{"a": {"a": ', True)]
    assert str(bad) in cli(dsn, "dlq", "list").stdout



REPLACED = {"autocommit", "read_only_attribute", "row_factory", "idle_timeout", "json_loader",
            "deallocate_all", "cursor_factory", "server_cursor_factory", "prepared_max",
            "notice_handler", "notify_handler"}
"""Abuses after which the connection is replaced rather than reset."""


async def run_abuses_then_probes(conn: Conn, dsn: str, tenant: uuid.UUID,
                                 abuses: list[str]) -> dict[str, tuple[str, str | None]]:
    """Run one `test_abuse_tx` job per abuse first, then 48 probes on the same pooled
    connections, in one `jobpool run --slots 8 --until-empty`; every probe must end done."""
    await prepare(conn)
    bad = await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenant, "test_abuse_tx", {"do": do}, priority=0) for do in abuses])
    probes = [m.id for m in await jobpool.enqueue_many(conn, [
        jobpool.NewJob(tenant, "test_session_probe", {"n": n}) for n in range(48)])]

    run = cli(dsn, *worker_args("test_abuse_tx", "test_session_probe", slots=8,
                                until_empty=True), check=False, timeout=300)

    assert run.returncode == 0, run.stderr
    # only connections that cannot be reset are replaced (changed psycopg attributes, killed)
    assert run.stderr.count("replacing the connection") <= len(REPLACED), run.stderr
    found = await states(conn, [*(m.id for m in bad), *probes])
    assert {i: found[i] for i in probes if found[i][0] != "done"} == {}
    return {do: found[m.id] for m, do in zip(bad, abuses, strict=True)}


async def test_what_a_handler_does_to_its_session_ends_with_its_job(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """SET, SET ROLE, LISTEN, a read-only session, a held cursor, autocommit, row_factory:
    the next job on that pooled connection, and the worker's own queries, never see them."""
    abuses = [*kinds_for_tests.TX_ABUSES, "row_factory"]
    found = await run_abuses_then_probes(conn, dsn, tenant, abuses)
    assert {do for do, (status, _) in found.items() if status not in ("done", "dlq")} == set()


async def test_keyboard_interrupt_and_cancelled_error_fail_only_their_job(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Raised by the handler (or a handler cancelling its own task), they are HandlerExit:
    to the DLQ, not the worker's exit and not a hand-back that would run the job forever."""
    found = await run_abuses_then_probes(conn, dsn, tenant,
                                         ["keyboard_interrupt", "cancelled", "cancel_itself"])
    assert found["keyboard_interrupt"] == (
        "dlq", "HandlerExit: handler raised KeyboardInterrupt: ; a handler must not stop the "
               "worker")
    for do in ("cancelled", "cancel_itself"):
        assert found[do] == ("dlq", "HandlerExit: handler raised CancelledError: ; a handler "
                                    "must not cancel the worker's task")


async def test_a_handler_that_stops_the_event_loop_stops_no_worker(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """`loop.stop()` in a handler ended `jobpool run` half way (its jobs left to lease expiry):
    the loop starts again, the job itself and every later one are done, the error logged."""
    found = await run_abuses_then_probes(conn, dsn, tenant, ["stop_loop"])
    assert found == {"stop_loop": ("done", None)}


async def test_a_job_with_a_time_python_cannot_hold_is_shown_as_infinity(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """Written by SQL before the database refused such times: `jobs show` and `dlq list`
    show it, for that job and every other."""
    await prepare(conn)
    for column in ("created_at", "completed_at"):
        await conn.execute(f"ALTER TABLE mdm.aa_job DROP CONSTRAINT aa_job_{column}_in_range")
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, status, created_at, "
        "completed_at) VALUES (%s, 'test_noop', 1, 'dlq', 'infinity', '-infinity') "
        "RETURNING id", (tenant,))
    bad = (await cur.fetchone() or {})["id"]

    shown = cli(dsn, "jobs", "show", str(bad))
    assert "created_at: infinity" in shown.stdout
    row = json.loads(cli(dsn, "jobs", "show", str(bad), "--json").stdout)
    assert (row["created_at"], row["completed_at"]) == ("infinity", "-infinity")
    listed = json.loads(cli(dsn, "dlq", "list", "--json").stdout)
    assert [(item["id"], item["created_at"]) for item in listed] == [(bad, "infinity")]
