"""Tenant-scoped admin tokens: two tenant admins and a platform admin against the same jobs."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.test_api import (
    AUDIENCE,
    KIND,
    SECRET,
    Client,
    Conn,
    api,
    audit,
    job_row,
    seed,
    token,
)
from jobpool.api.api_command import lane_summaries
from jobpool.api.app import SECURITY_HEADERS
from jobpool.cli import main
from jobpool.core.poolspec import load_pool_file

__all__ = ["api"]  # the fixture, used by name below

ACME = token(sub="admin@acme", tenants=["acme"])
GLOBEX = token(sub="admin@globex", tenants=["globex"])
PLATFORM = token(sub="oncall@platform", tenants="*")
EXAMPLE_POOL = Path(__file__).resolve().parents[2] / "examples" / "pool.yaml"


@pytest.fixture
async def jobs(conn: Conn, tenant: uuid.UUID) -> dict[str, dict[str, list[int]]]:
    """DLQ, pending and running jobs of tenant acme and of tenant globex."""
    cur = await conn.execute("INSERT INTO mdm.aa_tenant (key, metadata) VALUES ('globex', "
                             "'{\"rate_limit\": {\"test_api_kind\": {\"rps\": 2, \"burst\": 5}}}')"
                             " RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    return {"acme": await seed(conn, tenant), "globex": await seed(conn, row["id"])}


async def test_another_tenants_job_is_404_for_every_job_endpoint(
    api: Client, conn: Conn, jobs: dict[str, dict[str, list[int]]]
) -> None:
    theirs = jobs["globex"]
    calls = [("GET", f"/v1/jobs/{theirs['dlq'][0]}"),
             ("GET", f"/v1/audit/jobs/{theirs['dlq'][0]}"),
             ("POST", f"/v1/jobs/{theirs['dlq'][0]}/replay"),
             ("DELETE", f"/v1/jobs/{theirs['dlq'][1]}"),
             ("POST", f"/v1/jobs/{theirs['running'][0]}/stop")]
    for method, path in calls:
        status, body, _ = await api.call(method, path, bearer=ACME)
        assert status == 404, (method, path, body)
        assert "no job with id" in body["detail"]
    for ident in (theirs["dlq"][0], theirs["dlq"][1]):
        assert (await job_row(conn, ident) or {}).get("status") == "dlq"
    assert (await job_row(conn, theirs["running"][0]) or {}).get("status") == "running"
    assert [a["action"] for a in await audit(conn, theirs["dlq"][0])] == ["job_enqueued"]


async def test_each_tenant_admin_acts_on_its_own_jobs_and_the_audit_records_the_scope(
    api: Client, conn: Conn, jobs: dict[str, dict[str, list[int]]]
) -> None:
    for bearer, key, sub in ((ACME, "acme", "admin@acme"), (GLOBEX, "globex", "admin@globex")):
        mine = jobs[key]["dlq"]
        status, body, _ = await api.call("POST", f"/v1/jobs/{mine[0]}/replay", bearer=bearer)
        assert (status, body["status"], body["tenant_key"]) == (200, "pending", key)
        assert (await api.call("DELETE", f"/v1/jobs/{mine[1]}", bearer=bearer))[0] == 204
        replay = [a for a in await audit(conn, mine[0]) if a["action"] == "job_replay"]
        discard = [a for a in await audit(conn, mine[1]) if a["action"] == "job_discard"]
        assert [(a["actor_principal_id"], a["payload"]["tenant_scope"]) for a in replay] == [
            (f"token:{sub}", [key])]
        assert [(a["actor_principal_id"], a["payload"]["tenant_scope"]) for a in discard] == [
            (f"token:{sub}", [key])]
        status, body, _ = await api.call("GET", f"/v1/audit/jobs/{mine[1]}", bearer=bearer)
        assert status == 200
        assert [row["action"] for row in body["items"]] == ["job_enqueued", "job_discard"]
        entry = body["items"][1]["id"]
        status, body, _ = await api.call("GET", f"/v1/audit/entries/{entry}", bearer=bearer)
        assert (status, body["payload"]["tenant_scope"]) == (200, [key])
        other = GLOBEX if bearer is ACME else ACME
        status, body, _ = await api.call("GET", f"/v1/audit/entries/{entry}", bearer=other)
        assert (status, body["detail"]) == (404, f"no audit entry with id {entry}")


async def test_the_platform_token_acts_on_every_tenant_and_is_recorded_as_such(
    api: Client, conn: Conn, jobs: dict[str, dict[str, list[int]]]
) -> None:
    for key in ("acme", "globex"):
        job = jobs[key]["running"][0]
        status, body, _ = await api.call("POST", f"/v1/jobs/{job}/stop", bearer=PLATFORM)
        assert (status, body["status"]) == (200, "failed")
        stop = [a for a in await audit(conn, job) if a["action"] == "job_stop"]
        assert [(a["actor_principal_id"], a["payload"]["tenant_scope"]) for a in stop] == [
            ("token:oncall@platform", "*")]


async def test_lists_and_counts_show_only_the_tokens_tenants(
    api: Client, jobs: dict[str, dict[str, list[int]]]
) -> None:
    for bearer, keys in ((ACME, {"acme"}), (GLOBEX, {"globex"}),
                         (PLATFORM, {"acme", "globex"})):
        _, body, _ = await api.call("GET", "/v1/dlq", bearer=bearer)
        assert [i["id"] for i in body["items"]] == sorted(
            ident for key in keys for ident in jobs[key]["dlq"])
        _, body, _ = await api.call("GET", "/v1/stats", bearer=bearer)
        assert {c["tenant"] for c in body["counts"]} == keys
        assert body["totals"] == {"dlq": 3 * len(keys), "pending": len(keys),
                                  "running": len(keys)}
        _, body, _ = await api.call("GET", "/v1/overview", bearer=bearer)
        assert {c["tenant"] for c in body["counts"]} == keys
        assert [(r["tenant"], r["kind"]) for r in body["rate_limits"]] == (
            [("globex", KIND)] if "globex" in keys else [])
    # another tenant's key is answered as a key no tenant has
    status, body, _ = await api.call("GET", "/v1/dlq?tenant=globex", bearer=ACME)
    _, unknown, _ = await api.call("GET", "/v1/dlq?tenant=nobody", bearer=ACME)
    assert (status, body["detail"]) == (404, unknown["detail"].replace("nobody", "globex"))


async def test_the_overview_counts_ready_jobs_and_their_age(
    api: Client, conn: Conn, jobs: dict[str, dict[str, list[int]]]
) -> None:
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() - interval '90 seconds' "
                       "WHERE id = %s", (jobs["acme"]["pending"][0],))
    later = (await seed(conn, await _tenant_id(conn, "globex"), dlq=0, pending=2, running=0))
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() + interval '1 hour' "
                       "WHERE id = ANY(%s)", (later["pending"],))
    _, body, _ = await api.call("GET", "/v1/overview", bearer=PLATFORM)
    counts = {(c["tenant"], c["status"]): c for c in body["counts"]}
    assert counts[("acme", "pending")]["ready"] == 1
    assert counts[("acme", "pending")]["ready_age_seconds"] >= 90
    assert (counts[("globex", "pending")]["jobs"], counts[("globex", "pending")]["ready"]) == (
        3, 1)
    assert body["rate_limits"][0]["waiting"] == 2
    assert body["rate_limits"][0]["next_due_at"] > body["now"]
    assert body["lanes"] == []


async def _tenant_id(conn: Conn, key: str) -> Any:
    cur = await conn.execute("SELECT id FROM mdm.aa_tenant WHERE key = %s", (key,))
    row = await cur.fetchone()
    assert row is not None
    return row["id"]


@pytest.mark.parametrize(("tenants", "status", "detail"), [
    (None, 403, "lacks the 'tenants' claim"),
    ([], 401, "must be '*' or a list of 1 to 1000 tenant keys"),
    ("acme", 401, "must be '*' or a list of 1 to 1000 tenant keys"),
    (["ACME"], 401, "'ACME' is not a tenant key"),
    ([7], 401, "'7' is not a tenant key"),
])
async def test_a_token_without_a_valid_tenants_claim_is_refused(
    api: Client, conn: Conn, jobs: dict[str, dict[str, list[int]]], tenants: Any, status: int,
    detail: str
) -> None:
    job = jobs["acme"]["dlq"][0]
    got, body, _ = await api.call("POST", f"/v1/jobs/{job}/replay", bearer=token(tenants=tenants))
    assert (got, detail in body["detail"]) == (status, True), body
    assert (await job_row(conn, job) or {}).get("status") == "dlq"


async def test_whoami_names_the_subject_and_scope(api: Client) -> None:
    status, body, _ = await api.call("GET", "/v1/me", bearer=token(tenants=["globex", "acme"]))
    assert (status, body) == (200, {"sub": "alice", "tenants": ["acme", "globex"]})
    assert (await api.call("GET", "/v1/me", bearer=PLATFORM))[1]["tenants"] == "*"


async def test_the_console_is_served_without_a_token_under_a_strict_policy(api: Client) -> None:
    async with api.session.get(api.base + "/console/") as response:
        page = await response.text()
        assert response.status == 200 and response.content_type == "text/html"
        assert response.headers["Content-Security-Policy"] == SECURITY_HEADERS[
            "Content-Security-Policy"]
    assert "default-src 'self'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert "unsafe-inline" not in SECURITY_HEADERS["Content-Security-Policy"]
    assert '<script src="console.js"' in page and "<style" not in page and " style=" not in page
    async with api.session.get(api.base + "/console/console.js") as response:
        script = await response.text()
        assert response.status == 200
        assert not any(sink in script for sink in (".innerHTML", ".outerHTML",
                                                   "insertAdjacentHTML", "document.write"))
    async with api.session.get(api.base + "/", allow_redirects=False) as response:
        assert (response.status, response.headers["Location"]) == (302, "/console/")
    for path in ("/console/../v1/me", "/console/%2e%2e/v1/me", "/console/x/../../v1/stats"):
        status, _, response = await api.call("GET", path)
        assert status in (401, 403, 404), path
        assert response.headers["Content-Security-Policy"]


def test_jobpool_api_with_an_unreadable_pool_file_exits_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("JOBPOOL_API_JWT_SECRET", SECRET)
    monkeypatch.setenv("JOBPOOL_API_JWT_AUDIENCE", AUDIENCE)
    bad = tmp_path / "pool.yaml"
    bad.write_text("kind: JobWorkerPool\nspec: {lanes: 3}\n")
    for path in (tmp_path / "missing.yaml", bad):
        assert main(["api", "--pool", str(path), "--dsn", "postgresql://unused@127.0.0.1:1/x"]) == 2
        assert f"jobpool: error: --pool / JOBPOOL_API_POOL: {path}: " in capsys.readouterr().err


def test_the_lanes_of_a_pool_file_are_what_the_overview_shows() -> None:
    lanes = {lane["name"]: lane for lane in lane_summaries(load_pool_file(EXAMPLE_POOL))}
    assert lanes["bulk"]["kinds"] == ["bulk_import", "reindex"]
    assert lanes["acme"]["tenants"] == ["acme"]
    assert lanes["default"]["kinds"] is None and "reindex" in lanes["default"]["exclude_kinds"]
    assert lanes["heavy"]["kinds"] == ["gin_backfill", "index_sync"]
