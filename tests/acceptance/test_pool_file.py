"""`jobpool run pool.yaml` and `jobpool demo`: a JobWorkerPool file run as local processes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from integration.helpers import prepare, scalar
from pool_faults import BROKEN_LANE

import jobpool
from acceptance.cli import REPO, env
from acceptance.cli import jobpool as cli
from jobpool.core.poolspec import load_pool_file
from jobpool.k8s.manifests import build_worker_env

POD_ONLY = ("JOBPOOL_METRICS_PORT", "JOBPOOL_SERVICE_ACCOUNT")
"""A pod's own: its metrics port (a local process n gets port + n) and its service account
(from the downward API; a local process is audited as the settings' service account)."""

Conn = psycopg.AsyncConnection[dict[str, Any]]
DEADLINE = 60.0

POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: local}
spec:
  image: jobpool:test
  database: {secretName: db}
  lanes:
    - name: records
      kinds: [test_record]
      workersPerPod: 3
      minReplicas: 2
      maxReplicas: 4
    - name: acme-sleepers
      kinds: [test_sleep]
      tenants: [acme]
      workersPerPod: 2
      minReplicas: 0
      maxReplicas: 1
"""


async def test_each_lane_runs_as_local_processes_until_empty(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await prepare(conn)
    other = await scalar(conn, "INSERT INTO mdm.aa_tenant (key) VALUES ('globex') RETURNING id")
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_record")] * 40)
    await jobpool.enqueue_many(conn, [jobpool.NewJob(tenant, "test_sleep", {"seconds": 0})] * 3)
    foreign = await jobpool.enqueue(conn, tenant_id=other, kind="test_sleep",
                                    payload={"seconds": 0})
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    result = cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
                 "--metrics-port", "0", "--log-level", "warning")
    assert "lane records: 2 process(es) x 3 slot(s); kinds: test_record" in result.stdout
    assert "lane acme-sleepers: 1 process(es) x 2 slot(s); kinds: test_sleep" in result.stdout
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_job WHERE status = 'done'") == 43
    assert await scalar(conn, "SELECT count(DISTINCT worker_pid) FROM test_runs r"
                        " JOIN mdm.aa_job j ON j.id = r.job_id WHERE j.job_kind = 'test_record'"
                        ) in (1, 2)
    # no lane serves test_sleep for globex
    assert await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                        (foreign.id,)) == "pending"


def laughs(indent: str, levels: int = 30) -> str:
    """YAML lines anchoring `levels` lists, each holding the one before 4 times: 4^30 values
    once expanded, in 2 KB ("billion laughs")."""
    lines = [f"{indent}l0: &l0 [x, x, x, x]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 4)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


CAPPED_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: local}
spec:
  image: jobpool:test
  database: {secretName: db}
  worker:
    env: [{name: JOBPOOL_SMTP_FROM, value: lanes@example.com}]
  lanes:
    - name: capped
      kinds: [test_env]
      rateLimits:
        providers: {relay: {rps: 50, burst: 50}}
        kinds: {test_env: relay}
"""


async def test_local_lane_processes_get_the_environment_the_operator_gives_pods(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """The lane's rateLimits reach its processes as JOBPOOL_RATE_LIMITS, as on Kubernetes,
    replacing one inherited from the shell."""
    await prepare(conn)
    pool = tmp_path / "pool.yaml"
    pool.write_text(CAPPED_POOL)
    spec = load_pool_file(pool)
    pod_env = {item["name"]: item["value"] for item in build_worker_env(spec, spec.lane("capped"))
               if "value" in item and item["name"] not in POD_ONLY}
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_env",
                                payload={"names": sorted(pod_env)})
    cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
        "--metrics-port", "0", "--log-level", "warning",
        JOBPOOL_RATE_LIMITS='{"providers": {}}')
    assert await scalar(conn, "SELECT result FROM mdm.aa_job WHERE id = %s", (job.id,)) == pod_env
    assert set(pod_env) >= {"JOBPOOL_RATE_LIMITS", "JOBPOOL_LANE", "JOBPOOL_SMTP_FROM"}


ENV_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: flags}
spec:
  image: jobpool:test
  database: {secretName: db}
  lanes:
    - name: env
      kinds: [test_env]
"""


async def test_the_flags_of_the_command_reach_the_lane_processes(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """`--dsn` and `--poll-interval` count for the pool's processes as their variables do
    (they used to get only the shell's environment, so `--dsn` alone left them on an
    embedded server, here one that cannot start)."""
    await prepare(conn)
    pool = tmp_path / "pool.yaml"
    pool.write_text(ENV_POOL)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    names = ["JOBPOOL_DSN", "JOBPOOL_POLL_INTERVAL", "JOBPOOL_LANE"]
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_env", payload={"names": names})
    cli(None, "run", str(pool), "--dsn", dsn, "--poll-interval", "0.5", "--until-empty",
        "--import", "kinds_for_tests", "--metrics-port", "0", "--log-level", "warning",
        JOBPOOL_DATA_DIR=str(not_a_folder))
    assert await scalar(conn, "SELECT result FROM mdm.aa_job WHERE id = %s", (job.id,)) == {
        "JOBPOOL_DSN": dsn, "JOBPOOL_POLL_INTERVAL": "0.5", "JOBPOOL_LANE": "env"}


PORT_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: local}
spec:
  image: jobpool:test
  database: {secretName: db}
  worker: {metricsPort: PORT}
  lanes:
    - {name: records, kinds: [test_record]}
"""


async def test_the_pool_files_metrics_port_counts_unless_the_flag_is_given(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """`spec.worker.metricsPort` is the local pool's first port, as it is its pods' (it used
    to be ignored for the flag's default, 9108); `--metrics-port` still overrides it. A
    port held here makes the first run's lane fail at start, naming that port."""
    await prepare(conn)
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        pool = tmp_path / "pool.yaml"
        pool.write_text(PORT_POOL.replace("PORT", str(port)))
        taken = cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
                    check=False)
        assert taken.returncode == 2, taken.stderr
        assert f"cannot serve /metrics on 0.0.0.0:{port}" in taken.stderr
        cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
            "--metrics-port", "0")


def test_the_example_pool_runs_until_empty_before_its_tenant_exists(dsn: str) -> None:
    """The example's lane `acme` names a tenant a fresh database does not have yet: with
    --until-empty it has nothing to run, so it ends like the others."""
    result = cli(dsn, "run", "examples/pool.yaml", "--until-empty", "--metrics-port", "0",
                 "--log-level", "warning", timeout=300)
    assert "tenant(s) acme do not exist: nothing to run for them" in result.stderr


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (POOL.replace("minReplicas: 2\n", "minReplicas: 5\n"), "spec.lanes[0]"),
        (POOL.replace("workersPerPod: 3", "workersPerPod: many"), "spec.lanes[0].workersPerPod"),
        ("spec: [unclosed", "pool.yaml"),
        (POOL + "  schedules:\n    - {name: nightly, kind: test_record, cron: '30 2 * * *', "
                "timeZone: Europe}\n",
         "spec.schedules[0].timeZone: unknown time zone 'Europe'"),
        (POOL.replace("      maxReplicas: 4\n", "      maxReplicas: 4\n"
                      "      rateLimits: {providers: {a: {rps: .inf, burst: 5}}}\n"),
         "spec.lanes[0].rateLimits.providers.a.rps: inf is not a finite number"),
        (POOL.replace("      workersPerPod: 3\n", "      workersPerPod: 3\n" + laughs("      ")),
         "more than 20000 values once aliases are expanded"),
    ],
)
def test_an_invalid_pool_file_is_refused_naming_the_field(
    dsn: str, tmp_path: Path, document: str, message: str
) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text(document)
    result = cli(dsn, "run", str(pool), "--until-empty", check=False)
    assert result.returncode == 2
    assert message in result.stderr


def test_the_demo_logs_warnings_only_unless_asked(dsn: str) -> None:
    """The summary on stdout is what a newcomer reads: the workers' line per job stays out of
    stderr beside it, the DLQ warning stays in; `--log-level info` brings the lines back."""
    quiet = cli(dsn, "demo", "--emails", "2", timeout=300)
    assert "smtp: 2 message(s) delivered" in quiet.stdout
    assert " INFO " not in quiet.stderr, quiet.stderr
    assert "moved to the DLQ" in quiet.stderr
    chatty = cli(dsn, "demo", "--emails", "1", "--log-level", "info", timeout=300)
    assert " INFO jobpool.worker: job " in chatty.stderr, chatty.stderr


def test_quickstart_demo_on_the_embedded_postgres(tmp_path: Path) -> None:
    """The README's second command, with no database server configured."""
    result = cli(None, "demo", "--data-dir", str(tmp_path / ".jobpool"), "--emails", "6",
                 "--log-level", "warning", timeout=300, cwd=REPO)
    assert "smtp: 6 message(s) delivered" in result.stdout
    assert "DLQ: job" in result.stdout and "SMTP rejected the recipient" in result.stdout
    assert "suppressed" not in result.stderr
    assert (tmp_path / ".jobpool" / "postgres" / "PG_VERSION").exists()


# -- lanes that fail, crash, and Ctrl-C ------------------------------------------------------

FAULTY_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: local}
spec:
  image: jobpool:test
  database: {secretName: db}
  worker: {graceSeconds: 30}
  lanes:
    - name: records
      kinds: [test_record, test_crash_once]
      workersPerPod: 2
    - name: LANE
      kinds: [test_sleep]
      workersPerPod: 2
"""


def start_pool(dsn: str, pool: Path, *args: str) -> subprocess.Popen[str]:
    """`jobpool run pool.yaml` in a session of its own, as a shell runs a foreground job:
    `os.killpg(its pid, SIGINT)` is what Ctrl-C in the terminal sends."""
    return subprocess.Popen(
        [sys.executable, "-m", "jobpool", "run", str(pool), "--import", "kinds_for_tests",
         "--import", "pool_faults", "--metrics-port", "0", "--log-level", "warning", *args],
        env=env(dsn), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        start_new_session=True)


async def wait_for(conn: Conn, query: str, params: tuple[Any, ...], expected: Any) -> None:
    for _ in range(int(DEADLINE / 0.1)):
        if await scalar(conn, query, params) == expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{query} {params} never gave {expected!r}")


async def job_status(conn: Conn, job: int, status: str) -> None:
    await wait_for(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s", (job,), status)


async def finish(pool: subprocess.Popen[str], timeout: float = DEADLINE) -> str:
    _, err = await asyncio.to_thread(pool.communicate, timeout=timeout)
    return err


def faulty_pool(tmp_path: Path, lane: str = "sleepers") -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(FAULTY_POOL.replace("LANE", lane))
    return path


async def test_a_kind_no_module_registers_is_refused_before_any_lane_starts(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """A misspelt kind would leave the real one to the catch-all lane (it excludes only the
    kinds other lanes list): the pool is refused, naming the lane, the kind and its likely
    name, and nothing runs."""
    await prepare(conn)
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
    pool = tmp_path / "pool.yaml"
    pool.write_text(FAULTY_POOL.replace("kinds: [test_record, test_crash_once]",
                                        "kinds: [test_recrod]").replace(
        "LANE\n      kinds: [test_sleep]\n", "rest\n"))  # the second lane: a catch-all

    result = cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
                 "--metrics-port", "0", check=False)

    assert result.returncode == 2, result.stderr
    assert ("spec.lanes[0].kinds (lane 'records'): unknown job kind(s) 'test_recrod' (did you "
            "mean 'test_record'?); registered kinds are ") in result.stderr
    assert "starting" not in result.stderr
    assert await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                        (job.id,)) == "pending"


async def test_a_schedule_of_an_unknown_kind_or_a_refused_payload_is_refused_at_start(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """Such a pool started and logged an error at every tick of the schedule, for good."""
    await prepare(conn)
    pool = tmp_path / "pool.yaml"
    pool.write_text(FAULTY_POOL.replace("LANE", "rest") + """  schedules:
    - {name: mail, kind: email_sned, tenant: acme, every: 60}
    - {name: nightly, kind: reindex, tenant: acme, payload: {entity_type: product},
       cron: "30 2 * * *"}
""")

    result = cli(dsn, "run", str(pool), "--until-empty", "--import", "kinds_for_tests",
                 "--import", "pool_faults", "--metrics-port", "0", check=False)

    assert result.returncode == 2, result.stderr
    assert ("spec.schedules[0].kind (schedule 'mail'): unknown job kind 'email_sned' (did you "
            "mean 'email_send'?); spec.schedules[1].payload (schedule 'nightly'): payload of "
            "job kind 'reindex' is invalid: ") in result.stderr
    assert "type_key" in result.stderr
    assert "starting" not in result.stderr


async def test_a_lane_that_fails_at_start_stops_the_pool_with_its_status(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    await prepare(conn)
    pool = start_pool(dsn, faulty_pool(tmp_path, BROKEN_LANE))
    err = await finish(pool)
    assert pool.returncode == 2, err
    assert "cannot import kind module 'pool_faults': RuntimeError: this lane cannot start" in err
    assert "lane broken worker 0 failed at start (exit status 2); stopping the pool" in err


async def test_a_lane_worker_that_crashes_later_is_restarted(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await prepare(conn)
    pool = start_pool(dsn, faulty_pool(tmp_path))
    try:
        first = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        await job_status(conn, first.id, "done")  # the lane has started
        await jobpool.enqueue(conn, tenant_id=tenant, kind="test_crash_once",
                              payload={"marker": str(tmp_path / "crashed")})
        await wait_for(conn, "SELECT count(*) FROM mdm.aa_job WHERE job_kind = %s AND "
                       "status = 'running'", ("test_crash_once",), 1)
        later = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_record")
        await job_status(conn, later.id, "done")
        pids = await scalar(conn, "SELECT array_agg(DISTINCT worker_pid) FROM test_runs")
        assert len(pids) == 2  # the restarted worker ran the later job
    finally:
        pool.send_signal(signal.SIGTERM)
        err = await finish(pool)
    assert pool.returncode == 0, err
    assert "lane records worker 0 exited with 3 after " in err
    assert "restarting it in " in err


async def test_ctrl_c_exits_0_after_the_running_jobs_finish(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await prepare(conn)
    pool = start_pool(dsn, faulty_pool(tmp_path))
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep", payload={"seconds": 2})
    await job_status(conn, job.id, "running")

    os.killpg(pool.pid, signal.SIGINT)

    err = await finish(pool)
    assert pool.returncode == 0, err
    assert "running jobs get 30s to finish, then are handed back (Ctrl-C again hands them " \
           "back now)" in err
    assert "exited with" not in err
    assert await scalar(conn, "SELECT status::text FROM mdm.aa_job WHERE id = %s",
                        (job.id,)) == "done"


async def test_a_second_ctrl_c_hands_back_at_once_and_exits_0(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    await prepare(conn)
    pool = start_pool(dsn, faulty_pool(tmp_path))
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_sleep",
                                payload={"seconds": 600})
    await job_status(conn, job.id, "running")

    os.killpg(pool.pid, signal.SIGINT)
    await asyncio.sleep(1)
    os.killpg(pool.pid, signal.SIGINT)

    err = await finish(pool, timeout=20)  # not the 30 s grace period
    assert pool.returncode == 0, err
    assert "stopping the pool now: running jobs are handed back at once" in err
    row = await scalar(conn, "SELECT row(status::text, claimed_by IS NULL)::text FROM mdm.aa_job"
                       " WHERE id = %s", (job.id,))
    assert row == "(pending,t)"


SCHEDULED_POOL = """
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: scheduled}
spec:
  image: jobpool:test
  database: {secretName: db}
  lanes:
    - name: ticks
      kinds: [test_noop]
      minReplicas: 2
  schedules:
    - {name: every-second, kind: test_noop, tenant: acme, every: 1, payload: {from: pool}}
"""


async def test_the_schedules_of_a_pool_file_are_enqueued_once_per_tick(
    conn: Conn, dsn: str, tenant: uuid.UUID, tmp_path: Path
) -> None:
    """Two lane processes share the pool file's 1-second schedule: each tick has one job,
    run by the lane, with the declared tenant and payload."""
    await prepare(conn)
    path = tmp_path / "pool.yaml"
    path.write_text(SCHEDULED_POOL)
    pool = start_pool(dsn, path)
    try:
        await wait_for(conn, "SELECT count(*) >= 3 FROM mdm.aa_job WHERE job_kind = 'test_noop'"
                       " AND status = 'done'", (), True)
    finally:
        os.killpg(pool.pid, signal.SIGINT)
        err = await finish(pool)
    assert pool.returncode == 0, err
    cur = await conn.execute(
        "SELECT count(*) AS jobs, count(DISTINCT idempotency_key) AS ticks,"
        " extract(epoch FROM max(t) - min(t))::int + 1 AS covered,"
        " array_agg(DISTINCT payload::text) AS payloads, array_agg(DISTINCT tenant_id) AS who"
        " FROM (SELECT *, replace(idempotency_key, 'schedule:every-second:', '')::timestamptz"
        " AS t FROM mdm.aa_job WHERE job_kind = 'test_noop') AS k")
    row = await cur.fetchone()
    assert row is not None
    assert row["jobs"] == row["ticks"] == row["covered"]
    assert (row["payloads"], row["who"]) == (['{"from": "pool"}'], [tenant])
    owner = await scalar(conn, "SELECT owner FROM mdm.aa_schedule WHERE name = 'every-second'")
    assert owner == "scheduled"
