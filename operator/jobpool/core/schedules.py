"""Schedules: when a job of some kind is due again, and what to do about ticks nobody ran.

A schedule enqueues one job of `kind` for `tenant` with `payload` at each of its ticks. Ticks
come from a cron expression read in an IANA time zone (five fields, or six with seconds
first; parsed and stepped by `cronsim`, which follows Debian cron across DST changes: a time
the spring-forward skips runs once right after the change, a time the fall-back repeats runs
once, at its first occurrence) or from an interval in whole seconds, whose ticks are the
multiples of the interval since the Unix epoch (so every process agrees on them).

Missed ticks: a tick is on time while it is at most `MISSED_AFTER` seconds old; workers check
far more often than that, so every on-time tick is enqueued. A tick older than that was
missed (no worker ran). The policy `catch_up_once` (the default, as a Kubernetes CronJob
does) enqueues the latest missed tick once, unless an on-time tick is enqueued in the same
check, and drops the others; `skip` drops every missed tick.

Pure: no I/O, times are aware datetimes passed in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobpool.core.jsondata import expect_text, to_json_text
from jobpool.core.kinds import check_kind_name
from jobpool.core.tenants import tenant_ref
from jobpool.errors import JobpoolError

MissedPolicy = Literal["skip", "catch_up_once"]
MISSED_POLICIES: tuple[MissedPolicy, ...] = ("skip", "catch_up_once")
DEFAULT_MISSED: MissedPolicy = "catch_up_once"
DEFAULT_ZONE = "UTC"
DEFAULT_TENANT = "system"
"""The tenant of platform-level jobs (migration 0001 creates it)."""

MISSED_AFTER = 60.0
"""Seconds after which a tick that no worker enqueued counts as missed (workers check at
least every `CHECK_MAX` seconds, and at once when a schedule falls due)."""
CHECK_MAX = 15.0
"""Most seconds between a worker's checks for due ticks (a schedule another process added
is seen within this)."""
MAX_ON_TIME_TICKS = 1_000
"""On-time ticks enqueued per schedule and check at most (a 1-second schedule has 61)."""
MAX_INTERVAL = 366 * 86_400
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
NAME_RULE = "1 to 63 lower-case letters, digits, '_', '.' or '-', starting with a letter or digit"

BUILTIN_CLEANUP = "cleanup_jobs"
"""Name (and kind) of the built-in schedule that runs queue maintenance."""
BUILTIN_OWNER = ""
"""Owner of built-in schedules; declared schedules belong to their pool (`schedule_owner`)."""


def schedule_owner(pool: str | None, namespace: str | None) -> str:
    """The owner of the schedules pool `pool` declares: `<namespace>/<pool>`, unique per
    JobWorkerPool of a cluster (pools of one name in two namespaces on one database keep their
    schedules apart), or the bare name of a pool file without a namespace; BUILTIN_OWNER for a
    worker of no pool."""
    if not pool:
        return BUILTIN_OWNER
    return f"{namespace}/{pool}" if namespace else pool


def former_owners(pool: str | None, namespace: str | None) -> tuple[str, ...]:
    """The owners the same pool's schedules had under earlier versions, which named them by
    the pool's name alone: its workers take those schedules over (`()` when the owner is
    still the name)."""
    owner = schedule_owner(pool, namespace)
    return (pool,) if pool and owner != pool else ()


class ScheduleError(JobpoolError, ValueError):
    """A schedule that cannot run; the message starts with the bad field's path."""


@dataclass(frozen=True)
class Schedule:
    """One validated schedule.

    name: unique per database (`NAME_RULE`). kind: the job kind enqueued. tenant: a tenant
    key or id. payload: the job's JSON object. Exactly one of cron (an expression, read in
    `zone`) and every (seconds) is set. missed: the policy for missed ticks (module doc).
    """

    name: str
    kind: str
    tenant: str = DEFAULT_TENANT
    payload: Mapping[str, Any] = field(default_factory=dict)
    cron: str | None = None
    zone: str = DEFAULT_ZONE
    every: int | None = None
    missed: MissedPolicy = DEFAULT_MISSED

    @property
    def expression(self) -> str:
        """The cron expression, or `every <n>s`, as shown to users."""
        return self.cron if self.cron is not None else f"every {self.every}s"

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after `after` (aware), in UTC."""
        _check_aware(after)
        if self.every is not None:
            seconds = math.floor(after.timestamp() / self.every) * self.every + self.every
            return datetime.fromtimestamp(seconds, UTC)
        assert self.cron is not None
        local = after.astimezone(ZoneInfo(self.zone))
        tick = next(CronSim(self.cron, local))
        return tick.astimezone(UTC)

    def previous_tick(self, before: datetime) -> datetime:
        """The last tick strictly before `before` (aware), in UTC."""
        _check_aware(before)
        if self.every is not None:
            seconds = math.ceil(before.timestamp() / self.every) * self.every - self.every
            return datetime.fromtimestamp(seconds, UTC)
        assert self.cron is not None
        zone = ZoneInfo(self.zone)
        tick = next(CronSim(self.cron, before.astimezone(zone), reverse=True)).astimezone(UTC)
        if tick >= before:  # a `before` with microseconds yields its own second first
            tick = next(CronSim(self.cron, tick.astimezone(zone), reverse=True)).astimezone(UTC)
        # Stepping backwards across a fall-back skips the first of the repeated hour's ticks
        # (02:00 summer time, when 02:00 comes twice): forward steps are the reference, so
        # take every forward tick still before `before`.
        while (later := self.next_tick(tick)) < before:
            tick = later
        return tick

    def to_json(self) -> dict[str, Any]:
        """The declaration as a pool file writes it (camelCase keys), for JOBPOOL_SCHEDULES."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "tenant": self.tenant,
                               "missed": self.missed}
        if self.payload:
            out["payload"] = dict(self.payload)
        if self.cron is not None:
            out["cron"] = self.cron
            out["timeZone"] = self.zone
        else:
            out["every"] = self.every
        return out


@dataclass(frozen=True)
class TickPlan:
    """What one check does for a schedule.

    ticks: the tick times to enqueue (UTC, ascending). next_run_at: the schedule's next tick
    after this check. missed: ticks dropped by the policy.
    """

    ticks: tuple[datetime, ...]
    next_run_at: datetime
    missed: int


def plan_ticks(schedule: Schedule, next_run_at: datetime, now: datetime) -> TickPlan:
    """The ticks due at `now` for a schedule whose first unrun tick is at or after
    `next_run_at`.

    Every tick from `next_run_at` to `now` (inclusive) at most `MISSED_AFTER` seconds old is
    enqueued (at most `MAX_ON_TIME_TICKS`); older ones follow `schedule.missed`. Cost is
    bounded however long nothing ran: missed ticks are counted for an interval and found by
    stepping backwards for cron, never enumerated.
    """
    _check_aware(next_run_at)
    _check_aware(now)
    if next_run_at > now:
        return TickPlan((), next_run_at, 0)
    # A `next_run_at` that is no tick (a declaration looked at again later) is never enqueued:
    # its first tick is.
    next_run_at = schedule.next_tick(next_run_at - _EPSILON)
    if next_run_at > now:
        return TickPlan((), next_run_at, 0)
    cutoff = now - timedelta(seconds=MISSED_AFTER)
    on_time: list[datetime] = []
    tick = next_run_at if next_run_at >= cutoff else schedule.next_tick(cutoff - _EPSILON)
    while tick <= now and len(on_time) < MAX_ON_TIME_TICKS:
        on_time.append(tick)
        tick = schedule.next_tick(tick)
    missed: list[datetime] = []
    missed_count = 0
    if next_run_at < cutoff:
        latest_missed = schedule.previous_tick(cutoff)
        if latest_missed >= next_run_at:
            missed_count = _count_between(schedule, next_run_at, latest_missed)
            if schedule.missed == "catch_up_once" and not on_time:
                missed = [latest_missed]
                missed_count -= 1
    return TickPlan((*missed, *on_time), tick, missed_count)


_EPSILON = timedelta(microseconds=1)


def _count_between(schedule: Schedule, first: datetime, last: datetime) -> int:
    """How many ticks lie in [first, last] (both ticks); cron counts stop at 10 000."""
    if schedule.every is not None:
        return round((last - first).total_seconds()) // schedule.every + 1
    count, tick = 1, first
    while tick < last and count < 10_000:
        tick = schedule.next_tick(tick)
        count += 1
    return count


def check_wait(next_due: datetime | None, now: datetime) -> float:
    """Seconds a worker waits before its next check: until the earliest next tick, at most
    `CHECK_MAX`, at least 0."""
    if next_due is None:
        return CHECK_MAX
    return min(CHECK_MAX, max(0.0, (next_due - now).total_seconds()))


def idempotency_key(name: str, tick: datetime) -> str:
    """The job's idempotency key for tick `tick` of schedule `name`: one job per tick, however
    many processes enqueue it."""
    return f"schedule:{name}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


# -- declarations ---------------------------------------------------------------------------

DECLARATION_FIELDS = frozenset({"name", "kind", "tenant", "payload", "cron", "timeZone", "every",
                     "missed"})


def parse_schedule(raw: Any, path: str) -> Schedule:
    """One declaration (a pool file's `spec.schedules[i]`, camelCase keys) as a Schedule.

    Raises ScheduleError whose message starts with the bad field's path, e.g.
    `spec.schedules[2].cron: ...`.
    """
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"{path}: a schedule is a mapping, not {type(raw).__name__}")
    unknown = sorted(set(raw) - DECLARATION_FIELDS)
    if unknown:
        raise ScheduleError(f"{path}.{unknown[0]}: unknown field (known: "
                            f"{', '.join(sorted(DECLARATION_FIELDS))})")
    name = _text(raw, "name", path)
    if not NAME_PATTERN.fullmatch(name):
        raise ScheduleError(f"{path}.name: {_shown(name)} is not a schedule name: use {NAME_RULE}")
    kind = _text(raw, "kind", path)
    try:
        check_kind_name(kind)
    except ValueError as exc:
        raise ScheduleError(f"{path}.kind: {exc}") from None
    tenant_text = _given_text(raw.get("tenant", DEFAULT_TENANT), f"{path}.tenant")
    try:
        tenant = tenant_ref(tenant_text)
    except ValueError as exc:
        raise ScheduleError(f"{path}.tenant: {exc}") from None
    payload = raw.get("payload", {})
    if not isinstance(payload, Mapping):
        raise ScheduleError(f"{path}.payload: must be a JSON object, not "
                            f"{type(payload).__name__}")
    try:
        to_json_text(payload, name="payload")
    except ValueError as exc:
        raise ScheduleError(f"{path}.{exc}") from None
    missed = raw.get("missed", DEFAULT_MISSED)
    if missed not in MISSED_POLICIES:
        raise ScheduleError(f"{path}.missed: must be one of {', '.join(MISSED_POLICIES)}, "
                            f"got {_shown(missed)}")
    cron, every = raw.get("cron"), raw.get("every")
    if (cron is None) == (every is None):
        raise ScheduleError(f"{path}: give exactly one of cron and every")
    zone = raw.get("timeZone", DEFAULT_ZONE)
    if cron is not None:
        _check_cron(cron, path)
        _check_zone(zone, path)
    elif "timeZone" in raw:
        raise ScheduleError(f"{path}.timeZone: only a cron schedule has a time zone")
    else:
        _check_every(every, path)
    return Schedule(name=name, kind=kind, tenant=tenant, payload=dict(payload),
                    cron=cron, zone=zone, every=every,
                    missed=cast("MissedPolicy", missed))


def parse_schedules(raw: Any, path: str) -> tuple[Schedule, ...]:
    """A list of declarations; raises ScheduleError for a bad one or a name given twice."""
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ScheduleError(f"{path}: must be a list of schedules")
    schedules = tuple(parse_schedule(item, f"{path}[{i}]") for i, item in enumerate(raw))
    seen: dict[str, int] = {}
    for index, schedule in enumerate(schedules):
        if schedule.name in seen or schedule.name == BUILTIN_CLEANUP:
            also = (f"also {path}[{seen[schedule.name]}]" if schedule.name in seen
                    else "the built-in maintenance schedule")
            raise ScheduleError(f"{path}[{index}].name: duplicate schedule name "
                                f"{schedule.name!r} ({also})")
        seen[schedule.name] = index
    return schedules


def check_owners(owner: str, schedules: Sequence[Schedule],
                 elsewhere: Sequence[Mapping[str, Any]]) -> None:
    """Refuse `owner`'s declarations of names that another owner declared before.

    elsewhere: rows (name, owner, definition) of the schedules of those names that belong to
    another owner (`schedule_owner`: a pool's `<namespace>/<name>`, a pool file's name; ""
    for workers of no pool). A name is one schedule of one
    pool: that pool alone changes it and retires it when its file drops it, so a second
    pool's declaration, the same or another, would be taken over or retired behind its back.
    Raises ScheduleError naming each such schedule with both declarations.
    """
    mine = {schedule.name: schedule for schedule in schedules}
    clashes = []
    for row in elsewhere:
        theirs = parse_schedule(row["definition"], f"schedule {row['name']}")
        ours = mine[row["name"]]
        also = ("the same schedule" if ours.to_json() == theirs.to_json()
                else _summary(ours))
        clashes.append(f"schedule {row['name']!r} is declared by {_owner_text(row['owner'])} "
                       f"({_summary(theirs)}); {_owner_text(owner)} declares {also}")
    if clashes:
        raise ScheduleError(
            "; ".join(clashes) + ": a schedule's name is unique per database and belongs to "
            "the pool that declared it first; rename it in one pool, or drop it from the "
            "other pool first")


def _summary(schedule: Schedule) -> str:
    return f"kind {schedule.kind}, tenant {schedule.tenant}, {schedule.expression}"


def _owner_text(owner: str) -> str:
    return f"pool {owner!r}" if owner else "a worker of no pool"


def cleanup_schedule(every: float) -> Schedule:
    """The built-in schedule that enqueues `cleanup_jobs` every `every` seconds (rounded up to
    a whole second): recovery of lapsed claims, done-job retention and the registered steps."""
    return Schedule(name=BUILTIN_CLEANUP, kind=BUILTIN_CLEANUP, every=max(1, math.ceil(every)),
                    missed="catch_up_once")


def _text(raw: Mapping[str, Any], key: str, path: str) -> str:
    value = raw.get(key)
    if value is None or value == "":
        raise ScheduleError(f"{path}.{key}: required, a non-empty string")
    return _given_text(value, f"{path}.{key}")


def _given_text(value: Any, field: str) -> str:
    """`value` if it is text; ScheduleError naming `field`, the value and its type if not
    (a YAML `tenant: 5` is a number, never the tenant "5")."""
    try:
        return expect_text(value, field)
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None


MAX_CRON_LENGTH = 256
"""Characters of a cron expression, as the JobWorkerPool CRD allows: a pool file is held to
the same bounds as the resource."""

MAX_ZONE_LENGTH = 64
"""Characters of a time zone name, as the JobWorkerPool CRD allows."""


def _check_cron(cron: Any, path: str) -> None:
    if not _given_text(cron, f"{path}.cron").strip():
        raise ScheduleError(f"{path}.cron: must be a cron expression (text)")
    if len(cron) > MAX_CRON_LENGTH:
        raise ScheduleError(f"{path}.cron: {len(cron)} characters, at most {MAX_CRON_LENGTH}")
    try:
        next(CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC)))
    except (CronSimError, StopIteration) as exc:
        raise ScheduleError(f"{path}.cron: {_shown(cron)} is not a cron expression "
                            f"({exc or 'no tick'}; five fields, or six with seconds first)"
                            ) from None


def _check_zone(zone: Any, path: str) -> None:
    if not _given_text(zone, f"{path}.timeZone"):
        raise ScheduleError(f"{path}.timeZone: must be an IANA time zone name")
    if len(zone) > MAX_ZONE_LENGTH:
        raise ScheduleError(f"{path}.timeZone: {len(zone)} characters, at most {MAX_ZONE_LENGTH}")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder, too long a name
        raise ScheduleError(f"{path}.timeZone: unknown time zone {_shown(zone)} (use an IANA name "
                            "such as Europe/Berlin or UTC)") from None


def _check_every(every: Any, path: str) -> None:
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= MAX_INTERVAL:
        raise ScheduleError(f"{path}.every: must be whole seconds from 1 to {MAX_INTERVAL}, "
                            f"got {_shown(every)}")


SHOWN_CHARACTERS = 80
"""Characters of a refused value an error message quotes (a declaration may be hostile)."""


def _shown(value: Any) -> str:
    """`value` quoted for an error message, cut to `SHOWN_CHARACTERS`."""
    if isinstance(value, int) and value.bit_length() > 64:
        return "a huge number"  # its digits could run to thousands
    text = repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... ({len(text)} characters)"


def _check_aware(moment: datetime) -> None:
    if moment.tzinfo is None:
        raise ValueError(f"{moment} is naive; pass an aware datetime")
