"""kopf wiring of the operator: thin handlers that gather, plan, apply and report.

On create, update and resume of a JobWorkerPool: reconcile one Deployment per lane (and a
KEDA ScaledObject per keda lane). A reconcile that leaves something undone writes why in the
status and is retried by kopf with a growing delay. A timer per pool counts each lane's jobs
and scales the lane's Deployment. Decisions live in core.scaling, k8s.reconcile and k8s.status.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
import kubernetes

from jobpool.core.poolspec import Lane, PoolSpec, PoolSpecError, load_pool
from jobpool.core.scaling import (
    LaneJobs,
    ScaleDecision,
    ScalingPolicy,
    decide_replicas,
    fixed_replicas,
)
from jobpool.db.lane_counts import LaneCounter
from jobpool.k8s.client import ApiError, KubeApi, bearer_token, load_configuration
from jobpool.k8s.manifests import GROUP, build_owner_reference, deployment_name, pool_selector
from jobpool.k8s.reconcile import (
    Action,
    ReconcilePlan,
    belongs_to,
    plan_reconcile,
    retry_delay,
    touches_keda,
)
from jobpool.k8s.status import (
    Condition,
    Problem,
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
    previous_problems,
)
from jobpool.sql import QUERIES

VERSION = "v1alpha1"
PLURAL = "jobworkerpools"
DEFAULT_SCALE_INTERVAL = 15.0

log = logging.getLogger(__name__)

CountJobs = Callable[[str, Sequence[Any]], Awaitable[dict[str, LaneJobs]]]
ListChildren = Callable[[str, str], Awaitable[list[dict[str, Any]]]]
ReadChild = Callable[[str, str], Awaitable[dict[str, Any] | None]]


def utcnow() -> datetime:
    """The operator's clock (only for scaling windows and status times)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class OperatorConfig:
    """How the operator runs.

    scale_interval: seconds between job counts per pool. namespaces: () watches every
    namespace. peering: a kopf peering name, None to run standalone (one replica).
    liveness_endpoint: e.g. http://0.0.0.0:8080/healthz, None for none.
    """

    scale_interval: float = DEFAULT_SCALE_INTERVAL
    namespaces: tuple[str, ...] = ()
    kubeconfig: str | None = None
    peering: str | None = None
    liveness_endpoint: str | None = None


class PoolController:
    """What the handlers do for one pool, with the API, clock and job counter injected.

    retry_base: seconds before the first retry of a reconcile that left something undone.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        clock: Callable[[], datetime] = utcnow,
        count_jobs: CountJobs | None = None,
        retry_base: float = DEFAULT_SCALE_INTERVAL,
    ) -> None:
        self.api = api
        self.clock = clock
        # default: capped counts on a kept connection per database, under a statement timeout
        self.count_jobs: CountJobs = count_jobs if count_jobs is not None else LaneCounter()
        self.retry_base = retry_base

    async def reconcile(
        self, body: kopf.Body, patch: kopf.Patch, logger: logging.Logger | Any, retry: int = 0
    ) -> None:
        """Bring the pool's Deployments (and ScaledObjects) to its spec; write the status.

        retry: how many attempts failed before (kopf's count). Raises kopf.TemporaryError,
        after writing the status, when a child could not be made as the spec says (a failed
        call, a name held by another owner, KEDA unavailable), so kopf tries again later.
        """
        now = self.clock()
        meta = body.get("metadata") or {}
        namespace, generation = str(meta["namespace"]), meta.get("generation")
        previous = body.get("status") or {}
        try:
            pool = load_pool(body)
        except PoolSpecError as exc:
            self._report_invalid(body, patch, exc, now, generation)
            return
        done, problems = await self._reconcile_children(
            pool, build_owner_reference(body), namespace, logger
        )
        try:
            after = await self._own_deployments(namespace, pool.name)
        except Exception as exc:  # report it like any failed call; the retry reads again
            after = {}
            problems.append(Problem("ReconcileFailed", f"reading the pool's Deployments "
                                    f"failed: {_describe(exc)}"))
        for warning in pool.warnings:
            kopf.event(body, type="Warning", reason="UnservedKinds", message=warning)
        if done:
            kopf.event(body, type="Normal", reason="Reconciled", message=_summary(done))
        known = condition_of(previous, "Reconciled").get("message") or ""
        for problem in problems:
            if problem.message not in known:  # once per problem, not on every retry
                kopf.event(body, type="Warning", reason=problem.reason, message=problem.message)
        lanes = [
            lane_status(pool, lane, live=after.get(deployment_name(pool.name, lane.name)),
                        previous=previous_lanes(previous).get(lane.name))
            for lane in pool.lanes
        ]
        conditions = merge_conditions(
            previous.get("conditions"),
            pool_conditions(pool, lanes, count_error=previous_count_error(previous),
                            problems=problems),
            generation, now,
        )
        patch.status.update(pool_status(lanes, conditions, generation, None, previous))
        if problems:
            raise kopf.TemporaryError(
                "; ".join(problem.message for problem in problems),
                delay=retry_delay(retry, self.retry_base),
            )

    async def _reconcile_children(
        self, pool: PoolSpec, owner: Mapping[str, Any], namespace: str, logger: Any
    ) -> tuple[list[Action], list[Problem]]:
        """Read, plan and apply the pool's children: the calls done and the problems met."""
        try:
            live = await _children(self.api.list_deployments, self.api.read_deployment,
                                   namespace, pool.name, _lane_children(pool, keda_only=False))
            scaled, keda_problem = await self._live_scaled_objects(pool, namespace, live)
        except Exception as exc:  # any failed call (API error, server unreachable): report
            return [], [Problem("ReconcileFailed", f"reading the pool's children failed: "
                                f"{_describe(exc)}")]
        plan = plan_reconcile(pool, owner, live, scaled, QUERIES["count_lane_jobs"].text)
        done, failed = await self._apply(namespace, plan, logger)
        conflicts = [Problem("NameConflict", conflict.message) for conflict in plan.conflicts]
        return done, [*conflicts, *failed, *([keda_problem] if keda_problem else [])]

    async def _apply(
        self, namespace: str, plan: ReconcilePlan, logger: Any
    ) -> tuple[list[Action], list[Problem]]:
        """Every call of the plan, each on its own: the calls done and those that failed."""
        done: list[Action] = []
        failed: list[Problem] = []
        for action in plan.actions:
            logger.info("%s %s %s", action.verb, action.kind, action.name)
            try:
                await _call(self.api, namespace, action)
            except Exception as exc:  # any failed call: report it, carry on with the others
                failed.append(Problem(
                    "ReconcileFailed",
                    f"{action.verb} {action.kind} {action.name!r} failed: {_describe(exc)}",
                ))
            else:
                done.append(action)
        return done, failed

    async def _live_scaled_objects(
        self, pool: PoolSpec, namespace: str, live_deployments: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any]] | None, Problem | None]:
        """The ScaledObjects to plan with (None: leave KEDA alone) and why KEDA is unusable.

        KEDA's API is called only for a pool that has (or had) lanes in keda mode; a 404
        (no KEDA) or 403 (not granted, which a real API server answers before it looks for
        the API) means it is unavailable.
        """
        if not touches_keda(pool, live_deployments):
            return None, None
        try:
            scaled = await _children(self.api.list_scaled_objects, self.api.read_scaled_object,
                                     namespace, pool.name, _lane_children(pool, keda_only=True))
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            return None, keda_unavailable(pool, namespace, exc.status, exc.message)
        return scaled, None

    async def _own_deployments(self, namespace: str, pool: str) -> dict[str, dict[str, Any]]:
        """The Deployments that belong to the pool, by name (never another owner's)."""
        found = await self.api.list_deployments(namespace, pool_selector(pool))
        return {d["metadata"]["name"]: d for d in found if belongs_to(d, pool)}

    async def scale(
        self, body: kopf.Body, patch: kopf.Patch, logger: logging.Logger | Any
    ) -> None:
        """Count each lane's jobs, scale the lanes' Deployments, and write the status."""
        now = self.clock()
        meta = body.get("metadata") or {}
        namespace = str(meta["namespace"])
        previous = body.get("status") or {}
        try:
            pool = load_pool(body)
        except PoolSpecError as exc:
            self._report_invalid(body, patch, exc, now, None)
            return
        live = await self._own_deployments(namespace, pool.name)
        counts: dict[str, LaneJobs] | None = None
        count_error: str | None = None
        try:
            dsn = await self.api.read_secret_value(
                namespace, pool.dsn_secret.name, pool.dsn_secret.key
            )
            counts = await self.count_jobs(dsn, pool.lanes)
        except (ApiError, KeyError, OSError, ValueError) as exc:
            count_error = _count_error_message(pool, exc)
        except Exception as exc:  # psycopg errors and the like: report, retry next period
            count_error = f"counting jobs failed: {type(exc).__name__}: {exc}"
        if count_error is not None:
            logger.warning(count_error)
            if previous_count_error(previous) != count_error:
                kopf.event(body, type="Warning", reason="CountFailed", message=count_error)
        old = previous_lanes(previous)
        lanes: list[dict[str, Any]] = []
        for lane in pool.lanes:
            name = deployment_name(pool.name, lane.name)
            deployment = live.get(name)
            jobs = counts.get(lane.name) if counts is not None else None
            decision = None
            if deployment is not None and jobs is not None:
                decision = _decide(lane, jobs, deployment, old.get(lane.name), now)
            if decision is not None and deployment is not None:
                current = int((deployment.get("spec") or {}).get("replicas") or 0)
                if decision.changes(current):
                    await self.api.scale_deployment(namespace, name, decision.replicas)
                    kopf.event(body, type="Normal", reason=decision.reason,
                               message=f"lane {lane.name}: {decision.message}")
            lanes.append(lane_status(pool, lane, live=deployment, previous=old.get(lane.name),
                                     jobs=jobs, decision=decision, now=now))
        conditions = merge_conditions(
            previous.get("conditions"),
            pool_conditions(pool, lanes, count_error=count_error,
                            problems=previous_problems(previous)),
            previous.get("observedGeneration"), now,
        )
        patch.status.update(
            pool_status(lanes, conditions, None, now if counts is not None else None, previous)
        )

    def _report_invalid(
        self,
        body: kopf.Body,
        patch: kopf.Patch,
        error: PoolSpecError,
        now: datetime,
        generation: int | None,
    ) -> None:
        previous = body.get("status") or {}
        conditions = merge_conditions(
            previous.get("conditions"), invalid_spec_conditions(str(error)),
            generation if generation is not None else previous.get("observedGeneration"), now,
        )
        if condition_of(previous, "Degraded").get("message") != str(error):
            kopf.event(body, type="Warning", reason="InvalidSpec", message=str(error))
        patch.status["conditions"] = conditions
        if generation is not None:
            patch.status["observedGeneration"] = generation


def _decide(
    lane: Lane, jobs: LaneJobs, deployment: Mapping[str, Any],
    previous: Mapping[str, Any] | None, now: datetime,
) -> ScaleDecision | None:
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
    return decide_replicas(
        policy, ready=jobs.ready, running=jobs.running, current=current,
        scale_down_since=parse_timestamp((previous or {}).get("scaleDownSince")), now=now,
    )


async def _call(api: KubeApi, namespace: str, action: Action) -> None:
    body = action.body or {}
    if action.kind == "Deployment":
        if action.verb == "create":
            await api.create_deployment(namespace, body)
        elif action.verb == "replace":
            await api.replace_deployment(namespace, action.name, body)
        else:
            await api.delete_deployment(namespace, action.name)
    elif action.verb == "create":
        await api.create_scaled_object(namespace, body)
    elif action.verb == "replace":
        await api.replace_scaled_object(namespace, action.name, body)
    else:
        await api.delete_scaled_object(namespace, action.name)


def _summary(done: Sequence[Action]) -> str:
    return "; ".join(f"{a.verb}d {a.kind} {a.name}" for a in done)


def _lane_children(pool: PoolSpec, *, keda_only: bool) -> list[str]:
    """Names of the lanes' children (of keda lanes only if `keda_only`)."""
    return [deployment_name(pool.name, lane.name) for lane in pool.lanes
            if not keda_only or lane.autoscaling.mode == "keda"]


async def _children(
    list_call: ListChildren, read_call: ReadChild, namespace: str, pool: str,
    names: Sequence[str],
) -> list[dict[str, Any]]:
    """The pool's children (a list by its labels) and whatever else holds one of `names`."""
    found = await list_call(namespace, pool_selector(pool))
    listed = {obj["metadata"]["name"] for obj in found}
    for name in names:
        if name not in listed:
            holder = await read_call(namespace, name)
            if holder is not None:
                found.append(holder)
    return found


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"


def _count_error_message(pool: PoolSpec, exc: Exception) -> str:
    secret = f"Secret {pool.dsn_secret.name!r} key {pool.dsn_secret.key!r}"
    if isinstance(exc, ApiError) and exc.status == 404:
        return f"cannot read the DSN: {secret} not found"
    if isinstance(exc, KeyError):
        return f"cannot read the DSN: {secret} has no such key"
    if isinstance(exc, ApiError):
        return f"cannot read the DSN from {secret}: {exc}"
    return f"counting jobs failed: {type(exc).__name__}: {exc}"


def connection_info(configuration: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """kopf's credentials from the same client configuration the API calls use."""
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme="Bearer" if bearer_token(configuration) else None,
        token=bearer_token(configuration),
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def operator_settings(settings: kopf.OperatorSettings) -> None:
    """Keep kopf's bookkeeping in the pool's annotations; post only warnings as events.

    (The operator's own events, e.g. scale decisions, are posted explicitly.)
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.networking.request_timeout = 60.0
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330


def build_registry(
    config: OperatorConfig,
    controller: PoolController,
    configuration: kubernetes.client.Configuration,
) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers, bound to `controller`."""
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.login(registry=registry)
    def operator_login(**_: Any) -> kopf.ConnectionInfo:
        """Authenticate kopf like the API client."""
        return connection_info(configuration)

    @kopf.on.startup(registry=registry)
    def operator_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Apply the operator's kopf settings."""
        operator_settings(settings)

    @kopf.on.create(*resource, registry=registry)
    async def jobworkerpool_create(
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, retry: int, **_: Any
    ) -> None:
        """A new pool: create its lanes' Deployments."""
        await controller.reconcile(body, patch, logger, retry)

    @kopf.on.update(*resource, registry=registry)
    async def jobworkerpool_update(
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, retry: int, **_: Any
    ) -> None:
        """A changed pool: replace changed lanes, delete removed ones, keep replicas."""
        await controller.reconcile(body, patch, logger, retry)

    @kopf.on.resume(*resource, registry=registry)
    async def jobworkerpool_resume(
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, retry: int, **_: Any
    ) -> None:
        """The operator restarted: make sure the children still match."""
        await controller.reconcile(body, patch, logger, retry)

    @kopf.timer(*resource, interval=config.scale_interval, registry=registry)
    async def jobworkerpool_timer(
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any
    ) -> None:
        """Every scale interval: count jobs per lane and scale."""
        await controller.scale(body, patch, logger)

    return registry


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
    count_jobs: CountJobs | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (or forever)."""
    configuration = load_configuration(config.kubeconfig)
    api = KubeApi(configuration)
    controller = PoolController(api, count_jobs=count_jobs, retry_base=config.scale_interval)
    registry = build_registry(config, controller, configuration)
    settings = kopf.OperatorSettings()
    operator_settings(settings)
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            standalone=config.peering is None,
            peering_name=config.peering,
            liveness_endpoint=config.liveness_endpoint,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        api.close()
        if isinstance(controller.count_jobs, LaneCounter):
            await controller.count_jobs.close()


__all__ = ["Condition", "OperatorConfig", "PoolController", "build_registry", "run_operator"]
