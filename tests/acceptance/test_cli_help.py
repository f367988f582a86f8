"""The command line helps where a person gets something slightly wrong."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

import psycopg
from integration.helpers import prepare

from acceptance.cli import jobpool as cli
from acceptance.cli import worker_args

Conn = psycopg.AsyncConnection[dict[str, Any]]


async def test_a_misspelt_kind_gets_the_registered_one_it_looks_like(
    conn: Conn, dsn: str, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await conn.commit()
    result = cli(dsn, "enqueue", "emial_send", "--tenant", "acme", check=False)
    assert result.returncode == 2
    assert "unknown job kind 'emial_send' (did you mean 'email_send'?)" in result.stderr
    result = cli(dsn, *worker_args("test_recrod", until_empty=True), check=False)
    assert result.returncode == 2
    assert "test_recrod (did you mean 'test_record'?)" in result.stderr


async def test_a_taken_metrics_port_stops_the_worker_naming_port_and_setting(
    conn: Conn, dsn: str
) -> None:
    """It used to be logged at ERROR, and the worker ran on without metrics or probes."""
    await prepare(conn)
    await conn.commit()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli(dsn, *worker_args("test_record", until_empty=True, metrics_port=port),
                     check=False, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"cannot serve /metrics on 0.0.0.0:{port}" in result.stderr
    assert "--metrics-port / JOBPOOL_METRICS_PORT" in result.stderr


async def test_the_demo_runs_outside_the_repository(
    conn: Conn, dsn: str, tmp_path: Path
) -> None:
    """`jobpool demo` in another folder could not read examples/pool.yaml."""
    await prepare(conn)
    await conn.commit()
    result = cli(dsn, "demo", "--emails", "2", cwd=tmp_path, timeout=180)
    assert "smtp: 2 message(s) delivered" in result.stdout, result.stdout + result.stderr
    assert not (tmp_path / "examples").exists()
