"""The JobWorkerPool document: schema errors with paths, CEL-equivalent checks, lane plan."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobpool.cli_arguments import worker_command
from jobpool.core import poolspec
from jobpool.core.crd import API_VERSION
from jobpool.core.kinds import BUILTIN_KINDS, HEAVY_KINDS
from jobpool.core.poolspec import SHIPPED_EXAMPLES, PoolSpecError, load_pool, load_pool_file
from jobpool.settings import default_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pool.yaml"


def pool(*lanes: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A minimal valid document with `lanes` and extra `spec` fields."""
    return {
        "apiVersion": API_VERSION,
        "kind": "JobWorkerPool",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "image": "jobpool:1",
            "database": {"secretName": "db"},
            "lanes": list(lanes) or [{"name": "default"}],
            **spec,
        },
    }


def error_of(document: dict[str, Any]) -> str:
    with pytest.raises(PoolSpecError) as caught:
        load_pool(document)
    return str(caught.value)


# -- the example -------------------------------------------------------------------------


def test_example_pool_plans_default_bulk_tenant_and_implicit_heavy_lane() -> None:
    spec = load_pool_file(EXAMPLE)
    assert [lane.name for lane in spec.lanes] == ["default", "bulk", "acme", "heavy"]
    default, bulk, acme, heavy = spec.lanes
    assert default.kinds is None
    assert set(default.exclude_kinds) == {"bulk_import", "reindex", *HEAVY_KINDS}
    assert "email_send" not in default.exclude_kinds  # acme's lane is for one tenant only
    assert acme.tenants == ("acme",)
    assert heavy.implicit and set(heavy.kinds or ()) == HEAVY_KINDS
    assert (heavy.workers_per_pod, heavy.min_replicas, heavy.max_replicas) == (1, 0, 1)
    assert spec.dsn_secret == poolspec.SecretRef("jobpool-db", "dsn")
    assert spec.warnings == ()
    assert not bulk.serves("email_send") and bulk.serves("reindex")


def test_no_lane_but_heavy_ever_serves_heavy_kinds() -> None:
    spec = load_pool_file(EXAMPLE)
    for kind in HEAVY_KINDS:
        serving = [lane.name for lane in spec.lanes if lane.serves(kind)]
        assert serving == ["heavy"], kind


# -- the lane plan -----------------------------------------------------------------------


def test_heavy_kinds_listed_explicitly_get_no_implicit_lane() -> None:
    spec = load_pool(pool({"name": "default"}, {"name": "index", "kinds": sorted(HEAVY_KINDS)}))
    assert [lane.name for lane in spec.lanes] == ["default", "index"]
    assert set(HEAVY_KINDS) <= set(spec.lane("default").exclude_kinds)


def test_heavy_kind_listed_in_part_leaves_the_rest_on_the_heavy_lane() -> None:
    spec = load_pool(pool({"name": "default"}, {"name": "idx", "kinds": ["index_sync"]}))
    assert spec.lane("heavy").kinds == ("gin_backfill",)
    assert spec.lane("idx").kinds == ("index_sync",)


def test_heavy_lane_settings_come_from_heavy_lane_field() -> None:
    spec = load_pool(pool(heavyLane={"workersPerPod": 2, "minReplicas": 1, "maxReplicas": 3}))
    heavy = spec.lane("heavy")
    assert (heavy.workers_per_pod, heavy.min_replicas, heavy.max_replicas) == (2, 1, 3)


def test_catch_all_for_a_tenant_excludes_kinds_of_lanes_covering_that_tenant() -> None:
    spec = load_pool(pool(
        {"name": "default"},
        {"name": "mail", "kinds": ["email_send"], "tenants": ["acme", "beta"]},
        {"name": "acme-rest", "tenants": ["acme"]},
    ))
    assert "email_send" in spec.lane("acme-rest").exclude_kinds
    assert "email_send" not in spec.lane("default").exclude_kinds


@pytest.mark.parametrize(
    ("lanes", "expected"),
    [
        ([{"name": "a", "kinds": ["email_send"]},
          {"name": "b", "kinds": ["email_send", "reindex"]}],
         "email_send claimed by lanes 'a' and 'b' for all tenants"),
        ([{"name": "a", "kinds": ["reindex"], "tenants": ["acme", "x"]},
          {"name": "b", "kinds": ["reindex"], "tenants": ["acme"]}],
         "reindex claimed by lanes 'a' and 'b' for acme"),
        ([{"name": "a"}, {"name": "b"}], "every unlisted kind claimed by lanes 'a' and 'b'"),
    ],
)
def test_a_kind_claimed_twice_for_the_same_tenant_is_rejected(
    lanes: list[dict[str, Any]], expected: str
) -> None:
    message = error_of(pool(*lanes))
    assert message.startswith("spec.lanes[1].kinds: ")
    assert expected in message


def test_a_kind_on_an_all_tenant_lane_and_a_tenant_lane_is_extra_capacity() -> None:
    spec = load_pool(pool(
        {"name": "a", "kinds": ["email_send"]},
        {"name": "b", "kinds": ["email_send"], "tenants": ["acme"]},
    ))
    assert [lane.name for lane in spec.lanes if lane.serves("email_send", "acme")] == ["a", "b"]


def test_a_lane_named_heavy_must_take_the_heavy_kinds() -> None:
    assert "'heavy' is the implicit lane of heavy kinds" in error_of(
        pool({"name": "default"}, {"name": "heavy", "kinds": ["reindex"]})
    )
    spec = load_pool(pool({"name": "heavy", "kinds": ["index_sync", "gin_backfill"]}))
    assert not spec.lane("heavy").implicit


def test_known_kinds_no_lane_serves_are_a_warning() -> None:
    spec = load_pool(pool({"name": "mail", "kinds": ["email_send"]}))
    assert [warning.reason for warning in spec.warnings] == ["UnservedKinds"]
    missing = set(BUILTIN_KINDS) - {"email_send", *HEAVY_KINDS}
    assert all(kind in spec.warnings[0].message for kind in missing)
    assert "email_send" not in spec.warnings[0].message


# -- validation errors name the field ----------------------------------------------------


def _set(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(document)
    target: Any = document
    keys: list[Any] = [int(k) if k.isdigit() else k for k in path.split(".")]
    for key in keys[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return document


_DELETE = object()
TWO_LANES = pool({"name": "default"}, {"name": "bulk", "kinds": ["bulk_import"]})


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.lanes.1.maxReplicas", "ten", "spec.lanes[1].maxReplicas: 'ten' is not of type"),
        ("spec.lanes.1.maxReplicas", 0, "spec.lanes[1].maxReplicas: 0 is less than the minimum"),
        ("spec.lanes.1.name", "Bulk_Lane", "spec.lanes[1].name: 'Bulk_Lane' does not match"),
        ("spec.lanes.1.kinds", ["Bad-Kind"], "spec.lanes[1].kinds[0]: 'Bad-Kind' does not match"),
        ("spec.lanes.1.kinds", [], "spec.lanes[1].kinds: [] "),
        ("spec.lanes.1.tenants", ["ACME"], "spec.lanes[1].tenants[0]: 'ACME' does not match"),
        ("spec.lanes.1.workersPerPod", 0, "spec.lanes[1].workersPerPod: 0 is less than"),
        ("spec.lanes.1.autoscaling", {"mode": "hpa"}, "spec.lanes[1].autoscaling.mode: 'hpa'"),
        ("spec.lanes.1.autoscaling", {"targetUtilization": 0},
         "spec.lanes[1].autoscaling.targetUtilization: 0 is less than the minimum of 0.01"),
        ("spec.lanes.1.surprise", 1, "spec.lanes[1]: Additional properties are not allowed"),
        ("spec.image", _DELETE, "spec: 'image' is a required property"),
        ("spec.database", {}, "spec.database: 'secretName' is a required property"),
        ("spec.lanes", [], "spec.lanes: [] "),
        ("spec.worker", {"graceSeconds": -1}, "spec.worker.graceSeconds: -1 is less than"),
        ("apiVersion", "jobs.mdm.io/v1", "apiVersion: expected 'jobs.mdm.io/v1alpha1'"),
        ("kind", "Pool", "kind: expected 'JobWorkerPool'"),
        ("metadata.name", "p" * 39, "metadata.name: at most 38 characters"),
    ],
)
def test_invalid_fields_are_reported_with_their_path(path: str, value: Any, expected: str) -> None:
    assert error_of(_set(TWO_LANES, path, value)).startswith(expected)


def test_the_pools_own_status_never_makes_it_invalid() -> None:
    # as the API server stores what the operator wrote: a schedule that never ran has no
    # last run (`nullable` in the CRD), a lane not scaling down no time it began to
    document = pool()
    document["status"] = {
        "lanes": [{"name": "default", "scaleDownSince": None}],
        "schedules": [{"name": "nightly", "kind": "reindex", "expression": "30 2 * * *",
                       "lastRunTime": None, "nextRunTime": "2026-12-08T02:30:00Z",
                       "missedTicks": 0, "lastError": None}],
    }
    assert load_pool(document).name == "p"


def test_unknown_fields_are_rejected_like_the_api_server_prunes_them() -> None:
    # the CRD is structural: an unknown field is an error here rather than silently dropped
    schema_text = json.dumps(poolspec.crd_document())
    assert '"additionalProperties": false' not in schema_text  # so the check is ours
    assert "Additional properties" in error_of(_set(TWO_LANES, "spec.lanes.0.kind", "x"))


# -- the CRD's CEL rules, checked in Python ------------------------------------------------


CEL_CASES = {
    "self.minReplicas <= self.maxReplicas": (
        pool({"name": "a", "minReplicas": 5, "maxReplicas": 2}),
        "spec.lanes[0].maxReplicas: must be >= minReplicas (5), got 2",
    ),
    "size(self.metadata.name) <= 38": (
        _set(pool(), "metadata.name", "n" * 40), "metadata.name: at most 38 characters",
    ),
    "self.all(e, !(e.name in ['JOBPOOL_DSN', 'JOBPOOL_RATE_LIMITS', 'JOBPOOL_METRICS_PORT', "
    "'JOBPOOL_SCHEDULES', 'JOBPOOL_SLOTS', 'JOBPOOL_GRACE', 'JOBPOOL_POOL', 'JOBPOOL_LANE', "
    "'JOBPOOL_POOL_NAMESPACE', 'POD_NAMESPACE', 'POD_SERVICE_ACCOUNT']))": (
        pool(worker={"env": [{"name": "A", "value": "1"}, {"name": "JOBPOOL_DSN", "value": "x"}]}),
        "spec.worker.env[1].name: JOBPOOL_DSN is set by the operator",
    ),
    "!has(self.kinds) || self.kinds.all(k, has(self.providers) "
    "&& self.kinds[k] in self.providers)": (
        pool({"name": "a", "rateLimits": {"providers": {"smtp": {"rps": 1}},
                                          "kinds": {"email_send": "sms"}}}),
        "spec.lanes[0].rateLimits.kinds.email_send: provider 'sms' is not declared",
    ),
    "has(self.cron) != has(self.every)": (
        pool(schedules=[{"name": "a", "kind": "reindex"}]),
        "spec.schedules[0]: give exactly one of cron and every",
    ),
    "!has(self.timeZone) || has(self.cron)": (
        pool(schedules=[{"name": "a", "kind": "reindex", "every": 5, "timeZone": "UTC"}]),
        "spec.schedules[0].timeZone: only a cron schedule has a time zone",
    ),
}


def _cel_rules(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        found += [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]
        for value in node.values():
            found += _cel_rules(value)
    elif isinstance(node, list):
        for value in node:
            found += _cel_rules(value)
    return found


def test_every_cel_rule_of_the_crd_has_a_python_check() -> None:
    assert set(_cel_rules(poolspec.crd_document())) == set(CEL_CASES)


@pytest.mark.parametrize("rule", sorted(CEL_CASES))
def test_cel_rule_equivalent(rule: str) -> None:
    document, expected = CEL_CASES[rule]
    assert error_of(document).startswith(expected)


def test_min_above_the_default_max_is_rejected() -> None:
    assert error_of(pool({"name": "a", "minReplicas": 20})).startswith(
        "spec.lanes[0].maxReplicas: must be >= minReplicas (20), got 10"
    )


def test_heavy_lane_bounds_are_checked() -> None:
    assert error_of(pool(heavyLane={"minReplicas": 3, "maxReplicas": 2})).startswith(
        "spec.heavyLane.maxReplicas: must be >= minReplicas (3)"
    )


def test_duplicate_lane_names_are_rejected() -> None:
    assert error_of(pool({"name": "a"}, {"name": "a", "kinds": ["reindex"]})).startswith(
        "spec.lanes[1].name: duplicate lane name 'a' (also spec.lanes[0])"
    )


# -- defaults: Python and the CRD agree ----------------------------------------------------


def _lane_schema() -> dict[str, Any]:
    root = poolspec.crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(root["properties"]["spec"]["properties"]["lanes"]["items"]["properties"])


def test_python_defaults_match_crd_defaults() -> None:
    lane = _lane_schema()
    auto = lane["autoscaling"]["properties"]
    assert lane["workersPerPod"]["default"] == poolspec.DEFAULT_WORKERS_PER_POD
    assert lane["minReplicas"]["default"] == poolspec.DEFAULT_MIN_REPLICAS
    assert lane["maxReplicas"]["default"] == poolspec.DEFAULT_MAX_REPLICAS
    assert auto["mode"]["default"] == poolspec.Autoscaling().mode
    assert auto["targetUtilization"]["default"] == poolspec.DEFAULT_TARGET_UTILIZATION
    stabilization = auto["scaleDownStabilizationSeconds"]["default"]
    assert stabilization == poolspec.DEFAULT_STABILIZATION_SECONDS
    assert auto["scaleDownMaxStep"]["default"] == poolspec.DEFAULT_SCALE_DOWN_MAX_STEP
    spec = poolspec.crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]
    heavy = spec["heavyLane"]["properties"]
    assert heavy["workersPerPod"]["default"] == poolspec.DEFAULT_HEAVY_WORKERS_PER_POD
    assert heavy["minReplicas"]["default"] == poolspec.DEFAULT_HEAVY_MIN_REPLICAS
    assert heavy["maxReplicas"]["default"] == poolspec.DEFAULT_HEAVY_MAX_REPLICAS
    assert spec["worker"]["properties"]["graceSeconds"]["default"] == poolspec.DEFAULT_GRACE_SECONDS
    assert spec["worker"]["properties"]["metricsPort"]["default"] == poolspec.DEFAULT_METRICS_PORT
    assert spec["database"]["properties"]["key"]["default"] == poolspec.DEFAULT_SECRET_KEY


def test_defaults_apply_when_fields_are_left_out() -> None:
    lane = load_pool(pool({"name": "a"})).lane("a")
    assert (lane.workers_per_pod, lane.min_replicas, lane.max_replicas) == (4, 1, 10)
    assert lane.autoscaling == poolspec.Autoscaling("operator", 1.0, 300.0, 1)


# -- worker command and rate limits --------------------------------------------------------


def test_a_lane_gives_its_workers_typed_values() -> None:
    """The plan names settings and values, never a flag: the command line is the runner's."""
    spec = load_pool(pool(
        {"name": "default", "workersPerPod": 3},
        {"name": "t", "kinds": ["email_send", "reindex"], "tenants": ["acme", "beta"]},
        worker={"graceSeconds": 45, "imports": ["mdm.kinds"]},
    ))
    run = spec.worker_run(spec.lane("default"), imports=("extra", "mdm.kinds"))
    assert run.settings == {"slots": 3, "grace": 45.0, "pool": "p", "pool_namespace": "ns",
                            "lane": "default", "schedules": "[]"}  # none: retire old ones
    assert (run.kinds, run.exclude_kinds) == (None, ("gin_backfill", "index_sync"))
    assert run.imports == ("mdm.kinds", "extra")
    tenant_lane = spec.worker_run(spec.lane("t"))
    assert (tenant_lane.kinds, tenant_lane.tenants) == (("email_send", "reindex"), ("acme", "beta"))


def test_worker_args_use_the_worker_cli_flags() -> None:
    spec = load_pool(pool(
        {"name": "default", "workersPerPod": 3},
        {"name": "t", "kinds": ["email_send", "reindex"], "tenants": ["acme", "beta"]},
        worker={"graceSeconds": 45, "imports": ["mdm.kinds"]},
    ))
    args, env = worker_command(spec.worker_run(spec.lane("default")))
    assert args == [
        "run", "--slots", "3", "--grace", "45", "--exclude-kinds", "gin_backfill,index_sync",
        "--import", "mdm.kinds",
    ]
    assert env == {"JOBPOOL_POOL": "p", "JOBPOOL_POOL_NAMESPACE": "ns", "JOBPOOL_LANE": "default",
                   "JOBPOOL_SCHEDULES": "[]"}
    assert worker_command(spec.worker_run(spec.lane("t")))[0] == [
        "run", "--slots", "4", "--grace", "45", "--kinds", "email_send,reindex",
        "--tenants", "acme,beta", "--import", "mdm.kinds",
    ]


def test_rate_limits_json_has_the_agreed_shape() -> None:
    spec = load_pool(pool({"name": "a", "rateLimits": {
        "providers": {"smtp": {"rps": 2.5}, "webhook": {"rps": 10, "burst": 30}},
        "kinds": {"email_send": "smtp", "outbox_dispatch": "webhook"},
    }}))
    limits = spec.lane("a").rate_limits
    assert limits is not None
    assert json.loads(limits.to_json()) == {
        "providers": {"smtp": {"rps": 2.5, "burst": 3}, "webhook": {"rps": 10.0, "burst": 30}},
        "kinds": {"email_send": "smtp", "outbox_dispatch": "webhook"},
    }


# -- files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [" ", "mdm/mdm-jobs", "Mdm Jobs!", "-jobs", "jobs."])
def test_a_pool_name_is_one_its_deployments_can_carry(name: str) -> None:
    """"mdm/mdm-jobs" was taken: its schedules' owner was that of pool mdm-jobs in namespace
    mdm."""
    with pytest.raises(PoolSpecError, match=r"^metadata\.name: .* is not a pool name"):
        load_pool({**pool({"name": "default"}), "metadata": {"name": name}})


def test_a_missing_example_names_the_copy_the_package_ships(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`jobpool run examples/pool.yaml` outside the repository said only "No such file"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PoolSpecError) as missing:
        load_pool_file("examples/pool.yaml")
    shipped = SHIPPED_EXAMPLES / "pool.yaml"
    assert shipped.is_file()
    assert f"the package ships this example as {shipped}" in str(missing.value)
    with pytest.raises(PoolSpecError) as other:
        load_pool_file("examples/no-such-pool.yaml")
    assert "ships" not in str(other.value)


def test_pool_file_problems_are_pool_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(PoolSpecError, match="cannot read the pool file"):
        load_pool_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(PoolSpecError, match="not valid YAML"):
        load_pool_file(bad)
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(pool()) + "---\n" + yaml.safe_dump(pool()))
    with pytest.raises(PoolSpecError, match="exactly one JobWorkerPool document, found 2"):
        load_pool_file(two)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(PoolSpecError, match="must be a mapping"):
        load_pool_file(scalar)
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump(pool({"name": "a", "maxReplicas": "x"})))
    with pytest.raises(PoolSpecError,  # the file first, as `jobpool run pool.yaml` shows it
                       match=rf"^{re.escape(str(invalid))}: spec\.lanes\[0\]\.maxReplicas: "):
        load_pool_file(invalid)


def test_pool_spec_error_is_a_value_error() -> None:
    assert issubclass(PoolSpecError, ValueError)


# -- numbers out of range and YAML that costs too much --------------------------------------


RPS_RANGE = "must be a number of tokens per second from 0.00001 to 100000"


@pytest.mark.parametrize(("providers", "expected"), [
    ("{a: {rps: .inf, burst: 5}}", "spec.lanes[0].rateLimits.providers.a.rps: inf is not a finite"),
    ("{a: {rps: .nan}}", "spec.lanes[0].rateLimits.providers.a.rps: nan is not a finite"),
    ("{a: {rps: 1000000}}", "spec.lanes[0].rateLimits.providers.a.rps: 1000000 is greater than"),
    ("{a: {rps: 0.000001}}", "spec.lanes[0].rateLimits.providers.a.rps: 1e-06 is less than"),
    ("{a: {rps: 1, burst: 1000000}}", "spec.lanes[0].rateLimits.providers.a.burst: 1000000 is"),
    ("{a: {rps: 1, burst: true}}", "spec.lanes[0].rateLimits.providers.a.burst: True is not of"),
    ("{a: {rps: '5'}}", "spec.lanes[0].rateLimits.providers.a.rps: '5' is not of type"),
])
def test_pool_file_rate_limits_out_of_range_name_the_field(tmp_path: Path, providers: str,
                                                           expected: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool({"name": "a"})).replace(
        "- name: a", f"- name: a\n    rateLimits: {{providers: {providers}}}"))
    with pytest.raises(PoolSpecError) as caught:
        load_pool_file(path)
    assert str(caught.value).startswith(f"{path}: {expected}")


def test_a_provider_cap_bound_is_checked_without_the_schema_too() -> None:
    """The operator's documents come from the API server; the same rule applies to them."""
    lanes = pool({"name": "a", "rateLimits": {"providers": {"a": {"rps": 10**400}}}})
    assert error_of(lanes).startswith("spec.lanes[0].rateLimits.providers.a.rps: ")
    assert error_of(pool({"name": "a", "autoscaling": {"targetUtilization": float("nan")}})) \
        == "spec.lanes[0].autoscaling.targetUtilization: nan is not a finite number"


def test_python_bounds_match_crd_bounds() -> None:
    from jobpool.core.ratelimit import MAX_BURST, MAX_RPS, MIN_RPS

    limit = _lane_schema()["rateLimits"]["properties"]["providers"]["additionalProperties"]
    rps, burst = limit["properties"]["rps"], limit["properties"]["burst"]
    assert (rps["minimum"], rps["maximum"]) == (MIN_RPS, MAX_RPS)
    assert (burst["minimum"], burst["maximum"]) == (1, MAX_BURST)


LAUGHS = """\
apiVersion: jobs.mdm.io/v1alpha1
kind: JobWorkerPool
metadata: {name: p}
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
spec: {image: x, database: {secretName: db}, lanes: [{name: a, kinds: *i}]}
"""


@pytest.mark.parametrize(("text", "message"), [
    (LAUGHS, "more than 20000 values once aliases are expanded (line 8)"),
    ("spec: " + "[" * 100_000 + "]" * 100_000, "nested deeper than 32 levels"),
    ("spec: &s {lanes: [*s]}", "an alias refers to a node that contains it"),
    ("spec: {image: " + "9" * 5000 + "}", "not a usable YAML value"),
    ("# padding\n" * 120_000, "larger than 1048576 bytes, not a pool file"),
])
def test_yaml_that_would_cost_too_much_is_refused(tmp_path: Path, text: str,
                                                  message: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(PoolSpecError) as caught:
        load_pool_file(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_anchors_within_bounds_still_work(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(
        "apiVersion: jobs.mdm.io/v1alpha1\nkind: JobWorkerPool\nmetadata: {name: p}\n"
        "spec:\n  image: x\n  database: {secretName: db}\n"
        "  heavyLane: {autoscaling: &auto {mode: none}}\n"
        "  lanes:\n  - {name: a, autoscaling: *auto}\n"
        "  - {name: b, kinds: [reindex], autoscaling: *auto}\n")
    spec = load_pool_file(path)
    assert {lane.autoscaling.mode for lane in spec.lanes} == {"none"}


def test_tenant_ids_are_taken_in_any_case_and_kept_in_lower_case() -> None:
    upper = "7C4B5BD2-3F0E-4C43-9D0F-4F8A4A3F8E01"
    spec = load_pool(pool({"name": "a"}, {"name": "t", "kinds": ["reindex"],
                                          "tenants": [upper, "acme", upper.lower()]}))
    assert spec.lane("t").tenants == (upper.lower(), "acme")
    clash = pool({"name": "a"}, {"name": "t", "kinds": ["reindex"], "tenants": [upper]},
                 {"name": "u", "kinds": ["reindex"], "tenants": [upper.lower()]})
    assert "reindex claimed by lanes 't' and 'u'" in error_of(clash)


@pytest.mark.parametrize(("text", "key", "line"), [
    ("spec:\n  image: a\n  image: b\n", "image", 3),
    ("spec:\n  lanes:\n    - name: x\n      minReplicas: 1\n      minReplicas: 1000\n",
     "minReplicas", 5),
])
def test_a_pool_file_with_a_key_written_twice_is_refused_naming_it(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    """PyYAML would keep the later value silently: which one the author meant is unknown."""
    path = tmp_path / "dup.yaml"
    path.write_text("apiVersion: jobs.mdm.io/v1alpha1\nkind: JobWorkerPool\n" + text)
    with pytest.raises(PoolSpecError, match=f"duplicate key '{key}' \\(line {line + 2}\\)"):
        load_pool_file(path)


def test_keys_merged_in_with_an_alias_may_be_overridden() -> None:
    from jobpool.core.yamlfile import load_documents
    assert load_documents("base: &b {rps: 1, burst: 2}\nmine: {<<: *b, rps: 5}\n") == [
        {"base": {"rps": 1, "burst": 2}, "mine": {"rps": 5, "burst": 2}}]


# -- kinds a lane names must exist -------------------------------------------------------


def test_every_lanes_unknown_kinds_are_refused_naming_lane_kind_and_likely_name() -> None:
    spec = load_pool(pool({"name": "mail", "kinds": ["email_sned", "email_send"]},
                          {"name": "odd", "kinds": ["zzz"]}, {"name": "rest"}))
    with pytest.raises(PoolSpecError) as caught:
        poolspec.check_lane_kinds(spec, BUILTIN_KINDS)
    message = str(caught.value)
    assert message.startswith(
        "spec.lanes[0].kinds (lane 'mail'): unknown job kind(s) 'email_sned' (did you mean "
        "'email_send'?); spec.lanes[1].kinds (lane 'odd'): unknown job kind(s) 'zzz'; "
        "registered kinds are ")
    assert ", ".join(sorted(BUILTIN_KINDS)) in message


def test_a_rate_limited_kind_that_is_not_registered_is_refused() -> None:
    """`kinds: {email_sned: smtp}` capped nothing: email_send ran past the provider's cap."""
    spec = load_pool(pool({"name": "mail", "rateLimits": {
        "providers": {"smtp": {"rps": 5, "burst": 5}}, "kinds": {"email_sned": "smtp"}}}))
    with pytest.raises(PoolSpecError, match=re.escape(
            "spec.lanes[0].rateLimits.kinds (lane 'mail'): unknown job kind(s) 'email_sned' "
            "(did you mean 'email_send'?)")):
        poolspec.check_lane_kinds(spec, BUILTIN_KINDS)


def test_lanes_of_registered_kinds_and_catch_alls_pass() -> None:
    spec = load_pool_file(EXAMPLE)
    poolspec.check_lane_kinds(spec, BUILTIN_KINDS)  # raises nothing
    with pytest.raises(PoolSpecError, match="'bulk_import'"):
        poolspec.check_lane_kinds(spec, BUILTIN_KINDS - {"bulk_import"})


def test_schedules_reach_every_lane_as_jobpool_schedules() -> None:
    nightly = {"name": "nightly", "kind": "reindex", "tenant": "acme", "cron": "0 3 * * *",
               "timeZone": "Europe/Berlin", "payload": {"index": "docs"}}
    spec = load_pool(pool({"name": "a"}, schedules=[nightly]))
    assert [s.name for s in spec.schedules] == ["nightly"]
    for lane in spec.lanes:
        assert json.loads(spec.worker_run(lane).settings["schedules"]) == [
            {**nightly, "missed": "catch_up_once"}]
    assert load_pool(pool({"name": "a"})).worker_run(spec.lanes[0]).settings["schedules"] == "[]"


@pytest.mark.parametrize(("schedule", "expected"), [
    ({"name": "a", "kind": "reindex", "cron": "0 3 * * * * *"}, "spec.schedules[0].cron: "),
    ({"name": "a", "kind": "reindex", "cron": "0 3 * * *", "timeZone": "Europe/Berln"},
     "spec.schedules[0].timeZone: unknown time zone"),
    ({"name": "a", "kind": "reindex", "every": 0}, "spec.schedules[0].every: "),
    ({"name": "a", "kind": "reindex", "every": 5, "missed": "twice"}, "spec.schedules[0].missed"),
    ({"name": "A", "kind": "reindex", "every": 5}, "spec.schedules[0].name: "),
])
def test_a_bad_schedule_names_its_field(schedule: dict[str, Any], expected: str) -> None:
    assert error_of(pool({"name": "a"}, schedules=[schedule])).startswith(expected)


def test_jobpool_schedules_is_the_operators_to_set() -> None:
    env = {"env": [{"name": "JOBPOOL_SCHEDULES", "value": "[]"}]}
    assert error_of(pool({"name": "a"}, worker=env)).startswith("spec.worker.env[0].name: ")


@pytest.mark.parametrize("name", ["JOBPOOL_SLOTS", "JOBPOOL_GRACE", "JOBPOOL_POOL",
                                  "JOBPOOL_LANE", "JOBPOOL_POOL_NAMESPACE", "POD_NAMESPACE",
                                  "POD_SERVICE_ACCOUNT"])
def test_a_variable_the_operator_sets_is_not_set_again_in_env(name: str) -> None:
    """The operator's flag would override JOBPOOL_SLOTS and JOBPOOL_GRACE unseen; the pool's
    and lane's names would be overridden, and pods under another pool's name retire that
    pool's schedules; the downward API's two names would be in the container twice, which
    server-side apply refuses for every later change of the lane."""
    env = {"env": [{"name": name, "value": "x"}]}
    assert error_of(pool({"name": "a"}, worker=env)) == (
        f"spec.worker.env[0].name: {name} is set by the operator")


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("JOBPOOL_STOP_GRACE", "abc", "JOBPOOL_STOP_GRACE must be from 0.1 to 3600 seconds, got abc"),
    ("JOBPOOL_PREFETCH", "-1", "JOBPOOL_PREFETCH must be"),
    ("JOBPOOL_LOG_LEVEL", "loud", "JOBPOOL_LOG_LEVEL "),
])
def test_a_setting_in_env_is_checked_as_the_workers_check_it(
        name: str, value: str, expected: str) -> None:
    """Every pod of the pool would exit at its start with the value: the pool is refused,
    naming the entry."""
    env = {"env": [{"name": "A", "value": "1"}, {"name": name, "value": value}]}
    message = error_of(pool({"name": "a"}, worker=env))
    assert message.startswith(f"spec.worker.env[1].value: {expected}"), message


@pytest.mark.parametrize("name", ["SOME_TOKEN", "JOBPOOL_SMTP_FROM"])
def test_a_nul_in_an_env_value_is_refused_naming_the_entry(name: str) -> None:
    """No environment variable holds a NUL: the lane's start would fail on it, naming no
    field."""
    env = {"env": [{"name": "A", "value": "1"}, {"name": name, "value": "a\x00b"}]}
    assert error_of(pool({"name": "a"}, worker=env)) == (
        "spec.worker.env[1].value: contains a NUL character (\\x00), which no environment "
        "variable can hold")


def test_a_variable_given_twice_in_env_is_refused_as_the_api_server_would() -> None:
    env = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"},
                   {"name": "A", "value": "3"}]}
    assert error_of(pool({"name": "a"}, worker=env)) == (
        "spec.worker.env[2].name: A is given twice (also spec.worker.env[0])")


def test_an_unknown_jobpool_variable_in_env_is_a_warning_with_the_setting_meant() -> None:
    """A misspelt setting sets nothing; a warning, not a refusal: an image newer than the
    operator may know a setting it does not."""
    env = {"env": [{"name": "JOBPOOL_STOP_GRCE", "value": "40"},
                   {"name": "JOBPOOL_FUTURE_KNOB", "value": "1"}, {"name": "OTHER", "value": "1"},
                   {"name": "JOBPOOL_SCALE_INTERVAL", "value": "5"},
                   {"name": "JOBPOOL_LOG_LEVEL", "value": "debug"}]}
    spec = load_pool(pool({"name": "a"}, worker=env))
    assert [(w.reason, w.message) for w in spec.warnings] == [
        ("UnknownSetting", "spec.worker.env[0].name: JOBPOOL_STOP_GRCE is no jobpool setting "
                           "(did you mean JOBPOOL_STOP_GRACE?); it sets nothing"),
        ("UnknownSetting", "spec.worker.env[1].name: JOBPOOL_FUTURE_KNOB is no jobpool setting; "
                           "it sets nothing"),
        ("UnknownSetting", "spec.worker.env[3].name: JOBPOOL_SCALE_INTERVAL is a setting of the "
                           "operator only; it sets nothing for a worker"),
    ]


def test_the_stop_grace_comes_from_env_or_its_default() -> None:
    env = {"env": [{"name": "JOBPOOL_STOP_GRACE", "value": "42.5"}]}
    assert load_pool(pool({"name": "a"}, worker=env)).stop_grace_seconds == 42.5
    assert load_pool(pool({"name": "a"})).stop_grace_seconds == default_of("stop_grace")


@pytest.mark.parametrize("field", ["kinds", "tenants"])
def test_a_value_given_twice_in_a_set_is_refused_as_the_api_server_would(field: str) -> None:
    """The CRD declares `kinds` and `tenants` sets: `kubectl apply` refuses a duplicate, so a
    local run of the same file must too."""
    message = error_of(pool({"name": "a", field: ["acme", "acme"]}))
    assert message.startswith(f"spec.lanes[0].{field}: ") and "non-unique" in message, message
