"""Pure builders of the objects the operator owns: one worker Deployment per lane, a KEDA
ScaledObject per keda lane and a TriggerAuthentication per pool with keda lanes, owner
references. Dicts in, dicts out: each is the whole configuration the operator applies
(server-side apply), and never holds a Deployment's replicas, which the scaler writes."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from jobpool.cli_arguments import worker_command
from jobpool.core.crd import API_VERSION, GROUP, KIND
from jobpool.core.poolspec import Lane, PoolSpec
from jobpool.core.scaling import lane_count_cap
from jobpool.core.shutdown import termination_grace_seconds
from jobpool.settings import variable

POOL_LABEL = f"{GROUP}/pool"
LANE_LABEL = f"{GROUP}/lane"
TEMPLATE_HASH = f"{GROUP}/template-hash"
"""Annotation on a Deployment: hash of everything the operator sets except replicas."""
SCALED_BY = f"{GROUP}/scaled-by"
"""Annotation `keda` on the Deployment of a keda lane: its ScaledObject must go if it leaves."""
MANAGED_BY = "jobpool-operator"
CONTAINER = "worker"
RUN_AS = 10001
KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_POLLING_SECONDS = 15
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def deployment_name(pool: str, lane: str) -> str:
    """`<pool>-<lane>`: the name of a lane's Deployment (and ScaledObject)."""
    return f"{pool}-{lane}"


def trigger_authentication_name(pool: str) -> str:
    """`<pool>-dsn`: the TriggerAuthentication that gives the pool's ScaledObjects the DSN."""
    return f"{pool}-dsn"


def selector_labels(pool: str, lane: str) -> dict[str, str]:
    """The labels that select a lane's pods (immutable in a Deployment)."""
    return {"app.kubernetes.io/name": "jobpool", POOL_LABEL: pool, LANE_LABEL: lane}


def build_labels(pool: str, lane: str, version: str | None = None) -> dict[str, str]:
    """The labels of everything the operator creates for a lane."""
    labels = {
        **selector_labels(pool, lane),
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "jobpool",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
    if version:
        labels["app.kubernetes.io/version"] = version
    return labels


def pool_selector(pool: str) -> dict[str, str]:
    """The labels of every object the operator made for `pool` (a label selector)."""
    return {POOL_LABEL: pool, "app.kubernetes.io/managed-by": MANAGED_BY}


def build_pool_labels(pool: str) -> dict[str, str]:
    """The labels of what the operator creates for a whole pool (no lane)."""
    return {
        "app.kubernetes.io/name": "jobpool",
        POOL_LABEL: pool,
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "jobpool",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def build_owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The ownerReference that makes a child go when its JobWorkerPool goes.

    `owner` is the pool object as the API returned it; raises ValueError without a uid.
    """
    meta = owner.get("metadata") or {}
    if not meta.get("uid"):
        raise ValueError(f"JobWorkerPool {meta.get('name')!r} has no uid; cannot own children")
    return {
        "apiVersion": owner.get("apiVersion", API_VERSION),
        "kind": owner.get("kind", KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _image_version(image: str) -> str | None:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail or ":" not in tail:
        return None
    tag = tail.rsplit(":", 1)[1]
    return tag if _LABEL_VALUE.fullmatch(tag) else None


def worker_command_of(pool: PoolSpec, lane: Lane) -> tuple[list[str], dict[str, str]]:
    """The arguments of a lane's worker container, and the variables the pool gives it
    (`PoolSpec.worker_run`: its settings without a flag, then `spec.worker.env`)."""
    return worker_command(pool.worker_run(lane))


def build_worker_env(pool: PoolSpec, lane: Lane) -> list[dict[str, Any]]:
    """The worker container's environment: DSN from the Secret, metrics port, the pod's
    service account as the audit actor, pool and lane names, rate limits, `spec.worker.env`."""
    env: list[dict[str, Any]] = [
        {
            "name": variable("dsn"),
            "valueFrom": {
                "secretKeyRef": {"name": pool.dsn_secret.name, "key": pool.dsn_secret.key}
            },
        },
        {"name": variable("metrics_port"), "value": str(pool.metrics_port)},
    ]
    _, lane_env = worker_command_of(pool, lane)
    if variable("service_account") not in lane_env:  # one entry per name (server-side apply)
        env += _service_account_env()
    # an empty value as the server stores it (it leaves `value: ""` out): else every sync
    # would find the entry changed and apply it again
    env += [{"name": name, "value": value} if value else {"name": name}
            for name, value in lane_env.items()]
    return env


def _service_account_env() -> list[dict[str, Any]]:
    """JOBPOOL_SERVICE_ACCOUNT as Kubernetes names the pod's service account
    (`system:serviceaccount:NAMESPACE:NAME`, from the downward API), so that the audit log
    names the account the workers run as."""
    return [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_SERVICE_ACCOUNT",
         "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": variable("service_account"),
         "value": "system:serviceaccount:$(POD_NAMESPACE):$(POD_SERVICE_ACCOUNT)"},
    ]


def build_worker_container(pool: PoolSpec, lane: Lane) -> dict[str, Any]:
    """The one container of a lane's pods: `jobpool run` restricted to the lane."""
    probe = {"port": "metrics", "scheme": "HTTP"}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": pool.image,
        "imagePullPolicy": pool.image_pull_policy,
        "args": worker_command_of(pool, lane)[0],
        "env": build_worker_env(pool, lane),
        "ports": [{"name": "metrics", "containerPort": pool.metrics_port, "protocol": "TCP"}],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", **probe},
            "initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", **probe},
            "initialDelaySeconds": 2, "periodSeconds": 5, "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if lane.resources:
        container["resources"] = {
            key: dict(value) for key, value in lane.resources.items() if value
        }
    return container


def build_pod_template(pool: PoolSpec, lane: Lane) -> dict[str, Any]:
    """The pod template of a lane's Deployment."""
    annotations = {
        **pool.pod_annotations,
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(pool.metrics_port),
        "prometheus.io/path": "/metrics",
    }
    spec: dict[str, Any] = {
        "containers": [build_worker_container(pool, lane)],
        # the worker's whole shutdown: the grace, the stop grace and the hand-backs after it
        "terminationGracePeriodSeconds": termination_grace_seconds(pool.grace_seconds,
                                                                   pool.stop_grace_seconds),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    if pool.service_account_name:
        spec["serviceAccountName"] = pool.service_account_name
    if pool.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in pool.image_pull_secrets]
    if pool.node_selector:
        spec["nodeSelector"] = dict(pool.node_selector)
    return {
        "metadata": {
            "labels": build_labels(pool.name, lane.name, _image_version(pool.image)),
            "annotations": annotations,
        },
        "spec": spec,
    }


def template_hash(body: Mapping[str, Any]) -> str:
    """A short hash of an object as the operator builds it, ignoring replicas and the hash."""
    spec = {key: value for key, value in (body.get("spec") or {}).items() if key != "replicas"}
    meta = body.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != TEMPLATE_HASH}
    subject = {
        "labels": meta.get("labels") or {},
        "annotations": annotations,
        "ownerReferences": meta.get("ownerReferences") or [],
        "spec": spec,
    }
    digest = hashlib.sha256(json.dumps(subject, sort_keys=True).encode("utf-8"))
    return digest.hexdigest()[:16]


def _with_hash(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"].setdefault("annotations", {})[TEMPLATE_HASH] = template_hash(body)
    return body


def build_worker_deployment(
    pool: PoolSpec, lane: Lane, owner: Mapping[str, Any]
) -> dict[str, Any]:
    """The Deployment `<pool>-<lane>` running the lane's workers, without `spec.replicas`.

    owner: the ownerReference (see build_owner_reference). Replicas are not part of it: the
    scaler (or KEDA) writes them through the scale subresource, and a configuration that
    held them would take them back on every apply.
    """
    labels = build_labels(pool.name, lane.name, _image_version(pool.image))
    metadata: dict[str, Any] = {
        "name": deployment_name(pool.name, lane.name),
        "labels": labels,
        "annotations": {SCALED_BY: "keda"} if lane.autoscaling.mode == "keda" else {},
        "ownerReferences": [dict(owner)],
    }
    if pool.namespace:
        metadata["namespace"] = pool.namespace
    return _with_hash({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector_labels(pool.name, lane.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0},
            },
            "template": build_pod_template(pool, lane),
        },
    })


def keda_query(count_query: str, lane: Lane) -> str:
    """The KEDA postgresql trigger's query: `count_lane_jobs` for one lane, as one number.

    `count_query` is the named query's text. The lane becomes a SQL string literal; its
    names are already restricted by the CRD's patterns, and quotes are doubled regardless.
    """
    lanes = json.dumps([{
        "name": lane.name,
        "kinds": None if lane.kinds is None else list(lane.kinds),
        "exclude_kinds": list(lane.exclude_kinds),
        "tenants": list(lane.tenants),
        "cap": lane_count_cap(lane.max_replicas, lane.workers_per_pod,
                              lane.autoscaling.target_utilization),
    }], separators=(",", ":"))
    literal = "'" + lanes.replace("'", "''") + "'"
    inner = count_query.strip().rstrip(";").replace("%(lanes)s", literal)
    return f"SELECT coalesce(sum(ready + running), 0) FROM ({inner}) AS lane_jobs"


def build_scaled_object(
    pool: PoolSpec, lane: Lane, owner: Mapping[str, Any], count_query: str
) -> dict[str, Any]:
    """A KEDA ScaledObject scaling the lane's Deployment with a postgresql trigger.

    The trigger authenticates through the pool's TriggerAuthentication (see
    build_trigger_authentication), so the DSN stays in its Secret. Target per pod:
    workers_per_pod x target utilisation.
    """
    policy = lane.autoscaling
    name = deployment_name(pool.name, lane.name)
    metadata: dict[str, Any] = {
        "name": name,
        "labels": build_labels(pool.name, lane.name),
        "annotations": {},
        "ownerReferences": [dict(owner)],
    }
    if pool.namespace:
        metadata["namespace"] = pool.namespace
    target = lane.workers_per_pod * policy.target_utilization
    return _with_hash({
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                "envSourceContainerName": CONTAINER,
            },
            "minReplicaCount": lane.min_replicas,
            "maxReplicaCount": lane.max_replicas,
            "pollingInterval": KEDA_POLLING_SECONDS,
            "cooldownPeriod": int(policy.scale_down_stabilization),
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": int(policy.scale_down_stabilization),
                            "policies": [{
                                "type": "Pods", "value": policy.scale_down_max_step,
                                "periodSeconds": KEDA_POLLING_SECONDS,
                            }],
                        },
                    },
                },
            },
            "triggers": [{
                "type": "postgresql",
                "authenticationRef": {"name": trigger_authentication_name(pool.name)},
                "metadata": {
                    "query": keda_query(count_query, lane),
                    "targetQueryValue": f"{target:g}",
                    "activationTargetQueryValue": "0",
                },
            }],
        },
    })


def build_trigger_authentication(pool: PoolSpec, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The KEDA TriggerAuthentication `<pool>-dsn`: the postgresql scaler's `connection`
    parameter from the pool's DSN Secret (KEDA reads it; the DSN never enters a manifest)."""
    metadata: dict[str, Any] = {
        "name": trigger_authentication_name(pool.name),
        "labels": build_pool_labels(pool.name),
        "annotations": {},
        "ownerReferences": [dict(owner)],
    }
    if pool.namespace:
        metadata["namespace"] = pool.namespace
    return _with_hash({
        "apiVersion": KEDA_API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": metadata,
        "spec": {
            "secretTargetRef": [{
                "parameter": "connection", "name": pool.dsn_secret.name,
                "key": pool.dsn_secret.key,
            }],
        },
    })
