"""The operator: kopf keeps an index of JobWorkerPools; one loop makes and scales them.

kopf only watches the pools (an in-memory index, no handler that needs a finalizer or
writes bookkeeping onto a pool), so a pool (or its namespace) can be deleted while the
operator is down: the children go with it through their ownerReferences.

One loop, in the replica that holds the Lease `jobpool-operator` (k8s.leader), syncs every
pool each scale interval (listing them first, so that a pool deleted while the watch was
cut is forgotten, never given children again), and a changed pool at once: it applies the
lanes' children
(server-side apply; missing or hand-changed children are restored), deletes the children
of removed lanes, counts each lane's jobs and scales its Deployment (scale subresource),
and patches the status only when it changed; then it retires the schedules of the pools
deleted for good, once that is safe (k8s.retirement). Decisions live in core.scaling,
k8s.reconcile, k8s.status, k8s.retirement and k8s.lease.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import kopf
from lightkube.config.kubeconfig import SingleConfig

from jobpool.core.crd import GROUP, PLURAL, VERSION
from jobpool.core.poolspec import Lane, PoolSpec, PoolSpecError, Problem, load_pool
from jobpool.core.scaling import (
    LaneJobs,
    ScaleDecision,
    ScalingPolicy,
    bounded_replicas,
    decide_replicas,
    fixed_replicas,
)
from jobpool.core.schedules import schedule_owner
from jobpool.db.lane_counts import LaneCounter
from jobpool.db.queries import Many
from jobpool.errors import JobpoolError
from jobpool.k8s.client import REQUEST_TIMEOUT, ApiError, ChildKind, KubeApi, load_config
from jobpool.k8s.leader import Leader, NotLeadingError
from jobpool.k8s.lease import LeaseTiming
from jobpool.k8s.manifests import (
    build_owner_reference,
    deployment_name,
    pool_selector,
    trigger_authentication_name,
)
from jobpool.k8s.ownership import FIELD_MANAGER, SCALER, hand_over
from jobpool.k8s.probes import Health
from jobpool.k8s.reconcile import (
    Action,
    KedaChildren,
    ReconcilePlan,
    belongs_to,
    plan_reconcile,
    touches_keda,
)
from jobpool.k8s.retirement import (
    GIVE_UP_AFTER,
    GonePool,
    failed_try,
    linger_seconds,
    retirement_step,
    succeeded,
)
from jobpool.k8s.status import (
    condition_of,
    invalid_spec_conditions,
    keda_unavailable,
    lane_status,
    merge_conditions,
    parse_timestamp,
    pool_conditions,
    pool_status,
    previous_count_error,
    previous_lanes,
    schedule_status,
    status_changed,
    timestamp,
)
from jobpool.k8s.tracing_env import with_tracing_env

COUNT_LANE_JOBS = Many("count_lane_jobs")

DEFAULT_SCALE_INTERVAL = 15.0
HAND_OVER_TRIES = 5
"""Reads of a Deployment that changed while its field ownership was being handed over."""
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

log = logging.getLogger(__name__)

CountJobs = Callable[[str, Sequence[Any]], Awaitable[dict[str, LaneJobs]]]
PoolKey = tuple[str, str]

T = TypeVar("T")


def utcnow() -> datetime:
    """The operator's clock (only for scaling windows, status times and the Lease)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class OperatorConfig:
    """How the operator runs.

    scale_interval: seconds between two syncs of every pool. namespaces: () watches every
    namespace. lease_namespace: where the Lease lives (None: the ServiceAccount's
    namespace, else "default"). identity: this replica's name in the Lease (None: host,
    process and a random part). liveness_endpoint: e.g. http://0.0.0.0:8080/healthz.
    """

    scale_interval: float = DEFAULT_SCALE_INTERVAL
    namespaces: tuple[str, ...] = ()
    kubeconfig: str | None = None
    lease_namespace: str | None = None
    identity: str | None = None
    liveness_endpoint: str | None = None
    lease: LeaseTiming = field(default_factory=LeaseTiming)


class PoolIndex:
    """The pools as last seen, by (namespace, name); marks new and changed specs.

    Fed by the watch (`seen`) and, each full round, by a fresh list (`resync`): a watch
    that was cut and listed again yields the pools that exist but no DELETED for one
    deleted in the gap, so only a list tells that a pool is gone.
    """

    def __init__(self) -> None:
        self._pools: dict[PoolKey, dict[str, Any]] = {}
        self._gone: dict[PoolKey, GonePool] = {}
        self._changed: set[PoolKey] = set()
        self._wake = asyncio.Event()
        self._events = 0
        self._touched: dict[PoolKey, int] = {}

    def seen(self, event: str | None, body: Mapping[str, Any]) -> None:
        """Record a watch event (`DELETED` forgets the pool)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        self._events += 1
        self._touched[key] = self._events
        if event == "DELETED":
            self._forget(key)
            return
        self._store(key, body)

    def mark(self) -> int:
        """A point in the stream of watch events: take it before sending a list."""
        return self._events

    def resync(self, listed: Sequence[Mapping[str, Any]], since: int) -> list[PoolKey]:
        """Make the index what a list sent at mark `since` found; the pools forgotten.

        A pool the watch reported on after `since` keeps the watch's (newer) view: one
        created or deleted while the list was under way is neither forgotten nor revived.
        """
        found = {(str((obj.get("metadata") or {}).get("namespace")),
                  str((obj.get("metadata") or {}).get("name"))): obj for obj in listed}
        fresh = {key for key, event in self._touched.items() if event > since}
        gone = [key for key in self.keys() if key not in found and key not in fresh]
        for key in gone:
            self._forget(key)
        for key, body in found.items():
            if key not in fresh:
                self._store(key, body)
        self._touched = {key: event for key, event in self._touched.items() if event > since}
        return gone

    def _store(self, key: PoolKey, body: Mapping[str, Any]) -> None:
        old = self._pools.get(key)
        self._pools[key] = copy.deepcopy(dict(body))
        self._gone.pop(key, None)  # back: its workers own its schedules
        if old is None or old.get("spec") != body.get("spec") or (
            old.get("metadata") or {}).get("uid") != (body.get("metadata") or {}).get("uid"):
            self._changed.add(key)
            self._wake.set()

    def _forget(self, key: PoolKey) -> None:
        body = self._pools.pop(key, None)
        self._changed.discard(key)
        if body is not None:
            self._gone[key] = GonePool(body)

    def gone(self) -> list[tuple[PoolKey, GonePool]]:
        """The pools deleted since this index saw them, whose schedules may await retirement
        (`k8s.retirement`), in a stable order; a pool stored again leaves this list."""
        return sorted(self._gone.items(), key=lambda item: item[0])

    def forget_gone(self, key: PoolKey) -> None:
        """Drop a gone pool: its schedules are retired, or left to a person."""
        self._gone.pop(key, None)

    def forget_all_gone(self) -> None:
        """Drop every gone pool (a standby's: the leader retires their schedules)."""
        self._gone.clear()

    def wrote_status(self, key: PoolKey, status: Mapping[str, Any]) -> None:
        """Remember a status just written (the watch event may come after the next sync)."""
        if key in self._pools:
            self._pools[key]["status"] = {**(self._pools[key].get("status") or {}), **status}

    def get(self, key: PoolKey) -> dict[str, Any] | None:
        """The pool's last seen object."""
        found = self._pools.get(key)
        return copy.deepcopy(found) if found is not None else None

    def keys(self) -> list[PoolKey]:
        """Every pool, in a stable order."""
        return sorted(self._pools)

    def take_changed(self) -> list[PoolKey]:
        """The pools new or changed since the last call."""
        changed, self._changed = sorted(self._changed), set()
        return changed

    async def wait(self, timeout: float) -> None:
        """Until a pool is new or changed, or `timeout` seconds passed."""
        try:
            async with asyncio.timeout(max(timeout, 0.0)):  # not wait_for: see `event_loop`
                await self._wake.wait()
        except TimeoutError:
            return
        finally:
            self._wake.clear()


class PoolGoneError(JobpoolError):
    """The pool a sync works from is no longer stored (deleted, or replaced by one of the
    same name): its view was stale, and nothing is written for it."""


@dataclass
class SyncOutcome:
    """What one sync of a pool did and met."""

    done: list[Action] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


class PoolController:
    """What the operator does for one pool, with the API, clock and job counter injected."""

    def __init__(
        self,
        api: KubeApi,
        *,
        clock: Callable[[], datetime] = utcnow,
        count_jobs: CountJobs | None = None,
        namespaces: Sequence[str] = (),
        write_budget: Callable[[], float | None] = lambda: REQUEST_TIMEOUT,
    ) -> None:
        self.api = api
        self.clock = clock
        self.namespaces = tuple(namespaces)
        self.write_budget = write_budget
        # default: capped counts on a kept connection per database, under a statement timeout
        self.count_jobs: CountJobs = count_jobs if count_jobs is not None else LaneCounter()
        self._dsns: dict[PoolKey, str] = {}
        """The DSN last read for each pool: a gone pool's schedules are retired there when
        its Secret went with it."""

    async def run(self, pools: PoolIndex, leader: Leader, interval: float) -> None:
        """Until cancelled: while leading, sync every pool each `interval` seconds and a new
        or changed pool at once."""
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        if isinstance(self.count_jobs, LaneCounter):  # a database of a pool counted each round
            self.count_jobs.idle_drop = max(self.count_jobs.idle_drop, 3 * interval)
        while True:
            if not leader.leading():  # a standby: a full round as soon as it leads
                next_round = loop.time()
                pools.forget_all_gone()  # the leader retires the schedules of those
                await pools.wait(leader.timing.retry_every)
                continue
            if loop.time() >= next_round:
                pools.take_changed()
                next_round = loop.time() + interval
                if await self._refresh(pools):
                    await self._sync_all(pools, pools.keys())
                    await self._retire_gone(pools, interval)
            else:
                await self._sync_all(pools, pools.take_changed())
            await pools.wait(min(next_round - loop.time(), leader.timing.retry_every))

    async def _retire_gone(self, pools: PoolIndex, interval: float) -> None:
        """Retire the schedules of the pools deleted for good, when it is safe to
        (`k8s.retirement`); `interval`: seconds between full rounds. A database that failed
        once in a round is not tried again in it: gone pools on an unreachable database
        delay the next round by one try, not one per pool."""
        if not isinstance(self.count_jobs, LaneCounter):
            return
        unreachable: set[str] = set()
        for key, gone in pools.gone():
            if gone.dsn is None:
                gone.dsn = self._dsns.pop(key, None)
            if gone.dsn is not None and gone.dsn in unreachable:
                continue
            budget = self.write_budget()
            if budget is None:
                return  # not leading any more: what is left is the next leader's
            try:
                async with asyncio.timeout(budget):
                    over = await self._retirement(self.count_jobs, key, gone, interval)
            except Exception as exc:  # the API, the Secret, the database: next round
                if gone.dsn is not None:
                    unreachable.add(gone.dsn)
                over = self._retirement_failed(key, gone, exc)
            if over:
                pools.forget_gone(key)

    async def _retirement(self, counter: LaneCounter, key: PoolKey, gone: GonePool,
                          interval: float) -> bool:
        """One round of a gone pool's retirement; whether it is over. Raises what the API or
        the database raised."""
        namespace, name = key
        try:
            pool = load_pool(gone.body)
        except PoolSpecError as exc:
            log.warning("JobWorkerPool %s/%s is gone, and its last spec was invalid (%s): its "
                        "schedules, if any, are left to `jobpool schedules retire %s`",
                        namespace, name, exc, schedule_owner(name, namespace))
            return True
        stored = await self.api.read_pool(namespace, name) is not None
        left = await self.api.list_children("Deployment", namespace, pool_selector(name))
        now = self.clock().timestamp()
        step = retirement_step(gone, stored=stored, deployments=bool(left), now=now,
                               linger=linger_seconds(pool, interval))
        if step == "wait" and not gone.waiting:
            gone.waiting = True
            log.info("JobWorkerPool %s/%s is gone: the schedules it declared are retired once "
                     "its Deployments are (left: %s)", namespace, name,
                     ", ".join(sorted(str(d["metadata"]["name"]) for d in left)))
        if step != "retire":
            return step == "forget"
        gone.dsn = await self._gone_pool_dsn(namespace, pool, gone.dsn)
        retired = await counter.retire_pool_schedules(
            gone.dsn, schedule_owner(name, namespace), FIELD_MANAGER)
        if retired:
            log.info("JobWorkerPool %s/%s is gone: its schedules retired: %s", namespace, name,
                     ", ".join(retired))
        succeeded(gone, now)
        return False

    async def _secret_dsn(self, namespace: str, pool: PoolSpec) -> str:
        """The DSN `pool`'s Secret holds; raises ApiError 404 or KeyError when the Secret or
        its key is missing."""
        return await self.api.read_secret_value(
            namespace, pool.dsn_secret.name, pool.dsn_secret.key)

    async def _gone_pool_dsn(self, namespace: str, pool: PoolSpec, last: str | None) -> str:
        """The DSN the gone `pool`'s Secret holds, or `last` (the one last read for it) when
        the Secret is gone too; raises the Secret's ApiError or KeyError without one."""
        try:
            return await self._secret_dsn(namespace, pool)
        except (ApiError, KeyError):
            if last is None:
                raise
            return last

    def _retirement_failed(self, key: PoolKey, gone: GonePool, exc: Exception) -> bool:
        """Log a failed try of `gone`'s retirement as `failed_try` says; whether it is given
        up."""
        outcome = failed_try(gone, self.clock().timestamp())
        if outcome == "give up":
            log.error("retiring the schedules of deleted JobWorkerPool %s/%s failed for %.0f s, "
                      "given up (%s): run `jobpool schedules retire %s` against its database",
                      *key, GIVE_UP_AFTER, exc, schedule_owner(key[1], key[0]))
        elif outcome == "warn":
            log.warning("retiring the schedules of deleted JobWorkerPool %s/%s failed (%d "
                        "tries in a row, tried each round for %.0f s): %s", *key,
                        gone.failures, GIVE_UP_AFTER, exc)
        return outcome == "give up"

    async def _write(self, call: Awaitable[T]) -> T:
        """Await the write `call` if this replica leads, within the seconds it may take.

        Raises NotLeadingError (the write never goes out) when it does not lead any more, which
        a round of many requests can outlast, and ApiError 504 when the write took too
        long (a standby may lead by then)."""
        budget = self.write_budget()
        if budget is None:
            if inspect.iscoroutine(call):
                call.close()
            raise NotLeadingError("this replica does not lead: writes stop")
        try:
            async with asyncio.timeout(budget):
                return await call
        except TimeoutError:
            raise ApiError(504, "Timeout", f"no answer within {budget:.1f} s, the time this "
                           "replica may still lead") from None

    async def _refresh(self, pools: PoolIndex) -> bool:
        """List the pools into the index (forgetting those gone); False if the list failed,
        for then no pool's existence is known and the round is left out."""
        since = pools.mark()
        try:
            listed = await self.api.list_pools(self.namespaces)
        except Exception as exc:  # the API is unwell: try again next round
            log.warning("listing JobWorkerPools failed, this round is left out: %s", exc)
            return False
        for key in pools.resync(listed, since):
            log.info("JobWorkerPool %s/%s is gone (no watch event told): forgotten", *key)
        return True

    async def _sync_all(self, pools: PoolIndex, keys: Sequence[PoolKey]) -> None:
        for key in keys:
            body = pools.get(key)
            if body is None:
                continue
            try:
                written = await self.sync(body)
            except NotLeadingError:
                log.warning("leadership ended during a round: its other syncs are left out")
                return
            except Exception:  # one pool's failure must not stop the others
                log.exception("syncing JobWorkerPool %s/%s failed", *key)
            else:
                if written is not None:
                    pools.wrote_status(key, written)

    async def sync(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Bring one pool's children to its spec, scale its lanes, report in its status.

        body: the pool as the API returned it. Returns the status written, None if it was
        unchanged (or the pool is being deleted).
        """
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None
        now = self.clock()
        namespace, generation = str(meta["namespace"]), meta.get("generation")
        previous = body.get("status") or {}
        try:
            pool = with_tracing_env(load_pool(body), os.environ)
        except PoolSpecError as exc:
            return await self._report_invalid(body, exc, now, generation)
        try:
            outcome, live = await self._reconcile(pool, body, namespace)
        except PoolGoneError:
            log.info("JobWorkerPool %s/%s is gone (a stale view of it): nothing created",
                     namespace, pool.name)
            return None
        await self._announce(body, pool, outcome, previous, now)
        lanes, count_error, counted, runs = await self._scale(
            pool, body, namespace, live, previous, now)
        schedules = schedule_status(pool, runs, previous)
        conditions = merge_conditions(
            previous.get("conditions"),
            pool_conditions(pool, lanes, count_error=count_error, problems=outcome.problems,
                            schedules=schedules),
            generation, now,
        )
        status = pool_status(lanes, conditions, generation, now if counted else None, previous,
                             schedules)
        return await self._write_status(body, previous, status)

    async def _reconcile(
        self, pool: PoolSpec, body: Mapping[str, Any], namespace: str
    ) -> tuple[SyncOutcome, dict[str, dict[str, Any]]]:
        """Read, plan and apply the pool's children; the Deployments live afterwards.

        Raises PoolGoneError when the plan would create a child and the pool is no longer
        stored as `body` (`_still_stored`)."""
        outcome = SyncOutcome()
        try:
            owner = build_owner_reference(body)
            live = await self._children("Deployment", namespace, pool.name,
                                        [deployment_name(pool.name, lane.name)
                                         for lane in pool.lanes])
            keda, problem = await self._live_keda(pool, namespace, live)
        except (ApiError, ValueError) as exc:
            outcome.problems.append(Problem("ReconcileFailed", f"reading the pool's children "
                                            f"failed: {exc}"))
            return outcome, {}
        plan = plan_reconcile(pool, owner, live, keda, COUNT_LANE_JOBS.text)
        outcome.problems += [Problem("NameConflict", c.message) for c in plan.conflicts]
        if problem is not None:
            outcome.problems.append(problem)
        own = {d["metadata"]["name"]: d for d in live if belongs_to(d, pool.name)}
        if any(action.creates for action in plan.actions):
            try:
                stored = await self._still_stored(body)
            except ApiError as exc:
                outcome.problems.append(Problem("ReconcileFailed", f"reading the pool before "
                                                f"creating its children failed: {exc}"))
                return outcome, own
            if not stored:
                raise PoolGoneError
        await self._carry_out(pool, plan, namespace, own, outcome)
        return outcome, own

    async def _still_stored(self, body: Mapping[str, Any]) -> bool:
        """Whether the pool is stored now as `body` (same uid) and not being deleted.

        Asked before children are created, the one step that cannot be undone by the next
        sync: a pool deleted while the operator's watch was down (or replayed late after it)
        lingers in its index until the next list, and the garbage collector would have
        deleted its children, so a sync from that view would create them again, owned by a
        uid that no longer exists."""
        meta = body.get("metadata") or {}
        stored = await self.api.read_pool(str(meta["namespace"]), str(meta["name"]))
        stored_meta = (stored or {}).get("metadata") or {}
        return (stored is not None and stored_meta.get("uid") == meta.get("uid")
                and not stored_meta.get("deletionTimestamp"))

    async def _carry_out(
        self, pool: PoolSpec, plan: ReconcilePlan, namespace: str,
        own: dict[str, dict[str, Any]], outcome: SyncOutcome,
    ) -> None:
        first_replicas = {deployment_name(pool.name, lane.name): lane.min_replicas
                          for lane in pool.lanes}
        for action in plan.actions:
            log.info("%s %s %s/%s", action.verb, action.kind, namespace, action.name)
            try:
                if action.verb == "delete":
                    await self._write(self.api.delete_child(action.kind, namespace, action.name))
                    if action.kind == "Deployment":
                        own.pop(action.name, None)
                    outcome.done.append(action)
                    continue
                if action.kind == "Deployment" and action.creates:
                    # created at the lane's first count, then applied as the operator's
                    await self._write(self.api.create_deployment(
                        namespace, action.body or {}, first_replicas[action.name]))
                applied = await self._write(
                    self.api.apply_child(action.kind, namespace, action.body or {}))
                if action.kind == "Deployment":
                    applied = await self._hand_over(namespace, action, applied, outcome)
                    own[action.name] = applied
            except ApiError as exc:  # report it, carry on with the others
                outcome.problems.append(Problem(
                    "ReconcileFailed", f"{action.verb} {action.kind} {action.name!r} "
                                       f"failed: {exc}"))
            else:
                if action.seen is not None and action.seen == (
                        applied.get("metadata") or {}).get("resourceVersion"):
                    # nothing changed: what the plan took for drift is how the server (or
                    # an admission policy) writes the field; no Event for a non-change
                    log.info("%s %s/%s: the server changed nothing", action.kind, namespace,
                             action.name)
                    continue
                outcome.done.append(action)

    async def _hand_over(self, namespace: str, action: Action, applied: dict[str, Any],
                         outcome: SyncOutcome) -> dict[str, Any]:
        """Leave the scaler owning only the replicas of a Deployment it created
        (`k8s.ownership`), then apply again if the operator now owns fields it does not
        apply; the Deployment as it then is. The patch tests the entries it changes: if
        those changed meanwhile (422), the Deployment is read again, `HAND_OVER_TRIES` times.
        A hand-over that does not go through is a problem of the sync (the next one tries
        again), never a failed apply: the Deployment is applied and scaled all the same."""
        problem = "its entries kept changing"
        for _ in range(HAND_OVER_TRIES):
            meta = applied.get("metadata") or {}
            handed = hand_over(meta.get("managedFields") or (), applier=FIELD_MANAGER,
                               scaler=SCALER)
            if handed is None:
                return applied
            try:
                applied = await self._write(self.api.patch_managed_fields(
                    namespace, action.name, handed.patch))
                if handed.reapply:
                    applied = await self._write(
                        self.api.apply_child(action.kind, namespace, action.body or {}))
                return applied
            except ApiError as exc:
                problem = str(exc)
                if exc.status != 422:
                    break
            try:
                again = await self.api.read_child("Deployment", namespace, action.name)
            except ApiError as exc:
                problem = str(exc)
                break
            if again is None:
                return applied
            applied = again
        outcome.problems.append(Problem(
            "ReconcileFailed", f"hand over the fields of Deployment {action.name!r} from "
                               f"{SCALER} to {FIELD_MANAGER} failed: {problem}"))
        return applied

    async def _children(
        self, kind: ChildKind, namespace: str, pool: str, names: Sequence[str]
    ) -> list[dict[str, Any]]:
        """The pool's children of `kind` (by its labels) and whatever holds one of `names`."""
        found = await self.api.list_children(kind, namespace, pool_selector(pool))
        listed = {obj["metadata"]["name"] for obj in found}
        for name in names:
            if name not in listed:
                holder = await self.api.read_child(kind, namespace, name)
                if holder is not None:
                    found.append(holder)
        return found

    async def _live_keda(
        self, pool: PoolSpec, namespace: str, live_deployments: Sequence[Mapping[str, Any]]
    ) -> tuple[KedaChildren | None, Problem | None]:
        """The KEDA objects to plan with (None: leave KEDA alone) and why KEDA is unusable.

        KEDA's API is called only for a pool that has (or had) lanes in keda mode; a 404
        (no KEDA) or 403 (not granted, which a real API server answers before it looks for
        the API) means it is unavailable.
        """
        if not touches_keda(pool, live_deployments):
            return None, None
        keda_lanes = [deployment_name(pool.name, lane.name) for lane in pool.lanes
                      if lane.autoscaling.mode == "keda"]
        try:
            scaled = await self._children("ScaledObject", namespace, pool.name, keda_lanes)
            auth = await self._children(
                "TriggerAuthentication", namespace, pool.name,
                [trigger_authentication_name(pool.name)] if keda_lanes else [])
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            return None, keda_unavailable(pool, namespace, exc.status, exc.message)
        return KedaChildren(scaled, auth), None

    async def _announce(
        self, body: Mapping[str, Any], pool: PoolSpec, outcome: SyncOutcome,
        previous: Mapping[str, Any], now: datetime,
    ) -> None:
        """Events: what was done, and each warning or problem once (not on every sync)."""
        if outcome.done:
            await self._event(body, "Normal", "Reconciled", _summary(outcome.done), now)
        degraded = str(condition_of(previous, "Degraded").get("message") or "")
        for warning in pool.warnings:
            if warning.message not in degraded:
                await self._event(body, "Warning", warning.reason, warning.message, now)
        known = str(condition_of(previous, "Reconciled").get("message") or "")
        for problem in outcome.problems:
            if problem.message not in known:
                await self._event(body, "Warning", problem.reason, problem.message, now)

    async def _scale(
        self, pool: PoolSpec, body: Mapping[str, Any], namespace: str,
        live: Mapping[str, Mapping[str, Any]], previous: Mapping[str, Any], now: datetime,
    ) -> tuple[list[dict[str, Any]], str | None, bool, list[dict[str, Any]] | None]:
        """Count each lane's jobs and scale its Deployment: the lane statuses, the count's
        error (None if it worked), whether it worked, and the `schedule_runs` rows of the
        pool's schedules, read for the pool's own owner (None if they were not read)."""
        counts: dict[str, LaneJobs] | None = None
        count_error: str | None = None
        runs: list[dict[str, Any]] | None = None
        try:
            dsn = await self._secret_dsn(namespace, pool)
            self._dsns[(namespace, pool.name)] = dsn  # for its schedules once it is gone
            counts = await self.count_jobs(dsn, pool.lanes)
            if pool.schedules and isinstance(self.count_jobs, LaneCounter):
                runs = await self.count_jobs.schedule_runs(
                    dsn, schedule_owner(pool.name, namespace),
                    [schedule.name for schedule in pool.schedules])
        except (ApiError, KeyError, OSError, ValueError) as exc:
            count_error = _count_error_message(pool, exc)
        except Exception as exc:  # psycopg errors and the like: report, retry next interval
            count_error = f"counting jobs failed: {type(exc).__name__}: {exc}"
        if count_error is not None:
            log.warning("JobWorkerPool %s/%s: %s", namespace, pool.name, count_error)
            if previous_count_error(previous) != count_error:
                await self._event(body, "Warning", "CountFailed", count_error, now)
        old = previous_lanes(previous)
        lanes: list[dict[str, Any]] = []
        for lane in pool.lanes:
            name = deployment_name(pool.name, lane.name)
            deployment = live.get(name)
            jobs = counts.get(lane.name) if counts is not None else None
            decision = None
            if deployment is not None:  # bounds and a fixed count hold without a count too
                decision = _decide(lane, jobs, deployment, old.get(lane.name), now)
            if decision is not None and deployment is not None:
                current = int((deployment.get("spec") or {}).get("replicas") or 0)
                if decision.changes(current):
                    try:
                        await self._write(
                            self.api.scale_deployment(namespace, name, decision.replicas))
                    except ApiError as exc:
                        log.warning("scaling %s/%s failed: %s", namespace, name, exc)
                        decision = None
                    else:
                        await self._event(body, "Normal", decision.reason,
                                          f"lane {lane.name}: {decision.message}", now)
            lanes.append(lane_status(pool, lane, live=deployment, previous=old.get(lane.name),
                                     jobs=jobs, decision=decision, now=now))
        return lanes, count_error, counts is not None, runs

    async def _report_invalid(
        self, body: Mapping[str, Any], error: PoolSpecError, now: datetime,
        generation: int | None,
    ) -> dict[str, Any] | None:
        previous = body.get("status") or {}
        conditions = merge_conditions(
            previous.get("conditions"), invalid_spec_conditions(str(error)), generation, now)
        if condition_of(previous, "Degraded").get("message") != str(error):
            await self._event(body, "Warning", "InvalidSpec", str(error), now)
        status: dict[str, Any] = {**previous, "conditions": conditions}
        if generation is not None:
            status["observedGeneration"] = generation
        return await self._write_status(body, previous, status)

    async def _write_status(
        self, body: Mapping[str, Any], previous: Mapping[str, Any], status: dict[str, Any]
    ) -> dict[str, Any] | None:
        if not status_changed(previous, status):
            return None
        meta = body["metadata"]
        await self._write(self.api.patch_pool_status(meta["namespace"], meta["name"], status))
        return status

    async def _event(
        self, body: Mapping[str, Any], kind: Literal["Normal", "Warning"], reason: str,
        message: str, now: datetime,
    ) -> None:
        try:
            await self._write(
                self.api.post_event(body, kind, reason, message, timestamp(now)))
        except ApiError as exc:  # an event is a courtesy: never fail a sync for it
            log.warning("posting event %s failed: %s", reason, exc)


def _decide(
    lane: Lane, jobs: LaneJobs | None, deployment: Mapping[str, Any],
    previous: Mapping[str, Any] | None, now: datetime,
) -> ScaleDecision | None:
    """The lane's scale decision; `jobs` None: they could not be counted."""
    current = int((deployment.get("spec") or {}).get("replicas") or 0)
    policy = ScalingPolicy(
        min_replicas=lane.min_replicas, max_replicas=lane.max_replicas,
        workers_per_pod=lane.workers_per_pod,
        target_utilization=lane.autoscaling.target_utilization,
        stabilization=lane.autoscaling.scale_down_stabilization,
        max_step=lane.autoscaling.scale_down_max_step,
    )
    mode = lane.autoscaling.mode
    if mode == "keda":
        return None
    if mode == "none":
        return fixed_replicas(policy, current)
    if jobs is None:
        return bounded_replicas(policy, current)
    return decide_replicas(
        policy, ready=jobs.ready, running=jobs.running, current=current,
        scale_down_since=parse_timestamp((previous or {}).get("scaleDownSince")), now=now,
    )


def _summary(done: Sequence[Action]) -> str:
    return "; ".join(
        f"{'created' if a.creates else 'applied' if a.verb == 'apply' else 'deleted'} "
        f"{a.kind} {a.name}" for a in done)


def _count_error_message(pool: PoolSpec, exc: Exception) -> str:
    secret = f"Secret {pool.dsn_secret.name!r} key {pool.dsn_secret.key!r}"
    if isinstance(exc, ApiError) and exc.status == 404:
        return f"cannot read the DSN: {secret} not found"
    if isinstance(exc, KeyError):
        return f"cannot read the DSN: {secret} has no such key"
    if isinstance(exc, ApiError):
        return f"cannot read the DSN from {secret}: {exc}"
    return f"counting jobs failed: {type(exc).__name__}: {exc}"


def connection_info(config: SingleConfig) -> kopf.ConnectionInfo:
    """kopf's credentials from the same configuration the API calls use."""
    cluster, user = config.cluster, config.user
    token = user.token if user is not None else None
    if user is not None and user.token_file and not token:
        token = Path(user.token_file).read_text().strip()
    return kopf.ConnectionInfo(
        server=cluster.server,
        ca_path=str(config.abs_file(cluster.certificate_auth)) if cluster.certificate_auth
        else None,
        ca_data=cluster.certificate_auth_data.encode() if cluster.certificate_auth_data
        else None,
        insecure=cluster.insecure,
        username=user.username if user is not None else None,
        password=user.password if user is not None else None,
        scheme="Bearer" if token else None,
        token=token,
        certificate_path=str(config.abs_file(user.client_cert))
        if user is not None and user.client_cert else None,
        certificate_data=user.client_cert_data.encode()
        if user is not None and user.client_cert_data else None,
        private_key_path=str(config.abs_file(user.client_key))
        if user is not None and user.client_key else None,
        private_key_data=user.client_key_data.encode()
        if user is not None and user.client_key_data else None,
        default_namespace=config.namespace,
    )


def operator_settings(settings: kopf.OperatorSettings) -> None:
    """kopf watches the pools and nothing else: no CRD or namespace scanning, no events of
    its own below warnings, and the finalizer name of older versions (so that kopf removes
    it from pools that still carry it: nothing needs it any more)."""
    settings.scanning.disabled = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 60.0
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330


def build_registry(pools: PoolIndex, config: SingleConfig) -> kopf.OperatorRegistry:
    """A kopf registry that logs in like the API client and feeds `pools`."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def operator_login(**_: Any) -> kopf.ConnectionInfo:
        """Authenticate kopf like the API client."""
        return connection_info(config)

    @kopf.on.startup(registry=registry)
    def operator_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Apply the operator's kopf settings."""
        operator_settings(settings)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def jobworkerpool_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        """Every watch event of a pool: keep the index current."""
        pools.seen(type, body)

    return registry


def lease_namespace(config: OperatorConfig) -> str:
    """Where the Lease lives: the configured namespace, else the ServiceAccount's."""
    if config.lease_namespace:
        return config.lease_namespace
    if SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"


def replica_identity() -> str:
    """`<host>/<pid>/<random>`: unique per process, readable in the Lease."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def _is_set(flag: Any) -> bool:
    """Whether a kopf stop flag (threading or asyncio Event, Future; None: never) is set."""
    if flag is None:
        return False
    if isinstance(flag, asyncio.Future):
        return flag.done()
    return bool(flag.is_set())


async def wait_for_pools_api(
    api: KubeApi, namespaces: Sequence[str], *, pause: float, stop_flag: Any = None,
    health: Health | None = None,
) -> bool:
    """Until a list of JobWorkerPools answers (the CRD is established, the operator may
    list them), each `pause` seconds; False if `stop_flag` was set first.

    kopf looks for the pools' API once, when it starts: started before the CRD is
    established, it would never watch them. Meanwhile `health` reports why it is not ready.
    """
    told = None
    while not _is_set(stop_flag):
        try:
            await api.list_pools(namespaces)
        except Exception as exc:  # 404: no CRD (yet); 403: no RBAC (yet); no connection
            if isinstance(exc, ApiError) and exc.status == 404:
                reason = (f"the CRD {PLURAL}.{GROUP} is not established (the API serves no "
                          f"{PLURAL} in {GROUP}/{VERSION})")
            else:
                reason = f"listing JobWorkerPools failed: {exc}"
            if health is not None:
                health.waiting(reason)
            if reason != told:
                log.warning("waiting before serving pools: %s", reason)
                told = reason
            await asyncio.sleep(pause)
        else:
            return True
    return False


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
    count_jobs: CountJobs | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (or forever); a leader releases its Lease
    on the way out. Raises NoCredentialsError when there is no cluster to talk to, ValueError
    for a health endpoint that is not http://.

    It serves pools once their API answers (see wait_for_pools_api); until then its
    liveness endpoint answers and its readiness endpoint (/readyz) says what it waits for.
    """
    kube = load_config(config.kubeconfig)
    api = KubeApi(kube)
    health = Health(config.liveness_endpoint) if config.liveness_endpoint else None
    pools = PoolIndex()
    leader = Leader(api, lease_namespace(config), config.identity or replica_identity(),
                    clock=utcnow, timing=config.lease)
    controller = PoolController(api, count_jobs=count_jobs, namespaces=config.namespaces,
                                write_budget=leader.write_budget)
    settings = kopf.OperatorSettings()
    operator_settings(settings)
    loops: list[asyncio.Task[None]] = []
    try:
        if health is not None:
            await health.start()
        if not await wait_for_pools_api(api, config.namespaces, pause=config.lease.retry_every,
                                        stop_flag=stop_flag, health=health):
            return
        loops += [asyncio.create_task(leader.run(), name="leader election"),
                  asyncio.create_task(controller.run(pools, leader, config.scale_interval),
                                      name="pool sync")]
        if health is not None:
            health.serving()
        await kopf.operator(
            registry=build_registry(pools, kube),
            settings=settings,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            standalone=True,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await leader.release()
        if health is not None:
            await health.stop()
        await api.close()
        if isinstance(controller.count_jobs, LaneCounter):
            await controller.count_jobs.close()


__all__ = ["OperatorConfig", "PoolController", "PoolIndex", "build_registry", "run_operator",
           "wait_for_pools_api"]
