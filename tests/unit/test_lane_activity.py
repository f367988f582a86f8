"""What each lane is doing, and why its backlog waits: pure, from rows."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from jobpool.core.lane_activity import (
    LaneActivity,
    ReadyWait,
    RunningJob,
    duration_text,
    explain_lane,
    lane_activity,
)
from jobpool.worker.heartbeat import MinuteCounter

GLOBEX = uuid.UUID("00000000-0000-4000-8000-000000000002")
DEFAULT = {"name": "default", "kinds": None, "exclude_kinds": ["bulk_import"], "tenants": []}
BULK = {"name": "bulk", "kinds": ["bulk_import"], "exclude_kinds": [], "tenants": []}


def worker(lane: str | None, *, slots: int = 4, busy: int = 0, claims: int = 0,
           done: int = 0, kinds: tuple[str, ...] = ("email_send", "slow_report"),
           tenants: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"lane": lane, "kinds": list(kinds), "tenants": list(tenants), "slots": slots,
            "busy_slots": busy, "claims_last_minute": claims, "completions_last_minute": done}


def running(job_id: int, kind: str, age: float, *, lane: str | None = "default",
            live: bool = True, tenant: str = "acme") -> dict[str, Any]:
    return {"id": job_id, "tenant": tenant, "kind": kind, "holder": f"host/1/w{job_id}",
            "age_seconds": age, "lane": lane, "holder_live": live}


def ready(tenant: str, kind: str, n: int, age: float) -> dict[str, Any]:
    return {"tenant": tenant, "tenant_id": GLOBEX, "kind": kind, "status": "pending",
            "jobs": n, "ready": n, "ready_age_seconds": age}


def test_all_slots_held_by_long_jobs_explains_the_stuck_backlog() -> None:
    [lane, _] = lane_activity(
        [DEFAULT, BULK], [worker("default", busy=4)],
        [running(i, "slow_report", 240 + i) for i in range(1, 5)],
        [ready("globex", "email_send", 149, 250.0)])
    assert (lane.workers, lane.slots, lane.busy, lane.free, lane.ready) == (1, 4, 4, 0, 149)
    assert lane.oldest_ready == ReadyWait("globex", "email_send", 149, 250.0)
    assert lane.explanation == ("all 4 slots busy with `slow_report` for 4 min; globex "
                                "email_send: 149 ready, the oldest waiting 4 min")


def test_mixed_kinds_are_counted_most_common_first() -> None:
    lane = LaneActivity("default", True, 1, 3, 3, 0, 0, 1, ReadyWait("a", "k", 1, 5),
                        running=tuple(RunningJob(i, "a", kind, "h", 90, "default", True)
                                      for i, kind in enumerate(["x", "y", "y"])))
    assert explain_lane(lane) == ("all 3 slots busy with `y` (2), `x` (1) for 1 min; a k: 1 "
                                  "ready, the oldest waiting 5 s")


def test_busy_slots_running_out_of_scope_jobs_are_named_as_such() -> None:
    [lane] = lane_activity([DEFAULT], [worker("default", busy=4)],
                           [running(1, "slow_report", 61)],
                           [ready("globex", "email_send", 3, 10)])
    assert lane.explanation is not None
    assert lane.explanation.startswith(
        "all 4 slots busy with `slow_report` and 3 job(s) of tenants out of scope for 1 min")


@pytest.mark.parametrize(("workers", "expected"), [
    ([], "no live worker serves this lane; globex email_send: 2 ready, the oldest waiting "
         "2 min"),
    ([worker("default", busy=1)], "3 of 4 slots free, yet no claim in the last minute (see "
                                  "the workers' logs); globex email_send: 2 ready, the oldest "
                                  "waiting 2 min"),
    ([worker("default", busy=1, claims=30)], "working: 30 claims in the last minute; globex "
                                             "email_send: 2 ready, the oldest waiting 2 min"),
])
def test_each_reason_a_backlog_waits(workers: list[dict[str, Any]], expected: str) -> None:
    [lane] = lane_activity([DEFAULT], workers, [], [ready("globex", "email_send", 2, 125)])
    assert lane.explanation == expected


def test_a_lane_without_ready_jobs_needs_no_explanation() -> None:
    [lane] = lane_activity([DEFAULT], [worker("default", busy=4)],
                           [running(1, "slow_report", 500)], [])
    assert (lane.oldest_ready, lane.explanation, lane.ready) == (None, None, 0)


def test_a_lane_counts_only_the_jobs_it_serves_and_the_oldest_wins() -> None:
    counts = [ready("globex", "bulk_import", 5, 900), ready("globex", "email_send", 2, 30),
              ready("acme", "email_send", 1, 60),
              {**ready("acme", "email_send", 0, 0), "status": "running", "ready": 0}]
    default, bulk = lane_activity([DEFAULT, BULK], [], [], counts)
    assert (default.ready, default.oldest_ready) == (3, ReadyWait("acme", "email_send", 1, 60))
    assert (bulk.ready, bulk.oldest_ready) == (5, ReadyWait("globex", "bulk_import", 5, 900))


def test_a_lane_for_some_tenants_matches_them_by_key_or_id() -> None:
    by_key = {**DEFAULT, "name": "g", "tenants": ["globex"]}
    by_id = {**DEFAULT, "name": "i", "tenants": [str(GLOBEX).upper()]}
    other = {**DEFAULT, "name": "o", "tenants": ["initech"]}
    lanes = lane_activity([by_key, by_id, other], [], [], [ready("globex", "email_send", 2, 9)])
    assert [lane.ready for lane in lanes] == [2, 2, 0]


def test_lanes_known_only_from_workers_serve_what_their_workers_serve() -> None:
    workers = [worker("extra", kinds=("email_send",), tenants=("acme",)),
               worker(None, kinds=("slow_report",), busy=2, claims=3, done=2),
               worker(None, kinds=("slow_report",), slots=2)]
    counts = [ready("acme", "email_send", 1, 10), ready("globex", "email_send", 4, 20),
              ready("globex", "slow_report", 7, 30)]
    default, extra, unnamed = lane_activity([DEFAULT], workers, [], counts)
    assert (default.lane, default.configured, default.workers) == ("default", True, 0)
    assert (extra.lane, extra.configured, extra.ready) == ("extra", False, 1)
    assert (unnamed.lane, unnamed.workers, unnamed.slots, unnamed.busy, unnamed.ready) == (
        None, 2, 6, 2, 7)
    assert (unnamed.claims_per_minute, unnamed.completions_per_minute) == (3, 2)


def test_running_jobs_go_to_their_holders_lane_and_dead_holders_to_none() -> None:
    [lane] = lane_activity([DEFAULT], [worker("default", busy=2)],
                           [running(1, "a", 5), running(2, "b", 5, live=False),
                            running(3, "c", 5, lane="bulk")], [])
    assert [job.id for job in lane.running] == [1]
    assert "running" not in lane.as_dict()
    assert lane.as_dict()["free"] == 2


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (59.4, "59 s"), (60, "1 min"), (250, "4 min"), (3600 + 5 * 60, "1 h 5 min"),
    (86400 * 3 + 4 * 3600, "3 d 4 h"), (-3, "0 s")])
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_the_minute_counter_forgets_what_is_older_than_a_minute() -> None:
    now = [1000.0]
    counter = MinuteCounter(lambda: now[0])
    counter.add(3)
    now[0] += 30
    counter.add()
    assert counter.total() == 4
    now[0] += 31
    assert counter.total() == 1
    now[0] += 60
    assert (counter.total(), len(counter.buckets)) == (0, 0)


def test_paused_ready_jobs_are_not_a_lanes_backlog_and_are_named_apart() -> None:
    held = {**ready("globex", "email_send", 7, 900.0), "paused": True}
    [idle] = lane_activity([DEFAULT], [worker("default", claims=0)], [], [held])
    assert (idle.ready, idle.paused, idle.oldest_ready) == (0, 7, None)
    assert idle.explanation == "7 ready job(s) paused (`jobpool paused` lists the pauses)"
    [mixed] = lane_activity([DEFAULT], [worker("default", claims=3)], [],
                            [held, ready("acme", "slow_report", 2, 30.0)])
    assert (mixed.ready, mixed.paused) == (2, 7)
    assert mixed.explanation is not None
    assert mixed.explanation.startswith("working: 3 claims in the last minute; acme slow_report")
    assert mixed.explanation.endswith("; 7 ready job(s) paused (`jobpool paused` lists the "
                                      "pauses)")
