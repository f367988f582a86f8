"""Statements that take a batch as arrays do work in proportion to the batch, in any plan.

The claim connection runs every statement with its generic plan (`claim_session`), and
psycopg prepares any statement run five times, whose generic plan the server may then keep.
A generic plan is made without the arrays, each counted as 10 elements, and a table's
statistics may date from when it held few of the rows concerned (the running jobs of a
worker). A join of the batch with the table can then be planned as a rescan
of the whole batch per row of the table: a cost quadratic in the batch (a `done` of 160 jobs
spent 6.5 of its 9 ms so). Each test runs one statement under its generic plan, with EXPLAIN
ANALYZE, on a batch of `BATCH` rows whose table was analyzed before it held them, and counts
the rows its plan nodes produced or filtered out, over all their loops.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

from jobpool.db.queries import Many, NamedQuery
from jobpool.db.store import Completion, completion_parameters

Conn = psycopg.AsyncConnection[dict[str, Any]]

BATCH = 200
LINEAR = 20 * BATCH
"""The most rows a linear plan handles here: a few per batch row (a quadratic one: BATCH²)."""

async def generic_plan(conn: Conn, query: NamedQuery, params: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of `query` as a prepared statement under its generic plan, in a
    transaction rolled back afterwards; the plan's root node (EXPLAIN's JSON)."""
    prepare, execute = query.prepared("batch_statement", params)
    async with conn.transaction(force_rollback=True):
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(prepare)
        cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + execute)
        row = await cur.fetchone()
        await conn.execute("DEALLOCATE batch_statement")
    assert row is not None
    return dict(row["QUERY PLAN"][0]["Plan"])


def rows_handled(node: dict[str, Any]) -> float:
    """Rows `node` and its children produced or filtered out, summed over their loops."""
    own = sum(node.get(key, 0) for key in (
        "Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter",
        "Rows Removed by Index Recheck"))
    return own * node.get("Actual Loops", 1) + sum(rows_handled(child)
                                                  for child in node.get("Plans", ()))


async def jobs_of_worker(conn: Conn, tenant: uuid.UUID, status: str) -> list[int]:
    """BATCH jobs in `status`, claimed by worker `w1` at attempt 1, added after the table was
    analyzed with 2,000 pending jobs and none of them; their ids."""
    await conn.execute("INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts) "
                       "SELECT %s, 'reindex', 5 FROM generate_series(1, 2000)", (tenant,))
    await conn.execute("ANALYZE mdm.aa_job")
    cur = await conn.execute(
        "UPDATE mdm.aa_job SET status = %s, claimed_by = 'w1', attempts = 1,"
        " claimed_at = now(), lease_expires_at = now() + interval '1 minute',"
        " completed_at = CASE WHEN %s = 'done' THEN now() END"
        " WHERE id IN (SELECT id FROM mdm.aa_job ORDER BY id LIMIT %s) RETURNING id",
        (status, status, BATCH))
    return sorted(row["id"] for row in await cur.fetchall())


def done_parameters(ids: list[int]) -> dict[str, Any]:
    """The batched `done`'s parameters for `ids` (attempt 1, no result), as worker `w1` sends
    them."""
    return completion_parameters([Completion(job_id, 1, None) for job_id in ids],
                                 worker_id="w1", actor="test")


async def test_a_batch_done_reads_each_job_once(conn: Conn, tenant: uuid.UUID) -> None:
    ids = await jobs_of_worker(conn, tenant, "running")
    plan = await generic_plan(conn, Many("complete_jobs"), done_parameters(ids))
    assert plan["Actual Rows"] == BATCH
    assert rows_handled(plan) <= LINEAR


async def test_a_lease_renewal_reads_each_job_once(conn: Conn, tenant: uuid.UUID) -> None:
    ids = await jobs_of_worker(conn, tenant, "running")
    plan = await generic_plan(conn, Many("renew_leases"),
                              {"ids": ids, "worker_id": "w1", "lease": 60.0})
    assert plan["Actual Rows"] == BATCH
    assert rows_handled(plan) <= LINEAR


async def test_the_look_up_of_hidden_commits_reads_each_job_once(
        conn: Conn, tenant: uuid.UUID) -> None:
    ids = await jobs_of_worker(conn, tenant, "done")
    plan = await generic_plan(conn, Many("completed_before"),
                              {"ids": ids, "attempts": [1] * BATCH, "worker_id": "w1"})
    assert plan["Actual Rows"] == BATCH
    assert rows_handled(plan) <= LINEAR


async def test_the_look_up_of_idempotency_keys_reads_each_key_once(
        conn: Conn, tenant: uuid.UUID) -> None:
    await conn.execute("ANALYZE mdm.aa_job")
    await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, max_attempts, idempotency_key) "
        "SELECT %s, 'reindex', 5, 'key-' || n FROM generate_series(1, %s) AS n", (tenant, BATCH))
    plan = await generic_plan(conn, Many("find_idempotent_jobs"), {
        "tenant_ids": [tenant] * BATCH, "kinds": ["reindex"] * BATCH,
        "idempotency_keys": [f"key-{n}" for n in range(1, BATCH + 1)]})
    assert plan["Actual Rows"] == BATCH
    assert rows_handled(plan) <= LINEAR


def job_scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The scans of mdm.aa_job in the plan under `node` (not its Update node)."""
    own = [node] if (node.get("Relation Name") == "aa_job"
                     and node["Node Type"] != "ModifyTable") else []
    return own + [scan for child in node.get("Plans", ()) for scan in job_scans(child)]


async def test_a_batch_done_and_a_lease_renewal_reach_each_job_by_its_id(
        conn: Conn, tenant: uuid.UUID) -> None:
    """Never by a walk of every entry of the worker in ix_aa_job_running (claimed_by, id): a
    snapshot held open keeps there the entries of all the jobs it claimed since, hundreds of
    thousands within minutes, and such a walk made the `done` of 130 jobs take 23 ms."""
    ids = await jobs_of_worker(conn, tenant, "running")
    for query, params in (
            (Many("complete_jobs"), done_parameters(ids)),
            (Many("renew_leases"), {"ids": ids, "worker_id": "w1", "lease": 60.0})):
        plan = await generic_plan(conn, query, params)
        assert plan["Actual Rows"] == BATCH
        scans = job_scans(plan)
        assert scans, query.name
        for scan in scans:
            assert "id = " in scan.get("Index Cond", ""), (query.name, scan.get("Index Cond"))
