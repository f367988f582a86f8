"""Who the audit log names: the person at the CLI, the workers' service account, a token."""

from __future__ import annotations

import json
import socket
import uuid
from typing import Any

import psycopg
from integration.helpers import prepare

import jobpool
from acceptance.cli import jobpool as cli
from acceptance.cli import worker_args
from jobpool.api.overview import job_history

Conn = psycopg.AsyncConnection[dict[str, Any]]
WORKERS = "system:serviceaccount:mdm:jobpool-worker"


async def test_history_names_the_person_the_service_account_and_every_attempt(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    """`jobpool dlq replay 57` without --actor was audited as jobpool-worker; the history
    showed job_enqueued and job_dlq, not the failed attempt between them."""
    await prepare(conn)
    await conn.commit()
    enqueued = cli(dsn, "enqueue", "test_fail", "--tenant", "acme", "--payload",
                   json.dumps({"message": "smtp said no"}), LOGNAME="alice")
    job_id = int(enqueued.stdout.split()[1])
    person = f"user:alice@{socket.gethostname()}"
    cli(dsn, *worker_args("test_fail", until_empty=True), JOBPOOL_SERVICE_ACCOUNT=WORKERS)
    await conn.execute("UPDATE mdm.aa_job SET available_at = now() WHERE id = %s", (job_id,))
    await conn.commit()
    cli(dsn, *worker_args("test_fail", until_empty=True), JOBPOOL_SERVICE_ACCOUNT=WORKERS)
    cli(dsn, "dlq", "replay", str(job_id), LOGNAME="alice")

    rows = await job_history(conn, job_id, tenants=None)
    assert [(row["action"], row["actor"], row["actor_kind"]) for row in rows] == [
        ("job_enqueued", person, "person"),
        ("job_retry", WORKERS, "service account"),
        ("job_dlq", WORKERS, "service account"),
        ("job_replay", person, "person"),
    ]
    retry = json.loads(rows[1]["payload_preview"])  # a small payload: the preview is whole
    assert rows[1]["payload_truncated"] is False
    assert (retry["attempt"], retry["error"], retry["delay_seconds"]) == (
        1, "RuntimeError: smtp said no", 2.0)
    assert rows[0]["actor_name"] == f"alice@{socket.gethostname()}"


async def test_an_enqueue_from_python_names_the_database_role(
    conn: Conn, tenant: uuid.UUID
) -> None:
    """A service's enqueue that names no actor is its database role: a service account."""
    await prepare(conn)
    job = await jobpool.enqueue(conn, tenant_id=tenant, kind="test_noop")
    [row] = await job_history(conn, job.id, tenants=None)
    role = await (await conn.execute("SELECT current_user AS role")).fetchone()
    assert role is not None
    assert (row["actor"], row["actor_kind"]) == (role["role"], "service account")
