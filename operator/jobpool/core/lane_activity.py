"""What each lane is doing now, from the live workers, their running jobs and the ready backlog.

Pure: `lane_activity` takes the rows the overview read (live workers, running jobs, job counts)
and the configured lanes, and returns one `LaneActivity` per lane; `explain_lane` says in one
line why a lane's backlog does not move. The console, the admin API and `jobpool status` all
show what these return, so that they never disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

Served = Callable[[Mapping[str, Any]], bool]
"""Whether a lane serves the (tenant, kind) of a counts row."""

NO_LANE = None
"""The lane of workers started without one (`jobpool run` without a pool file)."""


@dataclass(frozen=True)
class ReadyWait:
    """The (tenant, kind) whose oldest ready job has waited longest among a lane's jobs."""

    tenant: str
    kind: str
    ready: int
    """Ready jobs of that pair (pending, available_at come)."""
    wait_seconds: float
    """Seconds since the oldest of them became available."""


@dataclass(frozen=True)
class RunningJob:
    """A running job: what it is, how long it has run and who holds it."""

    id: int
    tenant: str
    kind: str
    holder: str
    age_seconds: float
    lane: str | None
    holder_live: bool
    """False: its holder no longer beats (its claim waits for stale-claim recovery)."""


@dataclass(frozen=True)
class LaneActivity:
    """One lane now. Rates count the last minute of each live worker's heartbeat."""

    lane: str | None
    configured: bool
    """Named by the pool file the API was given (else known from live workers only)."""
    workers: int
    slots: int
    busy: int
    claims_per_minute: int
    completions_per_minute: int
    ready: int
    """Ready jobs the lane serves (of the tenants in scope), not counting paused ones."""
    oldest_ready: ReadyWait | None
    running: tuple[RunningJob, ...] = field(default=())
    explanation: str | None = None
    paused: int = 0
    """Ready jobs the lane serves that a pause holds (`jobpool pause`)."""

    @property
    def free(self) -> int:
        return max(self.slots - self.busy, 0)

    def as_dict(self) -> dict[str, Any]:
        """The API's shape: every field, `free` too, running jobs left out (listed apart)."""
        shown = asdict(self)
        del shown["running"]
        shown["free"] = self.free
        return shown


def duration_text(seconds: float) -> str:
    """`45 s`, `4 min`, `2 h 5 min`, `3 d 4 h`: a wait or an age as a person says it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def explain_lane(lane: LaneActivity) -> str | None:
    """Why the lane's ready jobs wait, in one line; None when none wait.

    In order: no live worker; every slot busy (with which kinds, and for how long at least:
    the youngest running job's age); free slots but no claim in the last minute (the workers
    claim nothing they could take: their log says why); else the lane is working through it.
    Paused ready jobs are named apart: nothing claims them until they are resumed.
    """
    waits = lane.oldest_ready
    held = (f"; {lane.paused} ready job(s) paused (`jobpool paused` lists the pauses)"
            if lane.paused else "")
    if waits is None:
        return held[2:] or None
    return _explain_backlog(lane, waits) + held


def _explain_backlog(lane: LaneActivity, waits: ReadyWait) -> str:
    backlog = (f"{waits.tenant} {waits.kind}: {waits.ready} ready, the oldest waiting "
               f"{duration_text(waits.wait_seconds)}")
    if lane.workers == 0:
        return f"no live worker serves this lane; {backlog}"
    if lane.free == 0:
        return f"all {lane.slots} slots busy{_busy_with(lane)}; {backlog}"
    if lane.claims_per_minute == 0:
        return (f"{lane.free} of {lane.slots} slots free, yet no claim in the last minute "
                f"(see the workers' logs); {backlog}")
    return f"working: {lane.claims_per_minute} claims in the last minute; {backlog}"


def _busy_with(lane: LaneActivity) -> str:
    """` with `slow_report` for 4 min`, from the running jobs in scope (none: nothing)."""
    if not lane.running:
        return ""
    kinds = Counter(job.kind for job in lane.running).most_common()
    named = (f"`{kinds[0][0]}`" if len(kinds) == 1
             else ", ".join(f"`{kind}` ({n})" for kind, n in kinds))
    hidden = lane.busy - len(lane.running)
    others = f" and {hidden} job(s) of tenants out of scope" if hidden > 0 else ""
    since = min(job.age_seconds for job in lane.running)
    return f" with {named}{others} for {duration_text(since)}"


def lane_activity(
    lanes: Sequence[Mapping[str, Any]], workers: Sequence[Mapping[str, Any]],
    running: Sequence[Mapping[str, Any]], counts: Sequence[Mapping[str, Any]],
) -> list[LaneActivity]:
    """One entry per lane: the configured `lanes` first (in their order), then lanes known
    only from live `workers` (by name, the lane-less last), each explained.

    lanes: dicts with name, kinds (None: every kind but exclude_kinds), exclude_kinds,
    tenants (empty: all); workers: live worker rows (lane, kinds, tenants, slots, busy_slots,
    claims_last_minute, completions_last_minute); running: running job rows (id, tenant,
    kind, holder, age_seconds, lane, holder_live); counts: overview counts rows (tenant,
    tenant_id, kind, status, ready, ready_age_seconds, and paused: whether a pause holds the
    pair, absent: no). A lane known only from its workers
    serves what they serve.
    """
    configured = {lane["name"]: lane for lane in lanes}
    by_lane: dict[str | None, list[Mapping[str, Any]]] = {}
    for worker in workers:
        by_lane.setdefault(worker["lane"], []).append(worker)
    extra = sorted(name for name in by_lane if name not in configured and name is not None)
    names: list[str | None] = [*configured, *extra]
    if NO_LANE in by_lane:
        names.append(NO_LANE)
    jobs = [_running_job(row) for row in running]
    shown = []
    for name in names:
        members = by_lane.get(name, [])
        config = configured.get(name) if name is not None else None
        served = _served_by_config(config) if config is not None else _served_by_workers(members)
        served_rows = [c for c in counts if c["status"] == "pending" and int(c["ready"]) > 0
                       and served(c)]
        ready_rows = [c for c in served_rows if not c.get("paused")]
        activity = LaneActivity(
            lane=name, configured=config is not None, workers=len(members),
            slots=sum(int(w["slots"]) for w in members),
            busy=sum(int(w["busy_slots"]) for w in members),
            claims_per_minute=sum(int(w["claims_last_minute"]) for w in members),
            completions_per_minute=sum(int(w["completions_last_minute"]) for w in members),
            ready=sum(int(c["ready"]) for c in ready_rows),
            oldest_ready=_oldest(ready_rows),
            running=tuple(j for j in jobs if j.holder_live and j.lane == name),
            paused=sum(int(c["ready"]) for c in served_rows if c.get("paused")),
        )
        shown.append(replace(activity, explanation=explain_lane(activity)))
    return shown


def _running_job(row: Mapping[str, Any]) -> RunningJob:
    return RunningJob(id=int(row["id"]), tenant=str(row["tenant"]), kind=str(row["kind"]),
                      holder=str(row["holder"]), age_seconds=float(row["age_seconds"]),
                      lane=row["lane"], holder_live=bool(row["holder_live"]))


def _oldest(rows: Sequence[Mapping[str, Any]]) -> ReadyWait | None:
    if not rows:
        return None
    row = max(rows, key=lambda c: (float(c["ready_age_seconds"]), int(c["ready"])))
    return ReadyWait(tenant=str(row["tenant"]), kind=str(row["kind"]), ready=int(row["ready"]),
                     wait_seconds=float(row["ready_age_seconds"]))


def _tenant_named(count: Mapping[str, Any], refs: set[str]) -> bool:
    """Whether the count's tenant is among `refs` (see `_refs`)."""
    return str(count["tenant"]) in refs or str(count["tenant_id"]).lower() in refs


def _served_by_config(lane: Mapping[str, Any]) -> Served:
    kinds = None if lane["kinds"] is None else set(lane["kinds"])
    excluded = set(lane.get("exclude_kinds") or ())
    tenants = _refs(lane["tenants"])

    def served(count: Mapping[str, Any]) -> bool:
        kind = count["kind"]
        return ((kind in kinds) if kinds is not None else (kind not in excluded)) and (
            not tenants or _tenant_named(count, tenants))

    return served


def _served_by_workers(workers: Sequence[Mapping[str, Any]]) -> Served:
    def served(count: Mapping[str, Any]) -> bool:
        for worker in workers:
            refs = _refs(worker["tenants"])
            if count["kind"] in worker["kinds"] and (not refs or _tenant_named(count, refs)):
                return True
        return False

    return served


def _refs(tenants: Sequence[str]) -> set[str]:
    """Tenant keys or ids in canonical form: keys are lower-case by rule, ids compare so."""
    return {str(ref).lower() for ref in tenants}
