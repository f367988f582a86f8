"""kopf wiring of the operator: thin handlers that gather, plan, apply and report.

On create, update and resume of a JobWorkerPool: reconcile one Deployment per lane (and a
KEDA ScaledObject per keda lane). A timer per pool counts each lane's jobs and scales the
lane's Deployment. Decisions live in core.scaling, k8s.reconcile and k8s.status.
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
from jobpool.db.scaling import count_lane_jobs_at
from jobpool.k8s.client import ApiError, KubeApi, bearer_token, load_configuration
from jobpool.k8s.manifests import GROUP, build_owner_reference, deployment_name, pool_selector
from jobpool.k8s.reconcile import Action, ReconcilePlan, plan_reconcile
from jobpool.k8s.status import (
    Condition,
    invalid_spec_conditions,
    lane_status,
    merge_conditions,
    parse_timestamp,
    pool_conditions,
    pool_status,
    previous_lanes,
)
from jobpool.sql import QUERIES

VERSION = "v1alpha1"
PLURAL = "jobworkerpools"
DEFAULT_SCALE_INTERVAL = 15.0

log = logging.getLogger(__name__)

CountJobs = Callable[[str, Sequence[Any]], Awaitable[dict[str, LaneJobs]]]


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
    """What the handlers do for one pool, with the API, clock and job counter injected."""

    def __init__(
        self,
        api: KubeApi,
        *,
        clock: Callable[[], datetime] = utcnow,
        count_jobs: CountJobs = count_lane_jobs_at,
    ) -> None:
        self.api = api
        self.clock = clock
        self.count_jobs = count_jobs

    async def reconcile(
        self, body: kopf.Body, patch: kopf.Patch, logger: logging.Logger | Any
    ) -> None:
        """Bring the pool's Deployments (and ScaledObjects) to its spec; write the status."""
        now = self.clock()
        meta = body.get("metadata") or {}
        namespace, generation = str(meta["namespace"]), meta.get("generation")
        previous = body.get("status") or {}
        try:
            pool = load_pool(body)
        except PoolSpecError as exc:
            self._report_invalid(body, patch, exc, now, generation)
            return
        owner = build_owner_reference(body)
        selector = pool_selector(pool.name)
        live = await self.api.list_deployments(namespace, selector)
        scaled = await self.api.list_scaled_objects(namespace, selector)
        plan = plan_reconcile(pool, owner, live, scaled, QUERIES["count_lane_jobs"].text)
        await self._apply(namespace, plan, logger)
        problems = []
        if scaled is None and any(lane.autoscaling.mode == "keda" for lane in pool.lanes):
            problems.append("KEDA is not installed: keda lanes keep their current replicas")
            kopf.event(body, type="Warning", reason="KedaMissing", message=problems[-1])
        for warning in pool.warnings:
            kopf.event(body, type="Warning", reason="UnservedKinds", message=warning)
        if plan.actions:
            kopf.event(body, type="Normal", reason="Reconciled", message=_summary(plan))
        after = {
            d["metadata"]["name"]: d for d in await self.api.list_deployments(namespace, selector)
        }
        lanes = [
            lane_status(pool, lane, live=after.get(deployment_name(pool.name, lane.name)),
                        previous=previous_lanes(previous).get(lane.name))
            for lane in pool.lanes
        ]
        count_error = _previous_count_error(previous)
        conditions = merge_conditions(
            previous.get("conditions"),
            pool_conditions(pool, lanes, count_error=count_error, problems=problems),
            generation, now,
        )
        patch.status.update(pool_status(lanes, conditions, generation, None, previous))

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
        live = {
            d["metadata"]["name"]: d
            for d in await self.api.list_deployments(namespace, pool_selector(pool.name))
        }
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
            if _previous_count_error(previous) != count_error:
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
                            problems=_previous_problems(previous)),
            previous.get("observedGeneration"), now,
        )
        patch.status.update(
            pool_status(lanes, conditions, None, now if counts is not None else None, previous)
        )

    async def _apply(self, namespace: str, plan: ReconcilePlan, logger: Any) -> None:
        for action in plan.actions:
            logger.info("%s %s %s", action.verb, action.kind, action.name)
            await _call(self.api, namespace, action)

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
        if _condition(previous, "Degraded").get("message") != str(error):
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


def _summary(plan: ReconcilePlan) -> str:
    return "; ".join(f"{a.verb}d {a.kind} {a.name}" for a in plan.actions)


def _count_error_message(pool: PoolSpec, exc: Exception) -> str:
    secret = f"Secret {pool.dsn_secret.name!r} key {pool.dsn_secret.key!r}"
    if isinstance(exc, ApiError) and exc.status == 404:
        return f"cannot read the DSN: {secret} not found"
    if isinstance(exc, KeyError):
        return f"cannot read the DSN: {secret} has no such key"
    if isinstance(exc, ApiError):
        return f"cannot read the DSN from {secret}: {exc}"
    return f"counting jobs failed: {type(exc).__name__}: {exc}"


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return {}


def _previous_count_error(status: Mapping[str, Any]) -> str | None:
    degraded = _condition(status, "Degraded")
    if degraded.get("reason") == "CountFailed":
        return str(degraded.get("message"))
    return None


def _previous_problems(status: Mapping[str, Any]) -> list[str]:
    degraded = _condition(status, "Degraded")
    if degraded.get("reason") == "ReconcileProblem":
        return [str(degraded.get("message"))]
    return []


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
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any
    ) -> None:
        """A new pool: create its lanes' Deployments."""
        await controller.reconcile(body, patch, logger)

    @kopf.on.update(*resource, registry=registry)
    async def jobworkerpool_update(
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any
    ) -> None:
        """A changed pool: replace changed lanes, delete removed ones, keep replicas."""
        await controller.reconcile(body, patch, logger)

    @kopf.on.resume(*resource, registry=registry)
    async def jobworkerpool_resume(
        body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any
    ) -> None:
        """The operator restarted: make sure the children still match."""
        await controller.reconcile(body, patch, logger)

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
    count_jobs: CountJobs = count_lane_jobs_at,
) -> None:
    """Run the operator until `stop_flag` is set (or forever)."""
    configuration = load_configuration(config.kubeconfig)
    api = KubeApi(configuration)
    controller = PoolController(api, count_jobs=count_jobs)
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


__all__ = ["Condition", "OperatorConfig", "PoolController", "build_registry", "run_operator"]
