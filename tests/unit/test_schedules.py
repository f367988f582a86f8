"""Schedules' pure decisions: ticks across DST changes, missed ticks, validation paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import yaml

from jobpool.core.schedules import (
    CHECK_MAX,
    MAX_CRON_LENGTH,
    MAX_ZONE_LENGTH,
    MISSED_AFTER,
    Schedule,
    ScheduleError,
    check_wait,
    cleanup_schedule,
    idempotency_key,
    parse_schedule,
    parse_schedules,
    plan_ticks,
)

BERLIN = ZoneInfo("Europe/Berlin")
REPO = Path(__file__).resolve().parents[2]


def daily(at: str = "30 2 * * *", missed: str = "catch_up_once") -> Schedule:
    return parse_schedule({"name": "nightly", "kind": "reindex", "cron": at,
                           "timeZone": "Europe/Berlin", "missed": missed}, "s")


def run_daily_through(schedule: Schedule, start: datetime, days: int) -> list[datetime]:
    """Every tick a worker checking each minute enqueues from `start` for `days` days."""
    enqueued: list[datetime] = []
    next_run = schedule.next_tick(start)
    now = start
    while now < start + timedelta(days=days):
        now += timedelta(minutes=1)
        plan = plan_ticks(schedule, next_run, now)
        enqueued += plan.ticks
        next_run = plan.next_run_at
    return enqueued


@pytest.mark.parametrize(("start", "change_day"), [
    (datetime(2026, 3, 27, 12, tzinfo=BERLIN), 29),   # spring forward: 02:00 -> 03:00
    (datetime(2026, 10, 23, 12, tzinfo=BERLIN), 25),  # fall back: 03:00 -> 02:00
])
def test_a_daily_run_in_the_dst_change_hour_runs_once_each_day(
    start: datetime, change_day: int
) -> None:
    ticks = run_daily_through(daily(), start, days=4)
    local_days = [t.astimezone(BERLIN).date() for t in ticks]
    assert len(ticks) == 4
    assert len(set(local_days)) == 4  # neither skipped nor doubled
    change = next(t for t in ticks if t.astimezone(BERLIN).day == change_day)
    if change_day == 29:
        assert change.astimezone(BERLIN).hour == 3  # 02:30 does not exist: right after
    else:
        assert change == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # the first 02:30 (CEST)


def test_a_daily_run_outside_the_change_hour_keeps_its_local_time() -> None:
    ticks = run_daily_through(daily("0 9 * * *"), datetime(2026, 3, 27, 12, tzinfo=BERLIN), 4)
    assert [t.astimezone(BERLIN).hour for t in ticks] == [9, 9, 9, 9]
    assert [t.hour for t in ticks] == [8, 7, 7, 7]  # UTC moves with the offset on the 29th


def test_an_hourly_run_has_both_hours_of_the_fall_back() -> None:
    hourly = parse_schedule({"name": "h", "kind": "reindex", "cron": "0 * * * *",
                             "timeZone": "Europe/Berlin"}, "s")
    ticks = run_daily_through(hourly, datetime(2026, 10, 25, 0, 0, tzinfo=UTC), 1)
    assert len(ticks) == 24  # a day of 25 local hours: every real hour once
    assert len(set(ticks)) == 24


def test_interval_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    every = parse_schedule({"name": "e", "kind": "reindex", "every": 300}, "s")
    after = datetime(2026, 1, 1, 10, 2, 7, tzinfo=UTC)
    assert every.next_tick(after) == datetime(2026, 1, 1, 10, 5, tzinfo=UTC)
    assert every.next_tick(datetime(2026, 1, 1, 10, 5, tzinfo=UTC)) == datetime(
        2026, 1, 1, 10, 10, tzinfo=UTC)
    assert every.previous_tick(datetime(2026, 1, 1, 10, 5, tzinfo=UTC)) == datetime(
        2026, 1, 1, 10, 0, tzinfo=UTC)


def test_every_on_time_tick_is_enqueued_however_late_the_check() -> None:
    every = parse_schedule({"name": "e", "kind": "reindex", "every": 1}, "s")
    first = datetime(2026, 1, 1, tzinfo=UTC)
    plan = plan_ticks(every, first, first + timedelta(seconds=10))
    assert plan.ticks == tuple(first + timedelta(seconds=i) for i in range(11))
    assert plan.next_run_at == first + timedelta(seconds=11)
    assert plan.missed == 0


def test_nothing_is_due_before_the_next_tick() -> None:
    every = parse_schedule({"name": "e", "kind": "reindex", "every": 60}, "s")
    at = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert plan_ticks(every, at, at - timedelta(seconds=1)).ticks == ()


def test_catch_up_once_enqueues_the_latest_missed_tick_once() -> None:
    nightly = daily("0 3 * * *")
    missed_from = datetime(2026, 5, 1, 1, 0, tzinfo=UTC)  # 03:00 CEST on May 1st
    now = datetime(2026, 5, 4, 8, 0, tzinfo=UTC)  # nothing ran for three days
    plan = plan_ticks(nightly, missed_from, now)
    assert plan.ticks == (datetime(2026, 5, 4, 1, 0, tzinfo=UTC),)
    assert plan.missed == 3
    assert plan.next_run_at == datetime(2026, 5, 5, 1, 0, tzinfo=UTC)


def test_skip_drops_every_missed_tick() -> None:
    plan = plan_ticks(daily("0 3 * * *", missed="skip"), datetime(2026, 5, 1, 1, tzinfo=UTC),
                      datetime(2026, 5, 4, 8, tzinfo=UTC))
    assert plan.ticks == ()
    assert plan.missed == 4
    assert plan.next_run_at == datetime(2026, 5, 5, 1, 0, tzinfo=UTC)


def test_no_catch_up_when_an_on_time_tick_runs_anyway() -> None:
    every = parse_schedule({"name": "e", "kind": "reindex", "every": 10}, "s")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = start + timedelta(days=7)  # a week of 10-second ticks missed: counted, not listed
    plan = plan_ticks(every, start, now)
    assert len(plan.ticks) == int(MISSED_AFTER) // 10 + 1
    assert all(now - tick <= timedelta(seconds=MISSED_AFTER) for tick in plan.ticks)
    assert plan.missed == 7 * 8640 - int(MISSED_AFTER) // 10


def test_the_worker_waits_until_the_next_tick_at_most_check_max() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert check_wait(now + timedelta(seconds=0.5), now) == 0.5
    assert check_wait(now - timedelta(seconds=3), now) == 0
    assert check_wait(now + timedelta(hours=1), now) == CHECK_MAX
    assert check_wait(None, now) == CHECK_MAX


def test_the_idempotency_key_names_the_schedule_and_the_tick_in_utc() -> None:
    tick = datetime(2026, 3, 29, 3, 0, tzinfo=BERLIN)
    assert idempotency_key("nightly", tick) == "schedule:nightly:2026-03-29T01:00:00Z"


def test_cleanup_is_a_built_in_interval_schedule() -> None:
    schedule = cleanup_schedule(300.0)
    assert (schedule.name, schedule.kind, schedule.every) == ("cleanup_jobs", "cleanup_jobs", 300)
    assert schedule.tenant == "system"


def test_a_declaration_round_trips_through_its_json() -> None:
    schedule = daily()
    assert parse_schedule(schedule.to_json(), "s") == schedule


@pytest.mark.parametrize(("raw", "message"), [
    ({"name": "a", "kind": "k", "cron": "61 * * * *"}, r"^spec\.schedules\[2\]\.cron: "),
    ({"name": "a", "kind": "k", "cron": "* * *"}, r"^spec\.schedules\[2\]\.cron: .*five fields"),
    ({"name": "a", "kind": "k", "cron": "0 3 * * *", "timeZone": "Mars/Olympus"},
     r"^spec\.schedules\[2\]\.timeZone: unknown time zone 'Mars/Olympus'"),
    ({"name": "a", "kind": "k", "every": 0}, r"^spec\.schedules\[2\]\.every: "),
    ({"name": "a", "kind": "k", "every": 1.5}, r"^spec\.schedules\[2\]\.every: "),
    ({"name": "a", "kind": "k", "every": 5, "timeZone": "UTC"},
     r"^spec\.schedules\[2\]\.timeZone: only a cron"),
    ({"name": "a", "kind": "k"}, r"^spec\.schedules\[2\]: give exactly one of cron and every"),
    ({"name": "a", "kind": "k", "every": 5, "cron": "* * * * *"}, r"exactly one"),
    ({"name": "a", "kind": "k", "every": 5, "missed": "all"}, r"^spec\.schedules\[2\]\.missed: "),
    ({"name": "A b", "kind": "k", "every": 5}, r"^spec\.schedules\[2\]\.name: "),
    ({"name": "a", "kind": "K-1", "every": 5}, r"^spec\.schedules\[2\]\.kind: "),
    ({"name": "a", "kind": "k", "every": 5, "tenant": "Not A Tenant"},
     r"^spec\.schedules\[2\]\.tenant: "),
    ({"name": "a", "kind": "k", "every": 5, "payload": [1]}, r"^spec\.schedules\[2\]\.payload: "),
    ({"name": "a", "kind": "k", "every": 5, "payload": {"x": "\x00"}},
     r"^spec\.schedules\[2\]\.payload"),
    ({"name": "a", "kind": "k", "every": 5, "crons": "x"},
     r"^spec\.schedules\[2\]\.crons: unknown"),
    ({"name": "a", "kind": "k", "cron": "0 3 * * *", "timeZone": "Europe"},
     r"^spec\.schedules\[2\]\.timeZone: unknown time zone 'Europe'"),
    ({"name": "a", "kind": "k", "cron": "0 3 * * *", "timeZone": "x" * 64},
     r"^spec\.schedules\[2\]\.timeZone: unknown time zone 'x{64}'"),
    ({"name": "a", "kind": "k", "cron": "0 3 * * *", "timeZone": "x" * 65},
     r"^spec\.schedules\[2\]\.timeZone: 65 characters, at most 64$"),
    ({"name": "a", "kind": "k", "cron": "0 3 * * *", "timeZone": "Europe/Berlin/"},
     r"^spec\.schedules\[2\]\.timeZone: unknown time zone"),
    ({"name": "x" * 10_000, "kind": "k", "every": 5},
     r"^spec\.schedules\[2\]\.name: 'x{79}\.\.\. \(10002 characters\) is not"),
    ({"name": "a", "kind": "k", "cron": "61 " + "1," * 100 + "1 * * *"},
     r"^spec\.schedules\[2\]\.cron: '61 [1,]+\.\.\. \(212 characters\) is not"),
    ({"name": "a", "kind": "k", "cron": "0 " + "1," * 5000 + "1 * * *"},
     r"^spec\.schedules\[2\]\.cron: 10009 characters, at most 256$"),
    ({"name": "a", "kind": "k", "every": 10**400},
     r"^spec\.schedules\[2\]\.every: .* got a huge number$"),
])
def test_a_bad_declaration_names_its_field(raw: dict[str, object], message: str) -> None:
    good = {"name": "g", "kind": "k", "every": 5}
    with pytest.raises(ScheduleError, match=message):
        parse_schedules([good, {**good, "name": "h"}, raw], "spec.schedules")


def test_a_pool_file_is_held_to_the_crds_lengths_of_cron_and_time_zone() -> None:
    crd = yaml.safe_load((REPO / "crds" / "jobworkerpools.jobs.mdm.io.yaml").read_text())
    declaration = (crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                   ["properties"]["schedules"]["items"]["properties"])
    assert declaration["cron"]["maxLength"] == MAX_CRON_LENGTH
    assert declaration["timeZone"]["maxLength"] == MAX_ZONE_LENGTH


def test_a_name_given_twice_is_refused_naming_both() -> None:
    with pytest.raises(ScheduleError, match=r"schedules\[1\]\.name: duplicate .*schedules\[0\]"):
        parse_schedules([{"name": "a", "kind": "k", "every": 5}] * 2, "schedules")
    with pytest.raises(ScheduleError, match=r"built-in"):
        parse_schedules([{"name": "cleanup_jobs", "kind": "k", "every": 5}], "schedules")


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        daily().next_tick(datetime(2026, 1, 1))


FALL_BACK = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)
"""Berlin's clocks go from 03:00 summer time back to 02:00 winter time: 02:00 comes twice."""


@pytest.mark.parametrize("cron", ["0 * * * *", "*/30 * * * *", "* 2 * * *", "0 2 * * *"])
def test_stepping_back_across_the_fall_back_finds_every_forward_tick(cron: str) -> None:
    schedule = parse_schedule({"name": "a", "kind": "k", "cron": cron,
                               "timeZone": "Europe/Berlin"}, "s")
    start, end = FALL_BACK - timedelta(hours=3), FALL_BACK + timedelta(hours=3)
    forward = [schedule.next_tick(start)]
    while forward[-1] < end:
        forward.append(schedule.next_tick(forward[-1]))
    backward = [forward[-1]]
    while backward[-1] > forward[0]:
        backward.append(schedule.previous_tick(backward[-1]))
    assert backward[::-1] == forward


def test_a_tick_dropped_at_the_fall_back_is_counted() -> None:
    """The hourly tick at 02:00 summer time (00:00 UTC) is missed; the check comes when the
    cutoff is the change itself: the on-time 02:00 winter time runs, and the dropped one is
    counted (stepping back from the change must find it, not 01:00 before it)."""
    schedule = parse_schedule({"name": "a", "kind": "k", "cron": "0 * * * *",
                               "timeZone": "Europe/Berlin"}, "s")
    plan = plan_ticks(schedule, FALL_BACK - timedelta(hours=1),
                      FALL_BACK + timedelta(seconds=MISSED_AFTER))
    assert (plan.ticks, plan.missed) == ((FALL_BACK,), 1)


def test_a_next_run_that_is_no_tick_enqueues_the_tick_after_it() -> None:
    """A schedule looked at again a minute after it could not be read: its next run is no
    tick of it, and never becomes a job's key."""
    schedule = daily("0 * * * *")
    hour = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    plan = plan_ticks(schedule, hour - timedelta(seconds=17.5), hour + timedelta(seconds=5))
    assert (plan.ticks, plan.next_run_at) == ((hour,), hour + timedelta(hours=1))
    early = plan_ticks(schedule, hour - timedelta(seconds=17.5), hour - timedelta(seconds=1))
    assert (early.ticks, early.next_run_at) == ((), hour)
