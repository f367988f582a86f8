"""Schedules against PostgreSQL: declarations, due ticks enqueued once across racing workers,
the built-in cleanup schedule, errors recorded."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from integration.helpers import prepare, scalar, wait_until, worker
from jobpool import settings
from jobpool import settings as settings_module
from jobpool.cli import main
from jobpool.core.schedules import ScheduleError, cleanup_schedule, parse_schedule
from jobpool.db.connect import open_pool
from jobpool.worker.scheduler import (
    Declarations,
    declarations_for,
    declare,
    enqueue_due_ticks,
    keep_scheduled,
)

Conn = psycopg.AsyncConnection[dict[str, Any]]

EVERY_SECOND = parse_schedule({"name": "tick", "kind": "test_noop", "tenant": "acme",
                               "every": 1, "payload": {"n": 1}}, "s")


async def rewind(conn: Conn, name: str, seconds: float) -> None:
    """Make the schedule's next tick `seconds` old, as if nothing had run since."""
    await conn.execute(
        "UPDATE mdm.aa_schedule SET next_run_at = date_trunc('second', clock_timestamp())"
        " - make_interval(secs => %s) WHERE name = %s", (seconds, name))


async def keys(conn: Conn, prefix: str) -> list[str]:
    cur = await conn.execute("SELECT idempotency_key FROM mdm.aa_job WHERE idempotency_key"
                             " LIKE %s ORDER BY idempotency_key", (prefix + "%",))
    return [row["idempotency_key"] for row in await cur.fetchall()]


async def tick_counts(conn: Conn, name: str) -> tuple[int, int, int]:
    """(jobs, distinct tick keys, ticks from the first to the last key) of 1-second schedule
    `name`."""
    cur = await conn.execute(
        "SELECT count(*) AS jobs, count(DISTINCT t) AS ticks,"
        " extract(epoch FROM max(t) - min(t))::int + 1 AS covered FROM (SELECT"
        " replace(idempotency_key, %s, '')::timestamptz AS t FROM mdm.aa_job"
        " WHERE idempotency_key LIKE %s) AS k", (f"schedule:{name}:", f"schedule:{name}:%"))
    row = await cur.fetchone()
    assert row is not None
    return row["jobs"], row["ticks"], row["covered"]


async def test_due_ticks_are_enqueued_once_with_their_bookkeeping(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    await declare(conn, Declarations("pool-a", (EVERY_SECOND,), retire=True))
    await rewind(conn, "tick", 10)
    runs = await enqueue_due_ticks(conn, actor="scheduler")
    assert [(run.name, run.created, run.missed) for run in runs] == [("tick", len(runs[0].ticks),
                                                                      0)]
    assert len(runs[0].ticks) >= 11  # 10 s ago up to now
    enqueued = await keys(conn, "schedule:tick:")
    assert len(enqueued) == len(runs[0].ticks)
    cur = await conn.execute("SELECT * FROM mdm.aa_schedule WHERE name = 'tick'")
    schedule = await cur.fetchone()
    assert schedule is not None
    assert schedule["last_run_at"] == runs[0].ticks[-1]
    assert schedule["next_run_at"] == runs[0].ticks[-1] + timedelta(seconds=1)
    cur = await conn.execute("SELECT DISTINCT tenant_id, payload FROM mdm.aa_job"
                             " WHERE job_kind = 'test_noop'")
    assert await cur.fetchall() == [{"tenant_id": tenant, "payload": {"n": 1}}]
    again = await enqueue_due_ticks(conn, actor="s")  # at most the tick of the next second
    assert all(run.created == len(run.ticks) <= 2 for run in again)


async def test_racing_schedulers_enqueue_every_tick_exactly_once(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    """Five schedulers on connections of their own check the same 1-second schedule without
    pause; every tick from the first to the last enqueued is enqueued once, by one of them
    (none of them even tried a tick twice)."""
    await prepare(conn)
    await declare(conn, Declarations("pool-a", (EVERY_SECOND,), retire=True))
    await rewind(conn, "tick", 30)
    pool = open_pool(dsn, size=5)
    await pool.open()
    tried: list[str] = []
    created = 0

    async def race(rounds: int) -> None:
        nonlocal created
        async with pool.connection() as own:
            for _ in range(rounds):
                for run in await enqueue_due_ticks(own, actor="racer"):
                    tried.extend(t.isoformat() for t in run.ticks)
                    created += run.created

    try:
        await asyncio.gather(*(race(40) for _ in range(5)))
    finally:
        await pool.close()
    enqueued = await keys(conn, "schedule:tick:")
    assert len(tried) == len(set(tried)) == len(enqueued) == created
    assert len(enqueued) >= 31
    assert await tick_counts(conn, "tick") == (created, created, created)


async def test_three_workers_and_two_schedulers_enqueue_each_tick_once(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    """Three long-running workers (on their maintenance timer, with the built-in cleanup every
    second) and two bare schedulers share a declared 1-second schedule: each tick in the
    covered range has exactly one job; the cleanup ticks run in a worker, never as jobs."""
    await prepare(conn)
    workers = [worker(dsn, ("test_noop",), until_empty=False, cleanup_every=1)
               for _ in range(3)]
    pool = open_pool(dsn, size=2)
    await pool.open()
    store: Any = type("Store", (), {"pool": pool})()
    online = asyncio.Event()
    online.set()
    declared = Declarations("pool-a", (EVERY_SECOND,), retire=True)
    schedulers = [asyncio.create_task(keep_scheduled(
        store, declared, actor="scheduler", online=online, healthy=lambda: None,
        database_error=lambda exc: None)) for _ in range(2)]
    previous = settings.current()
    settings.configure(settings.Settings.from_env(
        {"JOBPOOL_POOL": "pool-a", "JOBPOOL_SCHEDULES": json.dumps([EVERY_SECOND.to_json()])}))
    runs = [asyncio.create_task(w.run()) for w in workers]

    async def enough() -> bool:
        cleanups = await scalar(conn, "SELECT count(*) AS n FROM mdm.aa_schedule WHERE name ="
                                " 'cleanup_jobs' AND last_run_at > declared_at + interval '2 s'")
        return bool(cleanups and len(await keys(conn, "schedule:tick:")) >= 5)

    try:
        await wait_until(enough, "five ticks and the cleanup ticking", 60)
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*runs)
        for task in schedulers:
            task.cancel()
        await asyncio.gather(*schedulers, return_exceptions=True)
        await pool.close()
        settings.configure(previous)
    jobs, ticks, covered = await tick_counts(conn, "tick")
    assert jobs == ticks == covered  # one job per tick, no tick left out
    assert await scalar(conn, "SELECT count(*) AS n FROM mdm.aa_job"
                        " WHERE job_kind = 'cleanup_jobs'") == 0


async def test_a_changed_declaration_starts_again_and_a_dropped_one_is_retired(
    conn: Conn, tenant: uuid.UUID
) -> None:
    await prepare(conn)
    other = parse_schedule({"name": "other", "kind": "test_noop", "every": 60}, "s")
    await declare(conn, Declarations("pool-a", (EVERY_SECOND, other), retire=True))
    await declare(conn, Declarations("pool-b", (cleanup_schedule(300),), retire=True))
    await rewind(conn, "tick", 5)
    await declare(conn, Declarations("pool-a", (EVERY_SECOND,), retire=True))  # unchanged
    kept = await scalar(conn, "SELECT next_run_at < clock_timestamp() - interval '4 s' AS kept"
                        " FROM mdm.aa_schedule WHERE name = 'tick'")
    assert kept
    names = await scalar(conn, "SELECT array_agg(name ORDER BY name) AS n FROM mdm.aa_schedule")
    assert names == ["cleanup_jobs", "tick"]
    faster = parse_schedule({**EVERY_SECOND.to_json(), "every": 2}, "s")
    await declare(conn, Declarations("pool-a", (faster,), retire=False))
    restarted = await scalar(conn, "SELECT next_run_at > clock_timestamp() - interval '1 s'"
                             " AS r FROM mdm.aa_schedule WHERE name = 'tick'")
    assert restarted


async def test_a_name_another_pool_declared_is_refused_naming_both_declarations(
    conn: Conn, tenant: uuid.UUID
) -> None:
    """Pool b's `tick` (another kind) and its identical `other` are refused, and nothing of
    b's is written; a's rows keep their declarations, and b's own retire touches none of
    them. Once a drops `tick`, b may declare it."""
    await prepare(conn)
    other = parse_schedule({"name": "other", "kind": "test_noop", "every": 60}, "s")
    await declare(conn, Declarations("pool-a", (EVERY_SECOND, other), retire=True))
    await rewind(conn, "tick", 5)
    theirs = parse_schedule({"name": "tick", "kind": "test_record", "tenant": "acme",
                             "cron": "0 * * * *"}, "s")
    mine = parse_schedule({"name": "mine", "kind": "test_noop", "every": 30}, "s")
    with pytest.raises(ScheduleError) as refused:
        await declare(conn, Declarations("pool-b", (mine, theirs, other), retire=True))
    assert str(refused.value) == (
        "schedule 'other' is declared by pool 'pool-a' (kind test_noop, tenant system, "
        "every 60s); pool 'pool-b' declares the same schedule; "
        "schedule 'tick' is declared by pool 'pool-a' (kind test_noop, tenant acme, "
        "every 1s); pool 'pool-b' declares kind test_record, tenant acme, 0 * * * *: "
        "a schedule's name is unique per database and belongs to the pool that declared it "
        "first; rename it in one pool, or drop it from the other pool first")
    cur = await conn.execute("SELECT name, owner, job_kind,"
                             " next_run_at < clock_timestamp() - interval '4 s' AS kept"
                             " FROM mdm.aa_schedule WHERE name <> 'cleanup_jobs' ORDER BY name")
    assert await cur.fetchall() == [
        {"name": "other", "owner": "pool-a", "job_kind": "test_noop", "kept": False},
        {"name": "tick", "owner": "pool-a", "job_kind": "test_noop", "kept": True}]

    await declare(conn, Declarations("pool-a", (other,), retire=True))
    await declare(conn, Declarations("pool-b", (mine, theirs), retire=True))
    cur = await conn.execute("SELECT name, owner, job_kind FROM mdm.aa_schedule"
                             " WHERE name <> 'cleanup_jobs' ORDER BY name")
    assert await cur.fetchall() == [
        {"name": "mine", "owner": "pool-b", "job_kind": "test_noop"},
        {"name": "other", "owner": "pool-a", "job_kind": "test_noop"},
        {"name": "tick", "owner": "pool-b", "job_kind": "test_record"}]


async def test_a_worker_whose_pool_declares_another_pools_name_is_not_ready_naming_it(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    """The worker runs on (its other tasks, its jobs); its maintenance task fails and is
    started again, and its readiness names the clash; the schedule stays pool a's."""
    await prepare(conn)
    await declare(conn, Declarations("pool-a", (EVERY_SECOND,), retire=True))
    previous = settings.current()
    settings.configure(settings.Settings.from_env(
        {"JOBPOOL_POOL": "pool-b", "JOBPOOL_POOL_NAMESPACE": "mdm",
         "JOBPOOL_SCHEDULES": json.dumps([EVERY_SECOND.to_json()])}))
    clashing = worker(dsn, ("test_noop",), until_empty=False)
    run = asyncio.create_task(clashing.run())

    async def refused() -> bool:
        return any("schedule 'tick' is declared by pool 'pool-a' (kind test_noop, tenant "
                   "acme, every 1s); pool 'mdm/pool-b' declares" in problem
                   for problem in clashing.background.problems())

    try:
        await wait_until(refused, "the clash among the readiness problems", 30)
    finally:
        clashing.stop()
        await run
        settings.configure(previous)
    assert [p for p in clashing.background.problems() if "maintenance" not in p] == []
    assert await scalar(conn, "SELECT owner FROM mdm.aa_schedule WHERE name = 'tick'") == "pool-a"


async def test_a_schedule_whose_job_cannot_exist_records_why(conn: Conn) -> None:
    await prepare(conn)
    nobody = parse_schedule({"name": "lost", "kind": "test_noop", "tenant": "nobody",
                             "every": 1}, "s")
    await declare(conn, Declarations("", (nobody,), retire=False))
    await rewind(conn, "lost", 3)
    runs = await enqueue_due_ticks(conn, actor="s")
    assert runs[0].error is not None and "nobody" in runs[0].error
    error = await scalar(conn, "SELECT last_error FROM mdm.aa_schedule WHERE name = 'lost'")
    assert "nobody" in error
    moved_on = await scalar(conn, "SELECT next_run_at > clock_timestamp() - interval '2 s'"
                            " AS m FROM mdm.aa_schedule WHERE name = 'lost'")
    assert moved_on  # its ticks are dropped, not retried at every check


def test_jobpool_schedules_names_the_variable_and_the_field() -> None:
    bad = json.dumps([{"name": "x", "kind": "k", "cron": "0 25 * * *"}])
    with pytest.raises(ValueError, match=r"^JOBPOOL_SCHEDULES\[0\]\.cron: "):
        declarations_for("pool-a", None, bad, ())
    plain = declarations_for(None, None, None, (cleanup_schedule(300),))
    assert (plain.retire, [s.name for s in plain.schedules]) == (False, ["cleanup_jobs"])
    for pool in (None, "", "  "):  # their owner would be the built-in one's
        with pytest.raises(ValueError, match=r"^JOBPOOL_SCHEDULES needs JOBPOOL_POOL: "):
            declarations_for(pool, None, "[]", ())


@pytest.mark.parametrize(("variables", "message"), [
    ({"JOBPOOL_SCHEDULES": "notjson", "JOBPOOL_POOL": "p"},
     "JOBPOOL_SCHEDULES: not JSON (Expecting value"),
    ({"JOBPOOL_SCHEDULES": '[{"name": "x"}]', "JOBPOOL_POOL": "p"},
     "JOBPOOL_SCHEDULES[0].kind: required"),
    ({"JOBPOOL_SCHEDULES": "[]"}, "JOBPOOL_SCHEDULES needs JOBPOOL_POOL"),
])
def test_a_worker_with_bad_schedules_does_not_start(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        variables: dict[str, str], message: str) -> None:
    """It used to start and run jobs while its maintenance task failed at every try, so the
    pool's schedules and the queue's clean-up never ran on it (a one-off drain never knew)."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(settings_module, "_current", None)  # main() configures the process's
    assert main(["run", "--kinds", "test_record", "--until-empty", "--import",
                 "kinds_for_tests", "--dsn", "postgresql://unused@127.0.0.1:1/x"]) == 2
    assert f"jobpool: error: {message}" in capsys.readouterr().err


async def test_no_declaration_retires_the_built_in_schedule(conn: Conn) -> None:
    """A worker given JOBPOOL_SCHEDULES without JOBPOOL_POOL declared under the built-in owner
    and retired `cleanup_jobs`, the maintenance of every worker."""
    await declare(conn, Declarations("", (cleanup_schedule(300),), retire=False))
    await declare(conn, Declarations("", (), retire=True))
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_schedule"
                        " WHERE name = 'cleanup_jobs'") == 1


async def test_the_metrics_carry_each_schedules_last_and_next_run(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    from jobpool.metrics import QueueGauges

    await prepare(conn)
    await declare(conn, Declarations("pool-a", (EVERY_SECOND,), retire=True))
    await rewind(conn, "tick", 2)
    await enqueue_due_ticks(conn, actor="s")
    cur = await conn.execute("SELECT last_run_at, next_run_at FROM mdm.aa_schedule")
    row = await cur.fetchone()
    assert row is not None
    gauges = QueueGauges(dsn)
    try:
        await gauges.refresh()
    finally:
        await gauges.close()
    samples = {family.name: [(s.labels, s.value) for s in family.samples]
               for family in gauges.collect()}
    labels = {"schedule": "tick", "kind": "test_noop"}
    assert samples["mdm_schedule_last_run_timestamp_seconds"] == [
        (labels, row["last_run_at"].timestamp())]
    assert samples["mdm_schedule_next_run_timestamp_seconds"] == [
        (labels, row["next_run_at"].timestamp())]


async def test_the_operator_reads_the_runs_of_a_pools_own_schedules_and_names_other_owners(
    dsn: str, conn: Conn, tenant: uuid.UUID
) -> None:
    """Pool `jobs` of namespace b declares `tick` too, which pool `jobs` of namespace a owns
    (b's workers are refused): b's status names a's pool and shows none of a's runs."""
    from jobpool.core.poolspec import load_pool
    from jobpool.db.lane_counts import LaneCounter
    from jobpool.k8s.status import schedule_status

    await prepare(conn)
    mine = parse_schedule({"name": "mine", "kind": "test_noop", "every": 60}, "s")
    await declare(conn, declarations_for("jobs", "a", json.dumps([EVERY_SECOND.to_json()]),
                                         [cleanup_schedule(300)]))
    await declare(conn, declarations_for("jobs", "b", json.dumps([mine.to_json()]), []))
    await rewind(conn, "tick", 2)
    await enqueue_due_ticks(conn, actor="s")
    counter = LaneCounter()
    try:
        rows = await counter.schedule_runs(dsn, "b/jobs", ["mine", "tick", "absent"])
    finally:
        await counter.close()
    assert [(r["name"], r["owner"], r["last_run_at"]) for r in rows] == [
        ("mine", "b/jobs", None), ("tick", "a/jobs", None)]
    pool_b = load_pool({
        "apiVersion": "jobs.mdm.io/v1alpha1", "kind": "JobWorkerPool",
        "metadata": {"name": "jobs", "namespace": "b"},
        "spec": {"image": "jobpool:0.1.0", "database": {"secretName": "db"},
                 "lanes": [{"name": "default"}],
                 "schedules": [mine.to_json(), EVERY_SECOND.to_json()]}})
    entries = schedule_status(pool_b, rows, None)
    assert [e.get("declaredBy") for e in entries] == [None, "a/jobs"]
    assert "nextRunTime" in entries[0] and "lastRunTime" not in entries[1]


async def test_pools_of_one_name_in_two_namespaces_keep_their_schedules_apart(
    conn: Conn, tenant: uuid.UUID
) -> None:
    """Each retires only what it declared; one's name in the other is refused, naming it."""
    await prepare(conn)
    other = parse_schedule({"name": "other", "kind": "test_noop", "every": 60}, "s")
    await declare(conn, declarations_for("jobs", "a", json.dumps([EVERY_SECOND.to_json()]), []))
    await declare(conn, declarations_for("jobs", "b", json.dumps([other.to_json()]), []))
    await declare(conn, declarations_for("jobs", "a", json.dumps([EVERY_SECOND.to_json()]), []))
    cur = await conn.execute("SELECT name, owner FROM mdm.aa_schedule ORDER BY name")
    assert await cur.fetchall() == [{"name": "other", "owner": "b/jobs"},
                                    {"name": "tick", "owner": "a/jobs"}]
    with pytest.raises(ScheduleError, match=r"^schedule 'tick' is declared by pool 'a/jobs' "):
        await declare(conn, declarations_for(
            "jobs", "b", json.dumps([other.to_json(), EVERY_SECOND.to_json()]), []))


async def test_an_upgraded_pool_takes_over_the_schedules_its_name_declared(
    conn: Conn, tenant: uuid.UUID
) -> None:
    """Schedules declared under the pool's name alone (earlier versions) become the pool's
    `<namespace>/<name>` at its workers' next start, keeping their place; a worker of the
    earlier version that declares again meanwhile (a rolling upgrade) is refused and retires
    none of them. A pool file without a namespace keeps its name as the owner."""
    await prepare(conn)
    other = parse_schedule({"name": "other", "kind": "test_noop", "every": 60}, "s")
    both = json.dumps([EVERY_SECOND.to_json(), other.to_json()])
    await declare(conn, Declarations("jobs", (EVERY_SECOND, other), retire=True))  # before
    await rewind(conn, "tick", 5)
    await declare(conn, declarations_for("jobs", "mdm", both, []))
    cur = await conn.execute("SELECT name, owner, next_run_at < clock_timestamp()"
                             " - interval '4 s' AS kept FROM mdm.aa_schedule ORDER BY name")
    assert await cur.fetchall() == [{"name": "other", "owner": "mdm/jobs", "kept": False},
                                    {"name": "tick", "owner": "mdm/jobs", "kept": True}]
    with pytest.raises(ScheduleError, match="declared by pool 'mdm/jobs'"):
        await declare(conn, Declarations("jobs", (EVERY_SECOND,), retire=True))
    assert await scalar(conn, "SELECT count(*) FROM mdm.aa_schedule") == 2
    local = declarations_for("files", None, json.dumps([]), [])
    assert (local.owner, local.former) == ("files", ())


async def test_a_schedule_this_worker_cannot_read_holds_up_no_other(
    conn: Conn, tenant: uuid.UUID
) -> None:
    """A declaration whose time zone this worker's tz database lacks (pods of different
    images, a row of another version) records why, is tried again a minute later, and every
    other due schedule is enqueued in the same check."""
    await prepare(conn)
    await declare(conn, Declarations("pool-a", (EVERY_SECOND,), retire=True))
    await conn.execute(
        "INSERT INTO mdm.aa_schedule (name, owner, job_kind, tenant, expression, time_zone,"
        " missed, definition, next_run_at) VALUES ('elsewhere', 'pool-b', 'test_noop', 'acme',"
        " '0 3 * * *', 'Mars/Olympus', 'skip', %s, clock_timestamp() - interval '1 day')",
        (json.dumps({"name": "elsewhere", "kind": "test_noop", "tenant": "acme",
                     "missed": "skip", "cron": "0 3 * * *", "timeZone": "Mars/Olympus"}),))
    await rewind(conn, "tick", 2)
    runs = {run.name: run for run in await enqueue_due_ticks(conn, actor="s")}
    assert runs["tick"].created >= 3
    error = runs["elsewhere"].error
    assert error is not None and "timeZone: unknown time zone 'Mars/Olympus'" in error
    row = await scalar(conn, "SELECT json_build_object('error', last_error, 'later',"
                       " next_run_at > clock_timestamp() + interval '50 s') FROM"
                       " mdm.aa_schedule WHERE name = 'elsewhere'")
    assert row == {"error": error, "later": True}
    assert await keys(conn, "schedule:elsewhere:") == []
