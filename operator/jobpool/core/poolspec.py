"""The JobWorkerPool document: validation against the CRD schema, and the lane plan.

One document describes a pool for both runners: the Kubernetes operator (one Deployment per
lane) and `jobpool run pool.yaml` (local worker processes per lane).
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.resources
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast

import jsonschema
import yaml

from jobpool.core.crd import API_VERSION, CRD_FILE, KIND
from jobpool.core.jsondata import expect_text
from jobpool.core.kinds import BUILTIN_KINDS, HEAVY_KINDS
from jobpool.core.ratelimit import ProviderCaps, parse_provider_caps
from jobpool.core.schedules import Schedule, ScheduleError, parse_schedules
from jobpool.core.suggestions import close_names
from jobpool.core.tenants import tenant_ref
from jobpool.core.worker_run import WorkerRun
from jobpool.core.yamlfile import MAX_CHARS, load_documents
from jobpool.errors import JobpoolError
from jobpool.settings import (
    PREFIX,
    Settings,
    default_of,
    setting_of,
    setting_of_pool_field,
    variable,
)

HEAVY_LANE = "heavy"
"""Name of the implicit lane that serves heavy kinds no lane lists."""

MAX_POOL_NAME = 38
MAX_DEPLOYMENT_NAME = 63
RESERVED_ENV = frozenset(variable(name) for name in (
    "dsn", "rate_limits", "metrics_port", "schedules", "slots", "grace", "pool", "lane",
    "pool_namespace")) | {"POD_NAMESPACE", "POD_SERVICE_ACCOUNT"}
"""The variables `spec.worker.env` may not set: the pods get them from other fields (the
Secret, `rateLimits`, `metricsPort`, `schedules`, `workersPerPod`, `graceSeconds`, the pool's
and lane's names and namespace, the downward API for the audit actor). Set there, a flag of
the operator's would override them unseen, they would override the pool's own identity (a
pod under another pool's name would retire that pool's schedules), or the container would
hold one name twice, which server-side apply refuses."""

# Defaults; the CRD declares the same values (a test keeps them equal). A lane's workers get
# the settings' defaults, so a pool file's fields default to them.
DEFAULT_WORKERS_PER_POD: int = default_of("slots")
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 10
DEFAULT_HEAVY_WORKERS_PER_POD = 1
DEFAULT_HEAVY_MIN_REPLICAS = 0
DEFAULT_HEAVY_MAX_REPLICAS = 1
DEFAULT_TARGET_UTILIZATION = 1.0
DEFAULT_STABILIZATION_SECONDS = 300
DEFAULT_SCALE_DOWN_MAX_STEP = 1
DEFAULT_GRACE_SECONDS = int(default_of("grace"))
DEFAULT_METRICS_PORT: int = default_of("metrics_port")
DEFAULT_SECRET_KEY = "dsn"
DEFAULT_PULL_POLICY = "IfNotPresent"

ScalingMode = Literal["operator", "keda", "none"]
JsonPath = tuple[str | int, ...]


class PoolSpecError(JobpoolError, ValueError):
    """A JobWorkerPool document that cannot run; the message starts with the bad field's path."""


@dataclass(frozen=True)
class Problem:
    """A problem of a pool to report. reason: one CamelCase word (an Event's and a
    condition's reason: `UnservedKinds`, `ReconcileFailed`); message: one line. A pool's
    `warnings` are problems that do not stop it."""

    reason: str
    message: str


@dataclass(frozen=True)
class Autoscaling:
    """How a lane's replicas follow its job count.

    mode: `operator` (the operator scales), `keda` (a KEDA ScaledObject scales), `none`
    (fixed at min_replicas). target_utilization: share of slots ready+running jobs should
    fill, in [0.01, 1]. scale_down_stabilization: seconds demand must stay lower before a
    scale-down. scale_down_max_step: replicas removed at most per scaling period.
    """

    mode: ScalingMode = "operator"
    target_utilization: float = DEFAULT_TARGET_UTILIZATION
    scale_down_stabilization: float = DEFAULT_STABILIZATION_SECONDS
    scale_down_max_step: int = DEFAULT_SCALE_DOWN_MAX_STEP


@dataclass(frozen=True)
class Lane:
    """One group of identical workers: which jobs they claim and how many pods run them.

    kinds: the kinds served, or None for the catch-all lane (every kind no other lane lists).
    exclude_kinds: for the catch-all lane, the kinds other lanes serve (always incl. heavy
    kinds); () otherwise. tenants: tenant keys or ids (lower-case); () means all tenants.
    implicit: True for the heavy lane the plan adds by itself.
    """

    name: str
    kinds: tuple[str, ...] | None
    exclude_kinds: tuple[str, ...]
    tenants: tuple[str, ...]
    workers_per_pod: int
    min_replicas: int
    max_replicas: int
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    resources: Mapping[str, Any] = field(default_factory=dict)
    rate_limits: ProviderCaps | None = None
    implicit: bool = False

    def serves(self, kind: str, tenant: str | None = None) -> bool:
        """Whether a worker of this lane claims jobs of `kind` (for `tenant`, if given)."""
        kind_ok = kind not in self.exclude_kinds if self.kinds is None else kind in self.kinds
        tenant_ok = not self.tenants or tenant is None or tenant in self.tenants
        return kind_ok and tenant_ok



@dataclass(frozen=True)
class SecretRef:
    """The Secret (in the pool's namespace) and key that hold the DSN."""

    name: str
    key: str = DEFAULT_SECRET_KEY


@dataclass(frozen=True)
class PoolSpec:
    """A validated pool and its lane plan.

    lanes: the declared lanes in order, then the implicit heavy lane if one was added.
    stop_grace_seconds: the workers' stop grace, from `JOBPOOL_STOP_GRACE` in
    `spec.worker.env` or its default (the pods' termination grace period includes it).
    warnings: problems that do not stop the pool (e.g. a built-in kind no lane serves).
    """

    name: str
    namespace: str | None
    image: str
    dsn_secret: SecretRef
    lanes: tuple[Lane, ...]
    image_pull_policy: str = DEFAULT_PULL_POLICY
    image_pull_secrets: tuple[str, ...] = ()
    service_account_name: str | None = None
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    stop_grace_seconds: float = default_of("stop_grace")
    metrics_port: int = DEFAULT_METRICS_PORT
    imports: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    schedules: tuple[Schedule, ...] = ()
    warnings: tuple[Problem, ...] = ()

    def lane(self, name: str) -> Lane:
        """The lane called `name`; KeyError if there is none."""
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)

    def worker_run(self, lane: Lane, imports: Sequence[str] = ()) -> WorkerRun:
        """What a worker of `lane` is given, on Kubernetes and in a local run alike: the
        lane's kinds and tenants, the pool's imports (then `imports`, each once), the settings
        its fields set (slots, grace, pool and lane names, the pool's namespace if it has one
        (with the name, the owner of its schedules), the lane's provider caps if it has
        `rateLimits`, the pool's schedules: also when there are none, so that the workers retire
        those the pool declared before), then `spec.worker.env`. Its DSN and metrics port come
        from its runner."""
        settings: dict[str, Any] = {
            "slots": lane.workers_per_pod, "grace": float(self.grace_seconds),
            "pool": self.name, "lane": lane.name,
        }
        if self.namespace:
            settings["pool_namespace"] = self.namespace
        if lane.rate_limits is not None:
            settings["rate_limits"] = lane.rate_limits.to_json()
        settings["schedules"] = schedules_json(self.schedules)
        return WorkerRun(
            kinds=lane.kinds, exclude_kinds=lane.exclude_kinds, tenants=lane.tenants,
            imports=tuple(dict.fromkeys((*self.imports, *imports))), settings=settings,
            env=self.env)


@functools.cache
def crd_document() -> Mapping[str, Any]:
    """The JobWorkerPool CRD shipped with the package."""
    text = (importlib.resources.files("jobpool") / "crds" / CRD_FILE).read_text("utf-8")
    return cast("Mapping[str, Any]", yaml.safe_load(text))


@functools.cache
def _validator() -> jsonschema.Draft4Validator:
    """The CRD's schema for what a person writes: the spec, closed (`_closed`). Not the
    status: the operator writes it, the API server checks it, and its OpenAPI `nullable`
    fields (a schedule that never ran has no last run) are no JSON Schema a validator of
    draft 4 knows, so a pool's own status would make it invalid."""
    schema = copy.deepcopy(crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    del schema["properties"]["status"]
    schema["properties"]["spec"] = _closed(schema["properties"]["spec"])
    return jsonschema.Draft4Validator(schema)


def _closed(schema: Any) -> Any:
    """The schema with unknown fields rejected (the API server would prune them silently;
    `kubectl apply` rejects them, and so does `jobpool run`), and a value given twice in a
    list the CRD declares a set (`x-kubernetes-list-type: set`: `kinds`, `tenants`), which
    the API server refuses and JSON Schema does not know."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and not schema.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        closed["additionalProperties"] = False
    if schema.get("x-kubernetes-list-type") == "set":
        closed["uniqueItems"] = True
    return closed


SHIPPED_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
"""The example pool files installed with the package (the repository's examples/)."""


def _shipped_hint(path: Path) -> str:
    """For a missing `examples/NAME` (the README's commands, run outside the repository):
    where the installed package has that file; else ""."""
    if path.is_absolute() or path.parent != Path("examples"):
        return ""
    shipped = SHIPPED_EXAMPLES / path.name
    if not shipped.is_file():
        return ""
    return f" (run from {Path.cwd()}; the package ships this example as {shipped})"


def load_pool_file(path: str | Path) -> PoolSpec:
    """Read a YAML file holding one JobWorkerPool and return its plan.

    Raises PoolSpecError for an unreadable file, invalid YAML, YAML beyond the bounds of
    `jobpool.core.yamlfile` (size, nesting, alias expansion), or an invalid pool, each
    message beginning with the file's path (`pool.yaml: spec.lanes[0]...`).
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CHARS + 1)
        if len(data) > MAX_CHARS:
            raise PoolSpecError(f"{path}: larger than {MAX_CHARS} bytes, not a pool file")
        text = data.decode("utf-8")
    except FileNotFoundError as exc:
        raise PoolSpecError(f"{path}: cannot read the pool file: {exc}"
                            f"{_shipped_hint(path)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolSpecError(f"{path}: cannot read the pool file: {exc}") from exc
    try:
        documents = [doc for doc in load_documents(text) if doc is not None]
    except ValueError as exc:
        raise PoolSpecError(f"{path}: {exc}") from exc
    if len(documents) != 1:
        raise PoolSpecError(
            f"{path}: expected exactly one JobWorkerPool document, found {len(documents)}"
        )
    document = documents[0]
    if not isinstance(document, Mapping):
        raise PoolSpecError(
            f"{path}: the document must be a mapping, not {type(document).__name__}"
        )
    try:
        return load_pool(document)
    except PoolSpecError as exc:  # the field's path, after the file's
        raise PoolSpecError(f"{path}: {exc}") from None


def load_pool(document: Mapping[str, Any]) -> PoolSpec:
    """Validate a JobWorkerPool document (as parsed from YAML or read from the API) and plan it.

    Checks, in order: that every number is finite (the schema's bounds do not catch nan),
    the CRD's OpenAPI schema, the rules the CRD states in CEL, then the lane plan (duplicate
    lanes, a kind two lanes claim for the same tenant, Deployment name lengths). Raises
    PoolSpecError naming the path of the first bad field, e.g. `spec.lanes[1].maxReplicas: ...`.
    """
    document = _plain(document)
    _check_finite(document)
    _check_schema(document)
    metadata = document.get("metadata") or {}
    name = metadata.get("name")
    if name is not None and not isinstance(name, str):
        raise PoolSpecError(f"metadata.name must be a string, got {name!r:.80} "
                            f"({type(name).__name__}){_setting_named('metadata.name')}")
    if not name:
        raise PoolSpecError(f"metadata.name: a pool needs a name{_setting_named('metadata.name')}")
    if len(name) > MAX_POOL_NAME:
        raise PoolSpecError(f"metadata.name: at most {MAX_POOL_NAME} characters, got "
                            f"{len(name)}{_setting_named('metadata.name')}")
    if not POOL_NAME_PATTERN.fullmatch(name):  # it names the Deployments and owns schedules
        raise PoolSpecError(f"metadata.name: {name!r:.80} is not a pool name (lower-case "
                            "letters, digits, '-' and '.', each part starting and ending with "
                            "a letter or digit: it names the pool's Deployments, and its "
                            "schedules' owner is <namespace>/<name>)"
                            f"{_setting_named('metadata.name')}")
    namespace = _namespace(metadata.get("namespace"))
    spec = document["spec"]
    worker = spec.get("worker") or {}
    env = tuple((item["name"], item["value"]) for item in worker.get("env") or ())
    settings, env_warnings = _env_settings(env)
    declared = tuple(
        _declared_lane(raw, f"spec.lanes[{index}]") for index, raw in enumerate(spec["lanes"])
    )
    lanes = plan_lanes(declared, _heavy_lane(spec.get("heavyLane") or {}))
    for index, lane in enumerate(lanes):
        deployment = f"{name}-{lane.name}"
        if len(deployment) > MAX_DEPLOYMENT_NAME:
            raise PoolSpecError(
                f"spec.lanes[{index}].name: Deployment name {deployment!r} is longer than "
                f"{MAX_DEPLOYMENT_NAME} characters"
            )
    database = spec["database"]
    return PoolSpec(
        name=name,
        namespace=namespace,
        image=spec["image"],
        dsn_secret=SecretRef(database["secretName"], database.get("key", DEFAULT_SECRET_KEY)),
        lanes=lanes,
        image_pull_policy=spec.get("imagePullPolicy", DEFAULT_PULL_POLICY),
        image_pull_secrets=tuple(item["name"] for item in spec.get("imagePullSecrets") or ()),
        service_account_name=spec.get("serviceAccountName"),
        grace_seconds=worker.get("graceSeconds", DEFAULT_GRACE_SECONDS),
        stop_grace_seconds=settings.stop_grace,
        metrics_port=worker.get("metricsPort", DEFAULT_METRICS_PORT),
        imports=tuple(worker.get("imports") or ()),
        env=env,
        pod_annotations=dict(worker.get("podAnnotations") or {}),
        node_selector=dict(worker.get("nodeSelector") or {}),
        schedules=_schedules(spec.get("schedules") or ()),
        warnings=unserved_kind_warnings(lanes, BUILTIN_KINDS) + env_warnings,
    )


SCOPE_NAMES = {"operator": "operator", "api": "admin API server"}
"""How a warning names the processes a setting that is no worker's applies to."""


def _env_settings(env: Sequence[tuple[str, str]]
                  ) -> tuple[Settings, tuple[Problem, ...]]:
    """The settings `spec.worker.env` gives the workers (`JOBPOOL_STOP_GRACE`, ...), read as
    a worker reads them, and warnings for the `JOBPOOL_` names that set nothing for a worker:
    no setting (misspelt, or one a newer image knows and this version does not), or a
    setting of the operator or the API server only.

    Raises PoolSpecError for a variable the operator sets (`RESERVED_ENV`) and for a value
    the workers would refuse at their start: every pod of the pool would exit with it."""
    scopes = {variable(item.name): setting_of(item).applies for item in fields(Settings)}
    known = set(scopes)
    # compared without the prefix they share, which alone makes any two names look alike
    suffixes = [name.removeprefix(PREFIX) for name in known]
    warnings = []
    first: dict[str, int] = {}
    for index, (env_name, value) in enumerate(env):
        if env_name in RESERVED_ENV:
            raise PoolSpecError(
                f"spec.worker.env[{index}].name: {env_name} is set by the operator"
            )
        if env_name in first:  # the CRD's list map refuses it too
            raise PoolSpecError(f"spec.worker.env[{index}].name: {env_name} is given twice "
                                f"(also spec.worker.env[{first[env_name]}])")
        first[env_name] = index
        if "\x00" in value:  # the process's start would fail on it, naming no field
            raise PoolSpecError(f"spec.worker.env[{index}].value: contains a NUL character "
                                "(\\x00), which no environment variable can hold")
        if env_name.startswith(PREFIX) and env_name not in known:
            nearest = close_names(env_name.removeprefix(PREFIX), suffixes, limit=1)
            hint = f" (did you mean {PREFIX}{nearest[0]}?)" if nearest else ""
            warnings.append(Problem(
                "UnknownSetting",
                f"spec.worker.env[{index}].name: {env_name} is no jobpool setting{hint}; it "
                "sets nothing"))
        elif env_name in known and not {"worker", "commands"} & set(scopes[env_name]):
            owners = " and the ".join(SCOPE_NAMES.get(scope, scope) for scope in scopes[env_name])
            warnings.append(Problem(
                "UnknownSetting",
                f"spec.worker.env[{index}].name: {env_name} is a setting of the {owners} "
                "only; it sets nothing for a worker"))
        try:
            Settings.from_env({env_name: value})
        except ValueError as exc:
            raise PoolSpecError(f"spec.worker.env[{index}].value: {exc}") from None
    return Settings.from_env(dict(env)), tuple(warnings)


POOL_NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""A Kubernetes object name (an RFC 1123 subdomain), as the API server takes a
JobWorkerPool's."""

NAMESPACE_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A Kubernetes namespace name (an RFC 1123 label)."""


def _namespace(value: Any) -> str | None:
    """`metadata.namespace`, if given: a namespace name (the API server sets it on every
    JobWorkerPool; a pool file may leave it out)."""
    if value is None:
        return None
    setting = _setting_named("metadata.namespace")
    if not isinstance(value, str):
        raise PoolSpecError(f"metadata.namespace must be a string, got {value!r:.80} "
                            f"({type(value).__name__}){setting}")
    if not NAMESPACE_PATTERN.fullmatch(value):
        raise PoolSpecError(f"metadata.namespace: {value!r:.80} is not a namespace name (1 to "
                            "63 lower-case letters, digits and '-', starting and ending with a "
                            f"letter or digit){setting}")
    return value


def schedules_json(schedules: Sequence[Schedule]) -> str:
    """The JOBPOOL_SCHEDULES value of `schedules`: compact JSON, in declaration order."""
    return json.dumps([schedule.to_json() for schedule in schedules], separators=(",", ":"),
                      sort_keys=True)


def _schedules(raw: Sequence[Any]) -> tuple[Schedule, ...]:
    try:
        return parse_schedules(raw, "spec.schedules")
    except ScheduleError as exc:
        raise PoolSpecError(str(exc)) from None


def plan_lanes(declared: Sequence[Lane], heavy: Lane) -> tuple[Lane, ...]:
    """Complete the declared lanes: add the heavy lane if needed, fill catch-all exclusions.

    `heavy` is the template of the implicit heavy lane (its kinds are replaced by the heavy
    kinds no all-tenant lane lists). Raises PoolSpecError for duplicate lane names or a kind
    claimed by two lanes for the same tenant.
    """
    _check_names(declared)
    listed_everywhere = {
        kind for lane in declared if lane.kinds is not None and not lane.tenants
        for kind in lane.kinds
    }
    lanes = list(declared)
    unplaced_heavy = tuple(sorted(HEAVY_KINDS - listed_everywhere))
    if unplaced_heavy:
        if any(lane.name == heavy.name for lane in declared):
            index = [lane.name for lane in declared].index(heavy.name)
            raise PoolSpecError(
                f"spec.lanes[{index}].name: {heavy.name!r} is the implicit lane of heavy kinds "
                f"({', '.join(unplaced_heavy)}); list them in that lane or rename it"
            )
        lanes.append(
            Lane(
                name=heavy.name, kinds=unplaced_heavy, exclude_kinds=(), tenants=(),
                workers_per_pod=heavy.workers_per_pod, min_replicas=heavy.min_replicas,
                max_replicas=heavy.max_replicas, autoscaling=heavy.autoscaling,
                resources=heavy.resources, implicit=True,
            )
        )
    _check_overlaps(lanes)
    return tuple(_with_exclusions(lane, lanes) for lane in lanes)


def check_lane_kinds(pool: PoolSpec, registered: Iterable[str], *,
                     loaded_by: Sequence[str] = ("spec.worker.imports",)) -> None:
    """Refuse a pool whose lanes name a kind that is not registered, in their kinds or their
    rate limits' kinds, before any lane starts.

    A misspelt kind in `rateLimits.kinds` caps nothing, so the kind meant runs past its
    provider's cap. A misspelt kind in `kinds` would not only fail its own lane: the
    catch-all lane excludes the kinds other lanes list, so it would exclude the misspelt
    name and serve the real kind itself.
    Raises PoolSpecError naming every lane, unknown kind and its nearest registered name,
    and what loads more kinds (`loaded_by`: the pool's field, and the runner's own ways).
    """
    known = sorted(set(registered))
    problems = []
    for index, lane in enumerate(pool.lanes):
        unknown = sorted(set(lane.kinds or ()) - set(known))
        if unknown:
            where = f"spec.lanes[{index}].kinds" if not lane.implicit else f"lane {lane.name!r}"
            named = ", ".join(_with_nearest(kind, known) for kind in unknown)
            problems.append(f"{where} (lane {lane.name!r}): unknown job kind(s) {named}")
        # a misspelt kind here caps nothing: the kind meant runs past its provider's cap
        capped = sorted(set(lane.rate_limits.kinds if lane.rate_limits else ()) - set(known))
        if capped and not lane.implicit:
            named = ", ".join(_with_nearest(kind, known) for kind in capped)
            problems.append(f"spec.lanes[{index}].rateLimits.kinds (lane {lane.name!r}): "
                            f"unknown job kind(s) {named}")
    if problems:
        raise PoolSpecError(
            f"{'; '.join(problems)}; registered kinds are {', '.join(known)} (load more with "
            f"{' or '.join(loaded_by)})")


def check_schedules(pool: PoolSpec, registered: Iterable[str],
                    payload_problem: Callable[[str, Mapping[str, Any]], str | None], *,
                    loaded_by: Sequence[str] = ("spec.worker.imports",)) -> None:
    """Refuse a pool whose schedules name a kind that is not registered, or a payload their
    kind refuses (`payload_problem(kind, payload)`: the reason, or None), before any lane
    starts: every tick of such a schedule would be dropped with an error, as long as the pool
    runs. Raises PoolSpecError naming every such schedule and field."""
    known = sorted(set(registered))
    problems = []
    for index, schedule in enumerate(pool.schedules):
        where = f"spec.schedules[{index}]"
        if schedule.kind not in known:
            problems.append(f"{where}.kind (schedule {schedule.name!r}): unknown job kind "
                            f"{_with_nearest(schedule.kind, known)}")
        elif (problem := payload_problem(schedule.kind, schedule.payload)) is not None:
            problems.append(f"{where}.payload (schedule {schedule.name!r}): {problem}")
    if problems:
        raise PoolSpecError(
            f"{'; '.join(problems)}; registered kinds are {', '.join(known)} (load more with "
            f"{' or '.join(loaded_by)})")


def _with_nearest(kind: str, known: Sequence[str]) -> str:
    nearest = difflib.get_close_matches(kind, known, n=1)
    return f"{kind!r} (did you mean {nearest[0]!r}?)" if nearest else repr(kind)


def unserved_kind_warnings(lanes: Sequence[Lane], known: Iterable[str]
                           ) -> tuple[Problem, ...]:
    """Warnings for known kinds that no lane serves for every tenant."""
    missing = sorted(
        kind for kind in set(known)
        if not any(lane.serves(kind) and not lane.tenants for lane in lanes)
    )
    if not missing:
        return ()
    return (Problem(
        "UnservedKinds",
        "no lane serves these kinds for every tenant (add a catch-all lane without kinds, "
        f"or list them): {', '.join(missing)}"),)


def _plain(value: Any, path: JsonPath = ()) -> Any:
    """Mappings and sequences as plain dicts and lists (API objects arrive as read-only views).

    Raises PoolSpecError for a key that is not text (YAML reads `5:` or `yes:` as a number or
    a boolean, never the name of a kind or a provider), naming its path, the key and its type.
    """
    if isinstance(value, Mapping):
        plain: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                try:
                    expect_text(key, f"a key of {_json_path(path)}")
                except ValueError as exc:
                    raise PoolSpecError(str(exc)) from None
            plain[key] = _plain(item, (*path, key))
        return plain
    if isinstance(value, list | tuple):
        return [_plain(item, (*path, index)) for index, item in enumerate(value)]
    return value


def _check_finite(document: Any) -> None:
    """Refuse nan and infinity (YAML's .nan and .inf) anywhere: they pass every schema bound."""
    for path, value in _leaves(document, ()):
        if isinstance(value, float) and not math.isfinite(value):
            raise PoolSpecError(f"{_json_path(path)}: {value} is not a finite number")


def _leaves(value: Any, path: JsonPath) -> Iterator[tuple[JsonPath, Any]]:
    """(path, value) of every scalar in plain dicts and lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


def _check_schema(document: Mapping[str, Any]) -> None:
    if document.get("apiVersion") != API_VERSION:
        raise PoolSpecError(
            f"apiVersion: expected {API_VERSION!r}, got {document.get('apiVersion')!r}"
        )
    if document.get("kind") != KIND:
        raise PoolSpecError(f"kind: expected {KIND!r}, got {document.get('kind')!r}")
    errors = sorted(_validator().iter_errors(document), key=_error_order)
    if errors:
        error = errors[0]
        path = _json_path(error.absolute_path)
        raise PoolSpecError(f"{path}: {error.message}{_setting_named(path)}")


def _setting_named(path: str) -> str:
    """` (the setting JOBPOOL_SLOTS)` for a field that sets one, so a refusal of the pool
    file names the setting as one of the variable or the flag does; else ``."""
    name = setting_of_pool_field(path)
    return f" (the setting {variable(name)})" if name is not None else ""


def _error_order(error: jsonschema.ValidationError) -> tuple[int, str]:
    return (len(error.absolute_path), _json_path(error.absolute_path))


def _json_path(parts: Iterable[str | int]) -> str:
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "(document)"


def _autoscaling(raw: Mapping[str, Any]) -> Autoscaling:
    return Autoscaling(
        mode=raw.get("mode", "operator"),
        target_utilization=float(raw.get("targetUtilization", DEFAULT_TARGET_UTILIZATION)),
        scale_down_stabilization=float(
            raw.get("scaleDownStabilizationSeconds", DEFAULT_STABILIZATION_SECONDS)
        ),
        scale_down_max_step=int(raw.get("scaleDownMaxStep", DEFAULT_SCALE_DOWN_MAX_STEP)),
    )


def _rate_limits(raw: Mapping[str, Any] | None, path: str) -> ProviderCaps | None:
    if raw is None:
        return None
    try:
        return parse_provider_caps(raw, f"{path}.rateLimits")
    except ValueError as exc:
        raise PoolSpecError(f"{exc}{_setting_named(f'{path}.rateLimits')}") from None


def _bounds(
    raw: Mapping[str, Any], path: str, default_min: int, default_max: int
) -> tuple[int, int]:
    low = int(raw.get("minReplicas", default_min))
    high = int(raw.get("maxReplicas", default_max))
    if low > high:
        raise PoolSpecError(
            f"{path}.maxReplicas: must be >= minReplicas ({low}), got {high}"
        )
    return low, high


def _declared_lane(raw: Mapping[str, Any], path: str) -> Lane:
    low, high = _bounds(raw, path, DEFAULT_MIN_REPLICAS, DEFAULT_MAX_REPLICAS)
    kinds = raw.get("kinds")
    return Lane(
        name=raw["name"],
        kinds=None if kinds is None else tuple(kinds),
        exclude_kinds=(),
        tenants=tuple(dict.fromkeys(tenant_ref(ref) for ref in raw.get("tenants") or ())),
        workers_per_pod=int(raw.get("workersPerPod", DEFAULT_WORKERS_PER_POD)),
        min_replicas=low,
        max_replicas=high,
        autoscaling=_autoscaling(raw.get("autoscaling") or {}),
        resources=dict(raw.get("resources") or {}),
        rate_limits=_rate_limits(raw.get("rateLimits"), path),
    )


def _heavy_lane(raw: Mapping[str, Any]) -> Lane:
    low, high = _bounds(
        raw, "spec.heavyLane", DEFAULT_HEAVY_MIN_REPLICAS, DEFAULT_HEAVY_MAX_REPLICAS
    )
    return Lane(
        name=HEAVY_LANE,
        kinds=tuple(sorted(HEAVY_KINDS)),
        exclude_kinds=(),
        tenants=(),
        workers_per_pod=int(raw.get("workersPerPod", DEFAULT_HEAVY_WORKERS_PER_POD)),
        min_replicas=low,
        max_replicas=high,
        autoscaling=_autoscaling(raw.get("autoscaling") or {}),
        resources=dict(raw.get("resources") or {}),
        implicit=True,
    )


def _check_names(lanes: Sequence[Lane]) -> None:
    seen: dict[str, int] = {}
    for index, lane in enumerate(lanes):
        if lane.name in seen:
            raise PoolSpecError(
                f"spec.lanes[{index}].name: duplicate lane name {lane.name!r} "
                f"(also spec.lanes[{seen[lane.name]}])"
            )
        seen[lane.name] = index


def _tenants_meet(a: Lane, b: Lane) -> bool:
    """Both lanes serve some tenant by the same explicit claim (both all, or a shared one)."""
    if not a.tenants and not b.tenants:
        return True
    return bool(set(a.tenants) & set(b.tenants))


def _check_overlaps(lanes: Sequence[Lane]) -> None:
    for index, lane in enumerate(lanes):
        for other in lanes[:index]:
            if not _tenants_meet(lane, other):
                continue
            if lane.kinds is None and other.kinds is None:
                shared = ["every unlisted kind"]
            elif lane.kinds is None or other.kinds is None:
                continue  # a catch-all yields the kinds that other lanes list
            else:
                shared = sorted(set(lane.kinds) & set(other.kinds))
            if shared:
                whom = ", ".join(sorted(set(lane.tenants) & set(other.tenants))) or "all tenants"
                where = f"spec.lanes[{index}]" if not lane.implicit else f"lane {lane.name!r}"
                raise PoolSpecError(
                    f"{where}.kinds: {', '.join(shared)} claimed by lanes {other.name!r} and "
                    f"{lane.name!r} for {whom}; a kind belongs to one lane per tenant"
                )


def _with_exclusions(lane: Lane, lanes: Sequence[Lane]) -> Lane:
    """A catch-all lane excludes heavy kinds and kinds that lanes covering its tenants list."""
    if lane.kinds is not None:
        return lane
    excluded = set(HEAVY_KINDS)
    for other in lanes:
        if other is lane or other.kinds is None:
            continue
        if not other.tenants or (lane.tenants and set(lane.tenants) <= set(other.tenants)):
            excluded.update(other.kinds)
    return Lane(
        name=lane.name, kinds=None, exclude_kinds=tuple(sorted(excluded)), tenants=lane.tenants,
        workers_per_pod=lane.workers_per_pod, min_replicas=lane.min_replicas,
        max_replicas=lane.max_replicas, autoscaling=lane.autoscaling, resources=lane.resources,
        rate_limits=lane.rate_limits, implicit=lane.implicit,
    )
