"""A YAML or JSON value that names a tenant, a kind, a lane, a schedule or a provider is text:
a number or a boolean there (`tenant: 5`, `tenant: yes`) is refused naming the field, the
value and its type, never read as the name "5" or "True"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobpool.core.poolspec import PoolSpecError, load_pool_file
from jobpool.core.ratelimit import parse_tenant_limits
from jobpool.core.schedules import ScheduleError, parse_schedule
from jobpool.core.yamlfile import provider_caps_from_text
from jobpool.worker.scheduler import declarations_for

POOL = """\
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata:
  name: {name}
  namespace: {namespace}
spec:
  image: jobpool:0.1.0
  database: {{secretName: db}}
  lanes:
    - name: {lane}
      tenants: [{tenant}]
      rateLimits:
        providers: {{smtp: {{rps: 1, burst: 1}}}}
        kinds: {{{kind}: smtp}}
  schedules:
    - {{name: {schedule}, kind: reindex, tenant: {schedule_tenant}, every: 60}}
"""
GOOD = {"name": "jobs", "namespace": "mdm", "lane": "default", "tenant": "acme",
        "kind": "email_send", "schedule": "nightly", "schedule_tenant": "acme"}


def pool_file(tmp_path: Path, **changes: str) -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(POOL.format(**{**GOOD, **changes}))
    return path


def test_the_pool_file_of_these_tests_loads(tmp_path: Path) -> None:
    pool = load_pool_file(pool_file(tmp_path))
    assert (pool.lanes[0].tenants, pool.schedules[0].tenant) == (("acme",), "acme")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("schedule_tenant", "5", "spec.schedules[0].tenant: 5 is not of type 'string'"),
    ("schedule_tenant", "yes", "spec.schedules[0].tenant: True is not of type 'string'"),
    ("schedule", "5", "spec.schedules[0].name: 5 is not of type 'string'"),
    ("tenant", "5", "spec.lanes[0].tenants[0]: 5 is not of type 'string'"),
    ("lane", "5", "spec.lanes[0].name: 5 is not of type 'string'"),
    ("kind", "5", "a key of spec.lanes[0].rateLimits.kinds must be a string, got 5 (int)"),
    ("namespace", "5", "metadata.namespace must be a string, got 5 (int) (the setting "
                       "JOBPOOL_POOL_NAMESPACE)"),
    ("name", "5", "metadata.name must be a string, got 5 (int) (the setting JOBPOOL_POOL)"),
])
def test_a_pool_file_refuses_a_number_or_boolean_where_a_name_goes(
    tmp_path: Path, field: str, value: str, message: str
) -> None:
    path = pool_file(tmp_path, **{field: value})
    with pytest.raises(PoolSpecError) as refused:
        load_pool_file(path)
    assert str(refused.value).startswith(f"{path}: {message}"), str(refused.value)


@pytest.mark.parametrize(("key", "value"), [
    ("tenant", 5), ("tenant", True), ("tenant", None), ("kind", 5), ("name", 5),
    ("cron", 5), ("timeZone", 1.5),
])
def test_a_schedule_refuses_a_value_that_is_not_text(key: str, value: object) -> None:
    raw = {"name": "nightly", "kind": "reindex", "cron": "0 3 * * *", key: value}
    with pytest.raises(ScheduleError) as refused:
        parse_schedule(raw, "s")
    assert str(refused.value) == (
        f"s.{key} must be a string, got {value!r} ({type(value).__name__})")


def test_jobpool_schedules_refuses_a_tenant_that_is_a_number() -> None:
    text = json.dumps([{"name": "nightly", "kind": "reindex", "tenant": 5, "every": 60}])
    with pytest.raises(ScheduleError, match=r"^JOBPOOL_SCHEDULES\[0\]\.tenant must be a string, "
                                            r"got 5 \(int\)$"):
        declarations_for("jobs", "mdm", text, ())


def test_rate_limits_refuse_a_kind_or_provider_that_is_a_number() -> None:
    with pytest.raises(ValueError, match=r"^a key of kinds must be a string, got 5 \(int\)$"):
        provider_caps_from_text("providers: {smtp: {rps: 1, burst: 1}}\nkinds: {5: smtp}\n")
    with pytest.raises(ValueError, match=r"^a key of providers must be a string, got 5 \(int\)"):
        provider_caps_from_text("providers: {5: {rps: 1, burst: 1}}\n")
    limits, problems = parse_tenant_limits({5: {"rps": 1, "burst": 1}}, "acme")
    assert (limits.kinds, problems) == (
        {}, ["a key of tenant acme: rate_limit must be a string, got 5 (int)"])
