"""The admin commands: tenants, enqueue, status, dlq list/replay/discard, jobs show/stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from integration.helpers import job, prepare, scalar
from psycopg.types.json import Jsonb

import jobpool
from acceptance.cli import env, worker_args
from acceptance.cli import jobpool as cli

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def _dead_job(conn: Conn, tenant: uuid.UUID, dsn: str) -> int:
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_fail",
                                    payload={"permanent": True, "message": "broken"})).id
    cli(dsn, *worker_args("test_fail", until_empty=True))
    return job_id


async def test_dlq_list_replay_and_discard(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    dead, other = await _dead_job(conn, tenant, dsn), await _dead_job(conn, tenant, dsn)
    big = {"blob": os.urandom(1_000_000).hex()}  # hex: compression halves it at most
    await conn.execute("UPDATE mdm.aa_job SET payload = %s WHERE id = %s", (Jsonb(big), dead))
    output = cli(dsn, "dlq", "list", "--tenant", "acme", "--json").stdout
    assert len(output) < 4_000  # previews, not the 2 MB payload
    listed = json.loads(output)
    assert [row["id"] for row in listed] == [dead, other]
    assert listed[0]["last_error_preview"] == "PermanentError: broken"
    assert [(row["payload_preview"], row["payload_truncated"]) for row in listed] == [
        (None, True), ('{"message": "broken", "permanent": true}', False)]
    assert "PermanentError: broken" in cli(dsn, "dlq", "list").stdout
    assert json.loads(cli(dsn, "jobs", "show", str(dead), "--json").stdout)["payload"] == big
    page = json.loads(cli(dsn, "dlq", "list", "--after", str(dead), "--json").stdout)
    assert [row["id"] for row in page] == [other]

    cli(dsn, "dlq", "replay", str(dead), "--actor", "alice")
    row = await job(conn, dead)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)
    assert await scalar(conn, "SELECT actor_principal_id FROM mdm.aa_audit_log"
                        " WHERE action = 'job_replay' AND job_id = %s", (dead,)) == "user:alice"

    cli(dsn, "dlq", "discard", str(other), "--actor", "bob")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE id = %s", (other,)) == 0
    snapshot = await scalar(conn, "SELECT payload FROM mdm.aa_audit_log"
                            " WHERE action = 'job_discard' AND job_id = %s", (other,))
    assert snapshot["payload"] == {"permanent": True, "message": "broken"}


async def test_replay_of_a_pending_job_is_refused_and_changes_nothing(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    before = await job(conn, job_id)
    result = cli(dsn, "dlq", "replay", str(job_id), check=False)
    assert result.returncode == 2
    assert f"cannot replay job {job_id}: it is pending" in result.stderr
    assert await job(conn, job_id) == before
    missing = cli(dsn, "dlq", "replay", "999999", check=False)
    assert missing.returncode == 2 and "no job with id 999999" in missing.stderr


async def test_stop_show_and_status(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    cli(dsn, "jobs", "stop", str(job_id), "--actor", "carol")
    shown = json.loads(cli(dsn, "jobs", "show", str(job_id), "--json").stdout)
    assert (shown["status"], shown["tenant_key"]) == ("failed", "acme")
    assert shown["last_error"] == "stopped by user:carol"  # was None: failed, with no reason shown
    again = cli(dsn, "jobs", "stop", str(job_id), check=False)
    assert again.returncode == 2 and "it is failed" in again.stderr
    cli(dsn, *worker_args("test_record", until_empty=True))
    assert (await job(conn, job_id))["status"] == "failed"  # a stopped job is never claimed
    status = json.loads(cli(dsn, "status", "--json").stdout)["counts"]
    assert {"tenant_key": "acme", "tenant_id": str(tenant), "job_kind": "test_record",
            "status": "failed", "jobs": 1} in status


async def test_a_rate_limit_of_an_unregistered_kind_is_stored_with_a_warning(
    conn: Conn, dsn: str
) -> None:
    """A misspelt kind in `rate_limit` was taken without a word: a limit that never applies."""
    await prepare(conn)
    added = cli(dsn, "tenants", "add", "initech", "--metadata",
                '{"rate_limit": {"test_recrod": {"rps": 1}, "test_record": {"rps": 2}}}')
    assert added.stderr.strip() == (
        "jobpool: warning: tenant initech: rate_limit.test_recrod limits a kind no worker has "
        "registered (`jobpool kinds list`), so it applies to nothing; did you mean "
        "test_record?")
    stored = await scalar(conn, "SELECT metadata -> 'rate_limit' FROM mdm.aa_tenant"
                          " WHERE key = 'initech'")
    assert set(stored) == {"test_recrod", "test_record"}
    clean = cli(dsn, "tenants", "add", "globex", "--metadata",
                '{"rate_limit": {"test_record": {"rps": 2}, "*": {"rps": 9}}}')
    assert clean.stderr == ""  # "*" is every kind without an entry of its own
    shouted = cli(dsn, "tenants", "add", "hooli", "--metadata",
                  '{"rate_limit": {"TEST_RECORD": {"rps": 2}}}')
    assert shouted.stderr.rstrip().endswith("did you mean test_record?")


async def test_tenants_and_enqueue_from_the_cli(conn: Conn, dsn: str) -> None:
    await prepare(conn)
    out = cli(dsn, "tenants", "add", "initech", "--metadata", '{"tier": "gold"}').stdout
    tenant_id = out.split()[-1]
    cli(dsn, "enqueue", "test_record", "--tenant", "initech", "--count", "3", "--import",
        "kinds_for_tests")
    cli(dsn, "enqueue", "test_record", "--tenant", tenant_id, "--idempotency-key", "k",
        "--import", "kinds_for_tests")
    again = cli(dsn, "enqueue", "test_record", "--tenant", tenant_id, "--idempotency-key", "k",
                "--import", "kinds_for_tests")
    assert again.stdout.split(" ", 2)[0] == "job" and again.stdout.rstrip().endswith(
        "exists (idempotency key), pending: this enqueue's payload and options were not used")
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job j JOIN mdm.aa_tenant t"
                        " ON t.id = j.tenant_id WHERE t.key = 'initech'") == 4
    unknown = cli(dsn, "enqueue", "nope", "--tenant", "initech", check=False)
    assert unknown.returncode == 2 and "unknown job kind 'nope'" in unknown.stderr
    ghost = cli(dsn, "enqueue", "test_record", "--tenant", "ghost", "--import",
                "kinds_for_tests", check=False)
    assert ghost.returncode == 2 and "unknown tenant 'ghost'" in ghost.stderr
    typo = cli(dsn, "enqueue", "test_record", "--tenant", "initek", "--import",
               "kinds_for_tests", check=False)
    assert typo.returncode == 2 and "did you mean 'initech'?" in typo.stderr, typo.stderr
    assert ghost.stderr.rstrip().endswith("(`jobpool tenants add KEY` adds one)")
    bad = cli(dsn, "enqueue", "test_record", "--tenant", "initech", "--payload", "{oops",
              check=False)
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


async def test_a_worker_refuses_an_unmigrated_database(empty_dsn: str) -> None:
    result = cli(empty_dsn, "run", "--until-empty", check=False)
    assert result.returncode == 2
    assert "run `jobpool migrate`" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "test_record", "--tenant", "acme", "--delay", "inf"], "--delay: must be"),
        (["enqueue", "test_record", "--tenant", "acme", "--delay", "-5"], "--delay: must be"),
        (["enqueue", "test_record", "--tenant", "acme", "--delay", "nan"], "--delay: must be"),
        (["enqueue", "test_record", "--tenant", "acme", "--payload", '{"a": NaN}'],
         "not valid JSON"),
        (["enqueue", "test_record", "--tenant", "acme", "--payload", '{"a": 1e400}'],
         "out of range"),
        (["enqueue", "test_record", "--tenant", "acme", "--payload", "[1, 2]"],
         "must be a JSON object"),
        (["enqueue", "test_record", "--tenant", "acme", "--idempotency-key", "k", "--count", "3"],
         "cannot go with --count"),
        (["run", "--slots", "abc"], "argument --slots: must be a whole number from 1 to 256"),
        (["run", "--stop-grace", "1_0"], "argument --stop-grace: must be from 0.1 to 3600 seconds"),
        (["pause", "--kind", "test_record", "--reason", "smtp \udcff"],
         "a pause's reason contains a lone surrogate (U+DCFF: the byte 0xFF of text that is not "
         "UTF-8)"),
        (["pause", "--kind", "test_record", "--actor", "\udcff"],
         "argument --actor: an actor contains a lone surrogate (U+DCFF: the byte 0xFF"),
        (["run", "--grace", "\u0663\u0660"], "argument --grace: must be from 0.1 to 3600 seconds"),
        (["tenants", "add", "Robert'); DROP TABLE mdm.aa_job;--"], "invalid tenant key"),
        (["tenants", "add", "00000000-0000-0000-0000-000000000000"], "look like a tenant id"),
        (["tenants", "add", "initech", "--metadata", '{"rate_limit": {"email_send": {"rps": -2}}}'],
         "rate_limit.email_send"),
        (["tenants", "add", "initech", "--metadata",
          '{"rate_limit": {"email_send": {"rps": 1' + "0" * 400 + '}}}'],
         "--metadata: tenant initech: rate_limit.email_send.rps: must be a number of tokens"),
        (["tenants", "add", "initech", "--metadata", '{"rate_limit": {"k": {"rps": 1e308}}}'],
         "--metadata: tenant initech: rate_limit.k.rps: must be a number of tokens"),
        (["tenants", "add", "initech", "--metadata", '{"rate_limit": {"k": {"rps": true}}}'],
         "--metadata: tenant initech: rate_limit.k.rps: must be a number of tokens"),
        (["tenants", "add", "initech", "--metadata",
          '{"rate_limit": {"k": {"rps": 1, "burst": 1e30}}}'],
         "--metadata: tenant initech: rate_limit.k.burst: must be a whole number from 1"),
        (["tenants", "add", "initech", "--metadata", '{"a": ' * 40 + "1" + "}" * 40],
         "--metadata: metadata is nested more than 32 levels deep"),
        (["tenants", "add", "initech", "--metadata", "[" * 20_000 + "]" * 20_000],
         "--metadata: metadata is nested 20000 levels deep, more than the limit of 100"),
        (["tenants", "add", "initech", "--metadata",
          json.dumps({"rate_limit": {f"kind_{n}": {"rps": 1} for n in range(5000)}})],
         "--metadata: metadata is 1"),
        (["run", "--kinds", "test_record", "--grace", "inf"],
         "argument --grace: must be from 0.1 to 3600 seconds, got inf"),
        (["run", "--kinds", "test_record", "--poll-interval", "0"],
         "argument --poll-interval: must be from 0.01 to 3600 seconds, got 0"),
        (["dlq", "list", "--tenant", "ACME"], "'ACME' is neither a tenant key"),
        (["run", "--tenants", "ACME", "--until-empty"],
         "argument --tenants: tenant 'ACME' is neither a tenant key"),
        (["run", "--tenants", "acme," + "a" * 64, "--until-empty"],
         f"argument --tenants: tenant '{'a' * 64}' is neither a tenant key"),
        (["run", "--tenants", "", "--until-empty"],
         "argument --tenants: give at least one tenant key or id, got ''"),
        (["run", "--tenants", ",", "--until-empty"],
         "argument --tenants: give at least one tenant key or id, got ','"),
    ],
)
async def test_bad_input_is_refused_naming_the_problem(
    conn: Conn, dsn: str, tenant: uuid.UUID, args: list[str], message: str
) -> None:
    await prepare(conn)
    result = cli(dsn, *args, "--import", "kinds_for_tests", check=False) if args[0] == "enqueue" \
        else cli(dsn, *args, check=False)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job") == 0
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_tenant") == 2  # system and acme


async def test_a_tenant_id_is_taken_in_any_case(conn: Conn, dsn: str, tenant: uuid.UUID
                                                ) -> None:
    await prepare(conn)
    upper = str(tenant).upper()
    out = cli(dsn, "enqueue", "test_record", "--tenant", upper, "--import", "kinds_for_tests")
    assert "enqueued" in out.stdout
    cli(dsn, *worker_args("test_record", until_empty=True), "--tenants", upper)
    assert await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE tenant_id = %s",
                        (tenant,)) == "done"
    assert json.loads(cli(dsn, "dlq", "list", "--tenant", upper, "--json").stdout) == []


async def test_discard_refuses_a_pending_job(conn: Conn, dsn: str, tenant: uuid.UUID) -> None:
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    result = cli(dsn, "dlq", "discard", str(job_id), check=False)
    assert result.returncode == 2
    assert "only dlq or stopped (failed) jobs can be discarded; stop it first" in result.stderr
    assert (await job(conn, job_id))["status"] == "pending"


async def test_discard_of_a_done_job_does_not_say_to_stop_it(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """A done job cannot be stopped: the refusal says what becomes of it instead."""
    await prepare(conn)
    job_id = (await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")).id
    cli(dsn, *worker_args("test_record", until_empty=True))
    result = cli(dsn, "dlq", "discard", str(job_id), check=False)
    assert result.returncode == 2
    assert result.stderr == (f"jobpool: error: cannot discard job {job_id}: it is done, only dlq "
                             "or stopped (failed) jobs can be discarded; done jobs are deleted "
                             "by the queue's retention (cleanup_jobs), not by hand\n")
    assert (await job(conn, job_id))["status"] == "done"


def test_a_bad_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = cli(None, "status", "--data-dir", str(blocker / "x"), check=False)
    assert result.returncode == 2
    assert "cannot start the embedded PostgreSQL" in result.stderr
    assert "Traceback" not in result.stderr


DOCUMENTED_KIND = '''
import jobpool

@jobpool.kind("invoice_pdf", max_attempts=5, timeout=120, stale_ttl=600,
              backoff_base=10, backoff_max=3600, priority=100)
async def invoice_pdf(job: jobpool.Job, tx) -> dict | None:
    invoice = job.payload.get("invoice_id")
    if not isinstance(invoice, int):
        raise jobpool.PermanentError("payload.invoice_id must be an integer")
    await tx.execute("SELECT %s", (invoice,))
    return {"invoice": invoice}
'''
"""The first example of docs/writing-kinds.md, with a body of its own for the rendering it
leaves to the reader."""


INSTALLED = Path(sys.executable).with_name("jobpool")
"""The installed `jobpool` command, as a user runs it: unlike `python -m jobpool`, it does not
put the current folder on sys.path by itself."""

DOCUMENTED_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: invoices}
spec:
  image: jobpool:test
  database: {secretName: db}
  worker: {imports: [mykinds]}
  lanes:
    - name: invoices
      kinds: [invoice_pdf]
"""
"""A pool file whose lane loads the documented kind from the folder it runs in."""


def installed(dsn: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not INSTALLED.exists():
        pytest.skip(f"no installed jobpool command next to {sys.executable}")
    variables = env(dsn)  # without an empty PYTHONPATH entry, which means the current folder
    variables["PYTHONPATH"] = os.pathsep.join(
        path for path in variables["PYTHONPATH"].split(os.pathsep) if path)
    result = subprocess.run([str(INSTALLED), *args], env=variables, capture_output=True,
                            text=True, timeout=120, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result


async def _invoices(conn: Conn) -> list[dict[str, Any]]:
    cur = await conn.execute("SELECT status::text AS status, result FROM mdm.aa_job"
                             " WHERE job_kind = 'invoice_pdf'")
    return await cur.fetchall()


async def test_the_documented_kind_runs_from_the_current_folder(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    (tmp_path / "mykinds.py").write_text(DOCUMENTED_KIND)
    listed = installed(dsn, "kinds", "list", "--import", "mykinds", cwd=tmp_path).stdout
    assert "invoice_pdf" in listed and "600" in listed
    installed(dsn, "enqueue", "invoice_pdf", "--tenant", "acme", "--payload",
              '{"invoice_id": 7}', "--import", "mykinds", cwd=tmp_path)
    installed(dsn, "run", "--import", "mykinds", "--kinds", "invoice_pdf", "--until-empty",
              "--metrics-port", "0", cwd=tmp_path)
    assert await _invoices(conn) == [{"status": "done", "result": {"invoice": 7}}]


async def test_a_pool_files_kind_modules_are_found_in_the_current_folder(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """`spec.worker.imports` names modules as `--import` does: the pool's own check of its
    lanes' kinds imports them from the folder the command runs in, as its lanes do."""
    (tmp_path / "mykinds.py").write_text(DOCUMENTED_KIND)
    (tmp_path / "pool.yaml").write_text(DOCUMENTED_POOL)
    installed(dsn, "enqueue", "invoice_pdf", "--tenant", "acme", "--payload",
              '{"invoice_id": 8}', "--import", "mykinds", cwd=tmp_path)
    installed(dsn, "run", "pool.yaml", "--until-empty", "--metrics-port", "0", cwd=tmp_path)
    assert await _invoices(conn) == [{"status": "done", "result": {"invoice": 8}}]


async def test_metadata_merged_past_64_kib_is_refused(conn: Conn, dsn: str) -> None:
    half = [json.dumps({f"{part}_{n}": "x" * 20 for n in range(1200)}) for part in "ab"]
    cli(dsn, "tenants", "add", "initech", "--metadata", half[0])
    run = cli(dsn, "tenants", "add", "initech", "--metadata", half[1], check=False)
    assert run.returncode == 2, run.stderr
    assert "--metadata: merged into tenant initech's metadata, it would be more than the " \
           "limit of 64 KiB of JSON" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("args", [["kinds", "list"], ["tenants", "list", "--json"]])
def test_output_to_a_closed_pipe_ends_quietly(dsn: str, args: list[str]) -> None:
    """`jobpool kinds list | head`: the reader has gone; no traceback, exit 141 (SIGPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "jobpool", *args], env=env(dsn),
                             stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert (run.returncode, run.stderr) == (141, "")


@pytest.mark.parametrize(("target", "message"), [
    ("/dev/null", "/dev/null: is not a regular file (a device, pipe or socket)"),
    ("/", "/: is a directory, not a file"),
    ("/nonexistent.csv", "/nonexistent.csv: no such file"),
])
def test_import_says_what_a_path_that_is_no_file_is(dsn: str, target: str, message: str) -> None:
    run = cli(dsn, "import", target, "--tenant", "acme", "--type", "product", check=False)
    assert run.returncode == 2, run.stderr
    assert f"jobpool: error: {message}" in run.stderr


@pytest.mark.parametrize(("module", "message"), [
    ("../../etc/passwd", "cannot import kind module '../../etc/passwd': not a module name"),
    ("/etc/passwd", "cannot import kind module '/etc/passwd': not a module name"),
    ("no_such_module_x", "cannot import kind module 'no_such_module_x': ModuleNotFoundError"),
])
def test_import_of_what_is_no_module_is_a_clear_error(dsn: str, module: str,
                                                       message: str) -> None:
    run = cli(dsn, "kinds", "list", "--import", module, check=False)
    assert run.returncode == 2, run.stderr
    assert message in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("variable_name", ["JOBPOOL_POOL", "JOBPOOL_POOL_NAMESPACE", "JOBPOOL_LANE",
                                           "JOBPOOL_SERVICE_ACCOUNT"])
def test_a_stored_setting_with_an_undecodable_byte_is_refused_naming_it(
    dsn: str, variable_name: str
) -> None:
    """Such a value (a surrogate, as Python carries the byte) could never be written: the
    worker would start and fail at each write of its schedules or its audit rows."""
    result = cli(dsn, "run", "--until-empty", check=False, **{variable_name: "lane-\udcff"})
    assert result.returncode == 2, result.stderr
    assert (f"{variable_name} is text the database cannot keep: it contains a lone surrogate"
            " (U+DCFF: the byte 0xFF of text that is not UTF-8) at index 5") in result.stderr
