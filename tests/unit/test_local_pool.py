"""`jobpool run pool.yaml`: the local processes of each lane, as the operator's pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobpool.core.crd import API_VERSION
from jobpool.core.poolspec import PoolSpec, load_pool, load_pool_file
from jobpool.k8s.manifests import build_worker_container, build_worker_env
from jobpool.settings import Settings
from jobpool.worker.supervisor import lane_processes, local_process_count

POD_ONLY = ("JOBPOOL_METRICS_PORT", "JOBPOOL_SERVICE_ACCOUNT")
"""A pod's own: its metrics port (a local process n gets port + n) and its service account
(from the downward API; a local process is audited as the settings' service account)."""

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pool.yaml"


def test_each_local_process_gets_its_lanes_pod_environment() -> None:
    pool = load_pool_file(EXAMPLE)
    settings = Settings(dsn="postgresql://db/mdm", rate_limits='{"providers": {}}')
    inherited = {"PATH": "/usr/bin", "JOBPOOL_RATE_LIMITS": '{"providers": {}}'}
    processes = lane_processes(pool, settings, imports=(), until_empty=False, metrics_port=0,
                               inherited=inherited)
    assert {proc.lane for proc in processes} == {lane.name for lane in pool.lanes}
    for proc in processes:
        pod = {item["name"]: item["value"] for item in build_worker_env(pool, pool.lane(proc.lane))
               if "value" in item and item["name"] not in POD_ONLY}
        assert {name: proc.env.get(name) for name in pod} == pod
        assert ("JOBPOOL_RATE_LIMITS" in proc.env) == ("JOBPOOL_RATE_LIMITS" in pod)
        assert (proc.env["PATH"], proc.env["JOBPOOL_DSN"]) == ("/usr/bin", "postgresql://db/mdm")
    lanes = {proc.lane: proc.env for proc in processes}
    assert "smtp" in lanes["default"]["JOBPOOL_RATE_LIMITS"]
    assert "JOBPOOL_RATE_LIMITS" not in lanes["bulk"]  # no rateLimits: no inherited caps either


def test_each_local_process_gets_its_lanes_pod_arguments() -> None:
    """The pool's graceSeconds and imports reach the local processes as they reach pods."""
    pool = load_pool({
        "apiVersion": API_VERSION, "kind": "JobWorkerPool",
        "metadata": {"name": "local"},
        "spec": {"image": "jobpool:test", "database": {"secretName": "db"},
                 "worker": {"graceSeconds": 7, "imports": ["mykinds"]},
                 "lanes": [{"name": "all"}]},
    })
    processes = lane_processes(pool, Settings(), imports=("extra", "mykinds"), until_empty=True,
                               inherited={})
    for proc in processes:
        pod_args = tuple(build_worker_container(pool, pool.lane(proc.lane))["args"])
        assert proc.argv[:len(pod_args)] == pod_args
        assert proc.argv[len(pod_args):] == ("--import", "extra", "--log-level", "info",
                                             "--until-empty")
        assert proc.argv[proc.argv.index("--grace"):][:2] == ("--grace", "7")


def _pool_with(min_replicas: int) -> PoolSpec:
    return load_pool({
        "apiVersion": API_VERSION, "kind": "JobWorkerPool",
        "metadata": {"name": "local"},
        "spec": {"image": "jobpool:test", "database": {"secretName": "db"},
                 "lanes": [{"name": "all", "minReplicas": min_replicas,
                            "maxReplicas": max(min_replicas, 1)}]},
    })


def test_a_local_pool_larger_than_four_processes_per_cpu_is_refused() -> None:
    """minReplicas 1000 is a cluster's figure: a local run refuses to start 1000 processes."""
    assert local_process_count(_pool_with(7), cpus=2) == 8  # and the heavy lane's one
    with pytest.raises(ValueError, match=r"asks for 1001 local worker processes \(all: 1000, "
                                         r"heavy: 1\), more than the cap of 8 on this machine "
                                         r"\(4 per CPU, 2 CPUs\)"):
        local_process_count(_pool_with(1000), cpus=2)
