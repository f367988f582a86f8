"""Configuration: one frozen dataclass holding every `JOBPOOL_*` variable jobpool reads.

Each field is one variable, `JOBPOOL_<FIELD>`, declared once with its type, default, allowed
values and a one-line meaning (`Setting`). `Settings.from_env` reads them from a mapping and
refuses a bad value naming the variable; the CLI's flags take their defaults from the same
object and are checked by the same parsers; child processes get `Settings.to_env()`; a
pool file's fields that set one are declared with it, and the command lines and environments
that start workers are made from the declarations (`command_line`). The configuration
reference (docs/configuration.md) is `reference_table()` (a unit test keeps it so).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from jobpool.core.actors import service_account_problem
from jobpool.core.jsondata import text_problem

PREFIX = "JOBPOOL_"
DEFAULT_METRICS_PORT = 9108
MAX_SLOTS = 256
"""Each slot holds a database connection while its job runs; more is a typo, not a pool."""
MAX_PREFETCH = 4096
"""Claimed jobs a worker may hold beyond its free slots, each a row it leases: the buffer holds
about 50 ms of its slots' work, a few hundred jobs at the fastest pace; more is a typo."""
MAX_PROCESSES = 64
"""Worker processes of one `jobpool run`; each opens up to slots + 6 connections (docs:
operations.md, "Connection budget")."""
MIN_GRACE, MAX_GRACE = 0.1, 3600.0
"""Seconds; the pool file's graceSeconds allows up to an hour as well."""
MIN_POLL_INTERVAL, MAX_POLL_INTERVAL = 0.01, 3600.0
"""Seconds; below the minimum the fetch loop would query the database without pause."""
MIN_LEASE_TTL, MAX_LEASE_TTL = 0.5, 3600.0
"""Seconds; a shorter lease would be renewed more often than a renewal takes on a busy server."""
MIN_SCALE_INTERVAL, MAX_SCALE_INTERVAL = 1.0, 3600.0
"""Seconds; each interval runs one counting query per pool, and an hour is no autoscaling."""
MAX_CLAMD_STREAM = 4 * 1024**3
"""clamd's StreamMaxLength is at most 4 GiB."""
LOG_LEVELS = ("debug", "info", "warning", "error")
POOLERS = ("none", "transaction")
"""What stands between the workers and PostgreSQL: nothing (or a session-pooling PgBouncer),
or a transaction-pooling one."""
DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"


# -- how a value is read and checked --------------------------------------------------------
# Each kind parses the text of a variable or flag (`parse`), checks a value made in code
# (`check`) and writes a value back as text (`format`). Messages start with "must be" or "is",
# so that "JOBPOOL_SLOTS <message>" and "argument --slots: <message>" both read well.


@dataclass(frozen=True)
class Text:
    """Any text."""

    def parse(self, text: str) -> Any:
        self.check(text)
        return text

    def check(self, value: Any) -> None:
        if not isinstance(value, str):
            raise ValueError(f"must be text, got {value!r}")

    def format(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class Stored(Text):
    """Text the database keeps (an audit actor, a pool's or lane's name): a NUL or a lone
    surrogate (how Python carries an undecodable byte of a variable or argument) is refused
    at start, not by PostgreSQL at the first write."""

    def check(self, value: Any) -> None:
        super().check(value)
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(f"is text the database cannot keep: it {problem}")


@dataclass(frozen=True)
class ServiceAccount(Stored):
    """The name audit rows give a worker's actions: text the database keeps (`Stored`), and
    `service_account_problem`'s rules."""

    def check(self, value: Any) -> None:
        super().check(value)
        problem = service_account_problem(value)
        if problem is not None:
            raise ValueError(problem)


@dataclass(frozen=True)
class Whole(Text):
    """A whole number from `low` to `high`."""

    low: int
    high: int

    def parse(self, text: str) -> int:
        if not re.fullmatch(r"\s*[+-]?[0-9]{1,20}\s*", text) or not self._within(int(text)):
            raise ValueError(self._refusal(repr(text[:40])))
        return int(text)

    def check(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not self._within(value):
            raise ValueError(self._refusal(repr(value)))

    def _within(self, value: int) -> bool:
        return self.low <= value <= self.high

    def _refusal(self, shown: str) -> str:
        return f"must be a whole number from {self.low} to {self.high}, got {shown}"


DECIMAL = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,4})?\s*", re.ASCII)
"""A decimal number in ASCII digits, as a variable or flag of seconds takes it."""


@dataclass(frozen=True)
class Seconds(Text):
    """A number of seconds from `low` to `high` (nan, infinity and words refused)."""

    low: float
    high: float

    def parse(self, text: str) -> float:
        # float() alone also reads other scripts' digits ('٣٠') and '1_000'
        if not DECIMAL.fullmatch(text):
            raise ValueError(self._refusal(text[:40]))
        value = float(text)
        if not self.low <= value <= self.high:
            raise ValueError(self._refusal(text[:40]))
        return value

    def check(self, value: Any) -> None:
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not self.low <= value <= self.high):
            raise ValueError(self._refusal(repr(value)))

    def format(self, value: Any) -> str:
        text = repr(float(value))  # exact; a whole number without its ".0" (30, not 30.0)
        return text.removesuffix(".0")

    def _refusal(self, shown: str) -> str:
        return f"must be from {self.low:.10g} to {self.high:.10g} seconds, got {shown}"


@dataclass(frozen=True)
class Choice(Text):
    """One of `options` (lower case; text is read in any case: `WARNING` as `warning`, as
    the log levels are written elsewhere)."""

    options: tuple[str, ...]

    def parse(self, text: str) -> str:
        value = text.strip().lower()
        if value not in self.options:
            raise ValueError(f"must be one of {', '.join(self.options)}, got {text[:40]!r}")
        return value

    def check(self, value: Any) -> None:
        if value not in self.options:
            raise ValueError(f"must be one of {', '.join(self.options)}, got {str(value)[:40]!r}")


@dataclass(frozen=True)
class Url(Text):
    """A URL of one of `schemes` whose port, if any, is 0..65535; checked at start, not first
    when a job needs it.

    The message leaves the URL out: it may hold a password.
    """

    schemes: tuple[str, ...]

    def check(self, value: Any) -> None:
        super().check(value)
        parts = urlsplit(value)
        if parts.scheme.lower() not in self.schemes:
            shown = " or ".join(f"{scheme}://" for scheme in self.schemes)
            given = f"{parts.scheme[:20]}://" if parts.scheme else "no scheme"
            raise ValueError(f"must start with {shown}, got {given}")
        try:
            _ = parts.port
        except ValueError as exc:
            raise ValueError(f"is not a usable URL: {exc}") from None


@dataclass(frozen=True)
class Dsn(Text):
    """A libpq connection string or URI, parsed as libpq parses it; checked at start, so the
    refusal names the variable or flag it came from. The message leaves the text out: it may
    hold a password."""

    def check(self, value: Any) -> None:
        super().check(value)
        from psycopg import conninfo
        from psycopg import errors as pg_errors

        try:
            conninfo.conninfo_to_dict(value)
        except pg_errors.ProgrammingError as exc:
            raise ValueError(f"is not a libpq connection string: {exc}") from None


@dataclass(frozen=True)
class Networks(Text):
    """Comma-separated CIDR networks (`127.0.0.0/8, ::1/128`)."""

    def check(self, value: Any) -> None:
        super().check(value)
        for entry in filter(None, (part.strip() for part in value.split(","))):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError("must be comma-separated CIDR networks (e.g. 127.0.0.0/8, "
                                 f"::1/128), got {entry.strip()[:40]!r}") from None


@dataclass(frozen=True)
class Names(Text):
    """Comma-separated names, read as a tuple (blanks dropped)."""

    def parse(self, text: str) -> tuple[str, ...]:
        return tuple(part.strip() for part in text.split(",") if part.strip())

    def check(self, value: Any) -> None:
        if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"must be a tuple of names, got {value!r}")

    def format(self, value: Any) -> str:
        return ",".join(value)


Scope = Literal["commands", "worker", "api", "operator"]
"""Where a setting applies: every command that opens the database, a worker (`jobpool run`,
and the kinds' handlers it runs), the admin API (`jobpool api`), the operator."""
SCOPE_NAMES: Mapping[Scope, str] = {
    "commands": "every command", "worker": "worker", "api": "api", "operator": "operator"}


@dataclass(frozen=True)
class Setting:
    """The declaration of one field of `Settings`, from which its variable, flag, pool file
    field, --help line and configuration reference row are derived.

    kind: how its text is parsed and a value checked. doc: its meaning, one line.
    flag: its command-line flag, if any. unit: what its number counts (seconds, bytes), if
    it is one. applies: where it takes effect. pool_fields: the JobWorkerPool fields that
    set it for a pool's workers (`[]` for any list index), if any; the CRD allows no value
    the setting refuses (a unit test keeps it so).
    """

    kind: Text
    doc: str
    flag: str | None = None
    secret: bool = False
    """--help leaves its value out (a password, a key)."""
    unit: str | None = None
    applies: tuple[Scope, ...] = ("commands",)
    pool_fields: tuple[str, ...] = ()


def _setting(default: Any, kind: Text, doc: str, flag: str | None = None, *,
             secret: bool = False, unit: str | None = None,
             applies: tuple[Scope, ...] = ("commands",), pool_fields: tuple[str, ...] = ()) -> Any:
    if unit is None and isinstance(kind, Seconds):
        unit = "seconds"
    declared = Setting(kind, doc, flag, secret, unit, applies, pool_fields)
    return field(default=default, metadata={"setting": declared})


@dataclass(frozen=True)
class Settings:
    """Process-wide settings; field `x` is the variable `JOBPOOL_<X>` (see `variable`).

    Made in code, values are checked as well: ValueError naming the field.
    """

    # where the database is
    dsn: str | None = _setting(
        None, Dsn(), "libpq connection string; unset: an embedded PostgreSQL in the data folder",
        "--dsn", secret=True)
    pooler: str = _setting(
        "none", Choice(POOLERS), "`transaction`: the DSN goes through a transaction-pooling "
        "PgBouncer (no server-side prepared statements or session settings, LISTEN only on "
        "JOBPOOL_LISTEN_DSN, else poll-only); `none`: a direct connection or session pooling, see "
        "[Production databases](operations.md#production-databases)")
    listen_dsn: str | None = _setting(
        None, Dsn(), "libpq connection string of the worker's LISTEN connection and of its "
        "handlers' session connections (online index builds), straight to PostgreSQL past a "
        "transaction pooler; unset: the DSN (poll-only with JOBPOOL_POOLER=transaction, and "
        "no index builds)", secret=True, applies=("worker",))
    data_dir: str = _setting(".jobpool", Text(), "folder of the embedded PostgreSQL", "--data-dir")
    log_level: str = _setting("info", Choice(LOG_LEVELS), "log level: debug, info, warning, error",
                              "--log-level")
    service_account: str = _setting(
        "jobpool-worker", ServiceAccount(),
        "the workers' service account, the audit log's principal of what they do (a CLI "
        "command names the person running it, see [Audit actors](command-line.md#audit-actors))",
        applies=("worker",))
    # a worker
    slots: int = _setting(4, Whole(1, MAX_SLOTS), "jobs a worker runs at once", "--slots",
                          unit="jobs", applies=("worker",),
                          pool_fields=("spec.lanes[].workersPerPod",
                                       "spec.heavyLane.workersPerPod"))
    prefetch: int = _setting(
        512, Whole(0, MAX_PREFETCH),
        "the most claimed jobs a worker holds beyond its free slots, started as slots free: it "
        "holds about what its slots start in 50 ms at their pace, up to this (0: claim only "
        "into free slots), see [The fetch loop](workers-and-pools.md#the-fetch-loop)",
        "--prefetch", unit="jobs", applies=("worker",))
    grace: float = _setting(
        30.0, Seconds(MIN_GRACE, MAX_GRACE),
        "seconds running jobs get after SIGTERM before they are handed back", "--grace",
        applies=("worker",),
        pool_fields=("spec.worker.graceSeconds",))
    stop_grace: float = _setting(
        10.0, Seconds(MIN_GRACE, MAX_GRACE),
        "seconds a stopped job's handler gets to clean up after its cancellation before its "
        "slot is freed; at shutdown, what a handler cancelled at the end of the grace period "
        "gets before the worker exits without it", "--stop-grace", applies=("worker",))
    poll_interval: float = _setting(
        2.0, Seconds(MIN_POLL_INTERVAL, MAX_POLL_INTERVAL),
        "seconds between claims when no notification arrives", "--poll-interval",
        applies=("worker",))
    lease_ttl: float = _setting(
        30.0, Seconds(MIN_LEASE_TTL, MAX_LEASE_TTL),
        "seconds a running job's claim holds without renewal (renewed every third of that, "
        "from a thread of the worker's own): a dead worker's jobs run again about this long "
        "after it died; capped at the kinds' stale TTLs", "--lease-ttl", applies=("worker",))
    processes: int = _setting(
        1, Whole(0, MAX_PROCESSES),
        "worker processes of one `jobpool run` (and of each lane process of a pool file), each "
        "with its own slots, behind one /metrics, /healthz, /readyz; 0: one per CPU the "
        "process may use (affinity and cgroup quota)", "--processes", unit="processes",
        applies=("worker",))
    metrics_port: int = _setting(
        DEFAULT_METRICS_PORT, Whole(0, 65535),
        "port of a worker's /metrics, /healthz, /readyz (0: off; with a pool file, worker i of "
        "the pool gets port + i)", "--metrics-port", applies=("worker",),
        pool_fields=("spec.worker.metricsPort",))
    rate_limits: str | None = _setting(
        None, Text(), "provider caps as JSON or `@/path/file.yaml`, see "
        "[Rate limits](rate-limits.md); on Kubernetes and in a local run of a pool "
        "file, from the lane's rateLimits", applies=("worker",),
        pool_fields=("spec.lanes[].rateLimits",))
    pool: str | None = _setting(
        None, Stored(), "the JobWorkerPool a worker belongs to, named in its start log line and "
        "its row among the live workers; set by the operator and by `jobpool run pool.yaml`",
        applies=("worker",), pool_fields=("metadata.name",))
    pool_namespace: str | None = _setting(
        None, Stored(), "the namespace of that JobWorkerPool: with its name, the owner of the "
        "pool's schedules (`<namespace>/<name>`, so that pools of one name in two namespaces "
        "keep theirs apart, see [Schedules](schedules.md)); set by the operator and by "
        "`jobpool run pool.yaml` from `metadata.namespace`", applies=("worker",),
        pool_fields=("metadata.namespace",))
    lane: str | None = _setting(
        None, Stored(), "the lane a worker belongs to, named in its start log line and its row "
        "among the live workers (the console groups workers by it); set by the operator and by "
        "`jobpool run pool.yaml`", applies=("worker",), pool_fields=("spec.lanes[].name",))
    schedules: str | None = _setting(
        None, Stored(), "the pool's schedules as a JSON list (a pool file's spec.schedules, see "
        "[Schedules](schedules.md)); set by the operator and by `jobpool run pool.yaml`",
        applies=("worker",))
    # the kinds
    smtp_url: str | None = _setting(
        None, Url(("smtp", "smtps")),
        "`smtp://user:pass@host:587?starttls=true` or `smtps://host:465`, for email_send",
        applies=("worker",))
    smtp_from: str = _setting(
        "jobpool@localhost.localdomain", Stored(),
        "sender of email_send when the payload has no `from` (a bare address)", applies=("worker",))
    clamd_url: str | None = _setting(
        None, Url(("tcp", "unix")),
        "`tcp://host:port` or `unix:///path` of the clamd virus_scan uses", applies=("worker",))
    clamd_stream_max_length: int = _setting(
        26_214_400, Whole(1, MAX_CLAMD_STREAM),
        "set it to clamd's StreamMaxLength (used to judge a stream clamd cut off)", unit="bytes",
        applies=("worker",))
    attachment_file_root: str | None = _setting(
        None, Text(), "folder that `file://` attachment URIs must lie under (unset: `file://` "
        "refused)", applies=("worker",))
    webhook_allow_networks: str | None = _setting(
        None, Networks(), "comma-separated CIDRs that webhook targets may resolve to even when "
        "loopback, private, link-local or metadata addresses", applies=("worker",))
    # `jobpool api`
    api_host: str = _setting("0.0.0.0", Text(), "address the admin API listens on", "--host",
                             applies=("api",))
    api_port: int = _setting(8080, Whole(0, 65535), "port the admin API listens on", "--port",
                            applies=("api",))
    api_jwt_secret: str | None = _setting(
        None, Text(), "HS256 secret of the admin API's tokens, >= 32 bytes (prefer the "
        "variable: flags show in ps)", "--jwt-secret", secret=True, applies=("api",))
    api_jwt_public_key: str | None = _setting(
        None, Text(), "RS256/ES256 key of the admin API's tokens: a PEM public key file, a "
        "JWKS file, or inline PEM", "--jwt-public-key", applies=("api",))
    api_jwt_audience: str | None = _setting(
        None, Text(), "the aud every admin API token must carry (required)", "--jwt-audience",
        applies=("api",))
    api_pool: str | None = _setting(
        None, Text(), "a JobWorkerPool file whose lanes the console's overview shows (unset: "
        "only the lanes live workers name)", "--pool", applies=("api",))
    # `jobpool operator`
    operator_namespaces: tuple[str, ...] = _setting(
        (), Names(), "namespaces the operator watches, comma-separated (the flag is "
        "repeatable); unset: every namespace", "--namespace", applies=("operator",))
    scale_interval: float = _setting(
        15.0, Seconds(MIN_SCALE_INTERVAL, MAX_SCALE_INTERVAL),
        "seconds between the operator's job counts per pool", "--scale-interval",
        applies=("operator",))
    kubeconfig: str | None = _setting(
        None, Text(), "the operator's kubeconfig file; unset: in-cluster, then KUBECONFIG or "
        "~/.kube/config", "--kubeconfig", applies=("operator",))
    lease_namespace: str | None = _setting(
        None, Text(), "namespace of the Lease 'jobpool-operator' that elects the one active "
        "operator replica; unset: the operator's own (its ServiceAccount's) namespace",
        "--lease-namespace", applies=("operator",))
    operator_liveness: str = _setting(
        DEFAULT_LIVENESS, Text(), "where the operator serves its liveness check, with "
        "/readyz on the same port (the flag takes '' for nowhere)", "--liveness",
        applies=("operator",))

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.default is None:
                continue
            try:
                setting_of(item).kind.check(value)
            except ValueError as exc:
                raise ValueError(f"{item.name} {exc}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read every `JOBPOOL_<FIELD>` of `env`; unset or empty leaves the default.

        Raises ValueError naming the variable whose value is refused (a number out of its
        range, a log level that is none, a URL whose port is not one, a bad CIDR), so a
        command stops at its start rather than when a job first needs the value.
        """
        values: dict[str, Any] = {}
        for item in fields(cls):
            raw = env.get(variable(item.name))
            if raw is None or raw == "":
                continue
            try:
                values[item.name] = setting_of(item).kind.parse(raw)
            except ValueError as exc:
                raise ValueError(f"{variable(item.name)} {exc}") from None
        return replace(cls(), **values)

    def to_env(self) -> dict[str, str]:
        """The `JOBPOOL_*` variables that make a child process's `from_env` equal these
        settings (those that differ from the default)."""
        default = Settings()
        return {
            variable(item.name): setting_of(item).kind.format(getattr(self, item.name))
            for item in fields(self)
            if getattr(self, item.name) not in (None, getattr(default, item.name))
        }


def variable(name: str) -> str:
    """The environment variable of the field `name`: `slots` -> `JOBPOOL_SLOTS`."""
    return f"{PREFIX}{name.upper()}"


def setting_of(item: Field[Any]) -> Setting:
    """The `Setting` declared on a field of `Settings`."""
    declared: Setting = item.metadata["setting"]
    return declared


def declaration(name: str) -> Setting:
    """The `Setting` declared for the field `name`; KeyError if no field has that name."""
    for item in fields(Settings):
        if item.name == name:
            return setting_of(item)
    raise KeyError(f"no setting {name!r}")


def default_of(name: str) -> Any:
    """The default value of the setting `name` (as `Settings()` holds it)."""
    return getattr(_DEFAULTS, name)


def names_of(scope: Scope) -> tuple[str, ...]:
    """The settings that apply to `scope`, in their declared order."""
    return tuple(item.name for item in fields(Settings) if scope in setting_of(item).applies)


def setting_of_pool_field(path: str) -> str | None:
    """The setting a JobWorkerPool field sets (`spec.lanes[2].workersPerPod` -> `slots`), or
    that a field lies within (`spec.lanes[0].rateLimits.providers` -> `rate_limits`)."""
    general = re.sub(r"\[[0-9]+\]", "[]", path)
    for item in fields(Settings):
        for field_path in setting_of(item).pool_fields:
            if general == field_path or general.startswith((f"{field_path}.", f"{field_path}[")):
                return item.name
    return None


def command_line(values: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """How a command is given `values` (setting name -> value, e.g. from a pool file): a
    setting with a flag as that flag and its value, in the order of `values`, one without
    as its variable.

    Raises KeyError for a name that is no setting and ValueError naming the setting for a
    value it refuses, so no process starts with an argument it would refuse itself.
    """
    arguments: list[str] = []
    variables: dict[str, str] = {}
    for name, value in values.items():
        declared = declaration(name)
        try:
            declared.kind.check(value)
        except ValueError as exc:
            raise ValueError(f"{name} {exc}") from None
        text = declared.kind.format(value)
        if declared.flag is not None:
            arguments += [declared.flag, text]
        else:
            variables[variable(name)] = text
    return arguments, variables


def reference_table() -> str:
    """The configuration reference: a Markdown table, one row per field of `Settings` (its
    variable, flag, pool file fields, default, unit, where it applies, meaning)."""
    rows = ["| variable | flag | pool file | default | unit | applies to | meaning |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for item in fields(Settings):
        declared = setting_of(item)
        cells = (
            f"`{variable(item.name)}`",
            f"`{declared.flag}`" if declared.flag else "",
            ", ".join(f"`{path}`" for path in declared.pool_fields),
            _default_text(item.default),
            declared.unit or "",
            ", ".join(SCOPE_NAMES[scope] for scope in declared.applies),
            declared.doc,
        )
        rows.append(f"| {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def _default_text(value: Any) -> str:
    if value in (None, ()):
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if isinstance(value, int) else f"`{value}`"


def parser_of(name: str) -> Callable[[str], Any]:
    """The parser of the field `name` (ValueError with a message starting "must be"/"is")."""
    return setting_of(_field(name)).kind.parse


def _field(name: str) -> Field[Any]:
    return next(item for item in fields(Settings) if item.name == name)


_DEFAULTS = Settings()
_current: Settings | None = None


def configure(settings: Settings) -> None:
    """Make `settings` the ones `current()` returns (the CLI does this at start)."""
    global _current
    _current = settings


def current() -> Settings:
    """The configured settings, or those of the process environment."""
    if _current is None:
        configure(Settings.from_env(os.environ))
    assert _current is not None
    return _current
