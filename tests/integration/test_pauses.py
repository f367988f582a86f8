"""Pause and resume on the real server: claims leave paused work alone, resume lets it go,
every change is audited with its actor, and every view of the queue shows what is held."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from integration.helpers import add_tenant, prepare, scalar
from integration.test_api import Client, api, token  # noqa: F401 (the api fixture)
from jobpool import pauses
from jobpool.cli import main
from jobpool.core.poolspec import load_pool
from jobpool.db.lane_counts import count_lane_jobs
from jobpool.db.store import QueueStore
from jobpool.errors import UnknownKindError, UnknownTenantError
from jobpool.metrics import QueueGauges, WorkerMetrics

Conn = psycopg.AsyncConnection[dict[str, Any]]

KIND = "test_record"
OTHER = "test_fail"


async def _jobs(conn: Conn, tenant: uuid.UUID, count: int, kind: str = KIND) -> list[int]:
    cur = await conn.execute(
        "INSERT INTO mdm.aa_job (tenant_id, job_kind, available_at, max_attempts)"
        " SELECT %s, %s, now() - interval '1 minute', 5 FROM generate_series(1, %s)"
        " RETURNING id", (tenant, kind, count))
    return [int(row["id"]) for row in await cur.fetchall()]


async def _claim_all(store: QueueStore, kinds: Sequence[str] = (KIND, OTHER),
                     tenants: Sequence[uuid.UUID] | None = None) -> set[int]:
    claimed: set[int] = set()
    while rows := await store.claim(kinds=kinds, tenants=tenants, limit=3):
        claimed |= {int(row["id"]) for row in rows}
    return claimed


async def _untouched(conn: Conn, ids: list[int]) -> bool:
    """Whether every job of `ids` is still pending with no attempt used."""
    return bool(await scalar(
        conn, "SELECT bool_and(status = 'pending' AND attempts = 0 AND claimed_by IS NULL)"
        " FROM mdm.aa_job WHERE id = ANY(%s)", (ids,)))


async def _pause(conn: Conn, tenant: str | None, kind: str | None, actor: str = "user:oncall",
                 reason: str | None = None) -> None:
    await pauses.pause(conn, tenant=tenant, kind=kind, actor=actor, reason=reason)


async def _resume(conn: Conn, tenant: str | None, kind: str | None,
                  actor: str = "user:oncall") -> None:
    await pauses.resume(conn, tenant=tenant, kind=kind, actor=actor)


async def _audit(conn: Conn) -> list[dict[str, Any]]:
    cur = await conn.execute(
        "SELECT action::text AS action, actor_principal_id AS actor, tenant_id, payload"
        " FROM mdm.aa_audit_log WHERE action IN ('work_paused', 'work_resumed') ORDER BY id")
    return await cur.fetchall()


# -- claims ------------------------------------------------------------------------------


async def test_a_paused_pair_is_not_claimed_while_another_tenants_is(
        conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    held = await _jobs(conn, a, 5)
    a_other_kind = await _jobs(conn, a, 2, kind=OTHER)
    b_same_kind = await _jobs(conn, b, 2)
    await _pause(conn, "a", KIND)
    assert await _claim_all(store) == set(a_other_kind + b_same_kind)
    assert await _untouched(conn, held)

    await _resume(conn, "a", KIND)
    assert await _claim_all(store) == set(held)


async def test_a_kind_paused_for_every_tenant_is_claimed_by_no_worker(
        conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    held = await _jobs(conn, a, 3) + await _jobs(conn, b, 3)
    free = await _jobs(conn, a, 2, kind=OTHER)
    await _pause(conn, None, KIND)
    assert await _claim_all(store) == set(free)
    assert await _claim_all(store, tenants=[a, b]) == set()  # a worker of its own tenants
    assert await _untouched(conn, held)
    await _resume(conn, None, KIND)
    assert await _claim_all(store, tenants=[a, b]) == set(held)


async def test_a_paused_tenant_keeps_every_kind_and_its_paused_pair_outlives_its_resume(
        conn: Conn, store: QueueStore) -> None:
    a, b = await add_tenant(conn, "a"), await add_tenant(conn, "b")
    a_kind, a_other = await _jobs(conn, a, 2), await _jobs(conn, a, 2, kind=OTHER)
    b_jobs = await _jobs(conn, b, 2)
    await _pause(conn, "a", None)
    await _pause(conn, "a", OTHER)
    assert await _claim_all(store) == set(b_jobs)
    assert await _untouched(conn, a_kind + a_other)
    await _resume(conn, "a", None)  # the tenant; its (a, test_fail) pause stays
    assert await _claim_all(store) == set(a_kind)
    assert await _untouched(conn, a_other)


async def test_pause_and_resume_are_audited_with_their_actor(conn: Conn, store: QueueStore,
                                                            tenant: uuid.UUID) -> None:
    await _pause(conn, "acme", KIND, actor="user:alice", reason="mail provider down")
    again, created = await pauses.pause(conn, tenant="acme", kind=KIND, actor="user:bob")
    assert not created and again["paused_by"] == "user:alice"  # kept, not audited again
    await _resume(conn, str(tenant).upper(), KIND, actor="token:carol")  # or its id
    rows = await _audit(conn)
    assert [(r["action"], r["actor"], r["tenant_id"]) for r in rows] == [
        ("work_paused", "user:alice", tenant), ("work_resumed", "token:carol", tenant)]
    assert rows[0]["payload"] == {"kind": KIND, "reason": "mail provider down",
                                  "tenant_scope": "*"}
    assert rows[1]["payload"]["paused_by"] == "user:alice"


async def test_resume_of_what_is_not_paused_names_what_is(conn: Conn, store: QueueStore,
                                                         tenant: uuid.UUID) -> None:
    await _pause(conn, None, OTHER)
    with pytest.raises(pauses.NotPausedError,
                       match=r"tenant acme, kind test_record is not paused \(paused: kind "
                             r"test_fail \(every tenant\)\)"):
        await _resume(conn, "acme", KIND)


async def test_bad_names_get_errors_that_name_them(conn: Conn, store: QueueStore,
                                                   tenant: uuid.UUID) -> None:
    with pytest.raises(UnknownTenantError, match=r"unknown tenant 'acne' \(did you mean 'acme'"):
        await _pause(conn, "acne", KIND)
    with pytest.raises(UnknownKindError,
                       match=r"unknown job kind 'test_recrod' \(did you mean 'test_record'"):
        await _pause(conn, "acme", "test_recrod")
    with pytest.raises(ValueError, match="invalid job kind name 'Email'"):
        await _pause(conn, "acme", "Email")
    with pytest.raises(ValueError, match="neither a tenant key"):
        await _pause(conn, "ACME!", KIND)
    with pytest.raises(ValueError, match="name what to pause"):
        await _pause(conn, None, None)
    with pytest.raises(ValueError, match="at most 500 characters"):
        await _pause(conn, "acme", KIND, reason="x" * 501)
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_pause") == 0


# -- the CLI -------------------------------------------------------------------------------


def test_the_cli_pauses_lists_and_resumes(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as sync:
        sync.execute("INSERT INTO mdm.aa_tenant (key) VALUES ('acme')")
        sync.execute("INSERT INTO mdm.aa_job_kind (name) VALUES ('email_send')"
                     " ON CONFLICT DO NOTHING")
    base = ["--dsn", dsn]
    assert main(["pause", *base, "--tenant", "acme", "--kind", "email_send", "--reason",
                 "provider down", "--actor", "oncall"]) == 0
    assert capsys.readouterr().out == "paused tenant acme, kind email_send\n"
    assert main(["paused", *base, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(p["tenant"], p["kind"], p["paused_by"], p["reason"]) for p in listed] == [
        ("acme", "email_send", "user:oncall", "provider down")]
    assert main(["status", *base, "--json"]) == 0
    assert [p["kind"] for p in json.loads(capsys.readouterr().out)["paused"]] == ["email_send"]
    assert main(["status", *base]) == 0
    assert "acme    email_send" in capsys.readouterr().out

    assert main(["pause", *base, "--tenant", "acme", "--kind", "email_sned"]) == 2
    assert "did you mean 'email_send'" in capsys.readouterr().err
    assert main(["pause", *base]) == 2
    assert capsys.readouterr().err == ("jobpool: error: name what to pause or resume: a tenant, "
                                       "a kind, or both (--tenant T, --kind K)\n")
    assert main(["resume", *base, "--tenant", "acme"]) == 2
    assert ("tenant acme (every kind) is not paused (paused: tenant acme, kind email_send)"
            in capsys.readouterr().err)
    assert main(["resume", *base, "--tenant", "acme", "--kind", "email_send"]) == 0
    assert capsys.readouterr().out.startswith("resumed tenant acme, kind email_send")
    assert main(["paused", *base]) == 0
    assert capsys.readouterr().out == "nothing is paused\n"


# -- the API -------------------------------------------------------------------------------


async def test_the_api_pauses_and_resumes_within_the_tokens_tenants(
        api: Client, conn: Conn, store: QueueStore, tenant: uuid.UUID) -> None:  # noqa: F811
    await add_tenant(conn, "beta")
    path = f"/v1/pauses?tenant=acme&kind={KIND}"
    assert (await api.call("POST", path))[0] == 401
    scoped = token(sub="ops", tenants=["acme"])
    status, body, _ = await api.call("POST", path + "&reason=smtp%20down", bearer=scoped)
    assert (status, body["tenant"], body["kind"], body["paused_by"], body["reason"]) == (
        201, "acme", KIND, "token:ops", "smtp down")
    assert (await api.call("POST", path, bearer=scoped))[0] == 200  # paused already
    status, body, _ = await api.call("POST", f"/v1/pauses?kind={KIND}", bearer=scoped)
    assert status == 403 and "cannot pause or resume a kind for every tenant" in body["detail"]
    status, body, _ = await api.call("POST", f"/v1/pauses?tenant=beta&kind={KIND}",
                                     bearer=scoped)
    assert status == 404 and "unknown tenant 'beta'" in body["detail"]
    status, body, _ = await api.call("POST", "/v1/pauses?tenant=acme&kind=test_recrod",
                                     bearer=scoped)
    assert status == 404 and "did you mean 'test_record'" in body["detail"]
    status, body, _ = await api.call("POST", "/v1/pauses", bearer=token())
    assert status == 403 and "name what to pause" in body["detail"]
    status, body, _ = await api.call("POST", "/v1/pauses?tenant=acme&kind=Email",
                                     bearer=scoped)
    assert status == 400 and "kind must be a kind name" in body["detail"]

    await _jobs(conn, tenant, 3)
    status, body, _ = await api.call("GET", "/v1/overview", bearer=scoped)
    assert [(p["tenant"], p["kind"], p["ready"]) for p in body["paused"]] == [
        ("acme", KIND, 3)]
    assert [c["paused"] for c in body["counts"]] == [True]
    status, body, _ = await api.call("GET", "/v1/pauses", bearer=token(tenants=["beta"]))
    assert (status, body) == (200, {"items": []})  # another tenant's pause is not shown

    status, body, _ = await api.call("DELETE", path, bearer=token(sub="lead"))
    assert (status, body["paused_by"]) == (200, "token:ops")
    assert (await api.call("DELETE", path, bearer=scoped))[0] == 409
    assert [(r["action"], r["actor"], r["payload"]["tenant_scope"]) for r in await _audit(conn)
            ] == [("work_paused", "token:ops", ["acme"]), ("work_resumed", "token:lead", "*")]


# -- what the scaler and the gauges count ------------------------------------------------


async def test_paused_work_is_no_demand_for_the_scaler_and_shows_in_the_gauges(
        conn: Conn, dsn: str, store: QueueStore, tenant: uuid.UUID) -> None:
    beta = await add_tenant(conn, "beta")
    await _jobs(conn, tenant, 4)
    await _jobs(conn, tenant, 3, kind=OTHER)
    await _jobs(conn, beta, 2)
    await _jobs(conn, beta, 5, kind=OTHER)
    await conn.execute("UPDATE mdm.aa_job SET status = 'running', claimed_by = 'w',"
                       " claimed_at = now() WHERE id = (SELECT min(id) FROM mdm.aa_job)")
    pool = load_pool({
        "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
        "metadata": {"name": "p"},
        "spec": {"image": "i", "database": {"secretName": "s"},
                 "lanes": [{"name": "default", "kinds": [KIND, OTHER], "maxReplicas": 50}]}})
    before = (await count_lane_jobs(conn, pool.lanes))["default"]
    assert (before.ready, before.running) == (13, 1)
    await _pause(conn, "acme", KIND)
    await _pause(conn, None, OTHER)
    after = (await count_lane_jobs(conn, pool.lanes))["default"]
    assert (after.ready, after.running) == (2, 1)  # beta's test_record; the running one stays

    metrics = WorkerMetrics()
    gauges = QueueGauges(dsn, max_age=0)
    metrics.add_queue_gauges(gauges)
    try:
        text = (await metrics.exposition()).decode()
    finally:
        await gauges.close()
    paused = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("mdm_jobs_paused{")}
    assert paused == {
        f'mdm_jobs_paused{{kind="{KIND}",tenant="acme"}}': 3.0,
        f'mdm_jobs_paused{{kind="{OTHER}",tenant="acme"}}': 3.0,
        f'mdm_jobs_paused{{kind="{KIND}",tenant="beta"}}': 0.0,
        f'mdm_jobs_paused{{kind="{OTHER}",tenant="beta"}}': 5.0,
    }


@pytest.mark.parametrize(("reason", "detail"), [
    ("a%00b", "a pause's reason contains a NUL character"),
    ("x" * 501, "a pause's reason is at most 500 characters, got 501"),
    ("%1b[31mred", "a pause's reason contains U+001B at index 0"),
])
async def test_a_reason_it_cannot_keep_or_print_is_a_named_400(
        api: Client, conn: Conn, reason: str, detail: str) -> None:  # noqa: F811
    await prepare(conn)
    status, body, _ = await api.call("POST", f"/v1/pauses?kind={KIND}&reason={reason}",
                                     bearer=token())
    assert (status, detail in body["detail"]) == (400, True), body
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_pause") == 0


# -- a pause and a resume at once ----------------------------------------------------------


def _then(query: Any, change: Any) -> Any:
    """`query` (a `One`), with `change` (a coroutine function) run once right after its first
    call: as if another session committed `change` between the statement's read and the next
    statement."""
    calls = 0

    async def run(conn: Conn, params: Any) -> Any:
        nonlocal calls
        row = await query(conn, params)
        calls += 1
        if calls == 1:
            await change()
        return row

    return run


async def test_a_pause_that_meets_a_resume_of_the_scope_pauses_it(
        conn: Conn, dsn: str, store: QueueStore, tenant: uuid.UUID,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause finds the scope paused, and another session resumes it before the pause
    reads it back: the scope ends paused by this call (it used to fail an assertion: a 500)."""
    await _pause(conn, "acme", KIND, actor="user:alice")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                    row_factory=dict_row) as other:
        monkeypatch.setattr(pauses, "PAUSE_SCOPE", _then(pauses.PAUSE_SCOPE, lambda: _resume(
            other, "acme", KIND, actor="user:carol")))  # type: ignore[arg-type]
        row, created = await pauses.pause(conn, tenant="acme", kind=KIND, actor="user:bob")
    assert (created, row["paused_by"], row["tenant"]) == (True, "user:bob", "acme")
    assert [(r["action"], r["actor"]) for r in await _audit(conn)] == [
        ("work_paused", "user:alice"), ("work_resumed", "user:carol"), ("work_paused", "user:bob")]


async def test_a_resume_that_meets_a_pause_of_the_scope_resumes_it(
        conn: Conn, dsn: str, store: QueueStore, tenant: uuid.UUID,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume finds nothing to resume, and another session's pause commits before the
    resume says so: the scope ends resumed by this call, not "not paused (paused: it)"."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True,
                                                    row_factory=dict_row) as other:
        monkeypatch.setattr(pauses, "RESUME_SCOPE", _then(pauses.RESUME_SCOPE, lambda: _pause(
            other, "acme", KIND, actor="user:alice")))  # type: ignore[arg-type]
        row = await pauses.resume(conn, tenant="acme", kind=KIND, actor="user:bob")
    assert (row["paused_by"], row["tenant"]) == ("user:alice", "acme")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_pause") == 0
    assert [(r["action"], r["actor"]) for r in await _audit(conn)] == [
        ("work_paused", "user:alice"), ("work_resumed", "user:bob")]
