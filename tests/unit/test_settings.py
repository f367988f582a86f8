"""The one settings object: every `JOBPOOL_*` variable, its parsing, its flag, its pool file
fields, its row in the configuration reference, and the environment child processes get."""

from __future__ import annotations

import argparse
import ast
import re
import socket
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobpool.cli import build_parser, main
from jobpool.cli_arguments import actor_of, settings_with_flags, worker_command
from jobpool.core.poolspec import PoolSpecError, crd_document, load_pool, load_pool_file
from jobpool.core.worker_run import WorkerRun
from jobpool.settings import (
    Choice,
    Dsn,
    Names,
    Networks,
    Seconds,
    ServiceAccount,
    Settings,
    Stored,
    Text,
    Url,
    Whole,
    declaration,
    reference_table,
    setting_of,
    setting_of_pool_field,
    variable,
)
from jobpool.worker.config import WorkerConfig
from jobpool.worker.supervisor import lane_processes

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "jobpool"
EXAMPLE = REPO / "examples" / "pool.yaml"
CONFIGURATION_REFERENCE = REPO / "docs" / "configuration.md"
"""The page whose table is `reference_table()`."""


def test_the_configuration_reference_is_every_setting() -> None:
    """Paste the expected table (printed on failure) into the configuration reference."""
    documented = CONFIGURATION_REFERENCE.read_text("utf-8")
    assert reference_table() in documented, "\n" + reference_table()


def test_every_jobpool_variable_the_package_names_is_a_setting() -> None:
    """A variable named in code (read, set for a pod, or quoted in a message) is a field, so
    it is parsed, checked, documented and passed to child processes like the others."""
    known = {variable(item.name) for item in fields(Settings)}
    named: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*"):
        if path.suffix in (".py", ".yaml", ".sql") and "egg-info" not in str(path):
            for name in re.findall(r"JOBPOOL_[A-Z0-9_]*[A-Z0-9]", path.read_text("utf-8")):
                named.setdefault(name, set()).add(path.name)
    assert {name: files for name, files in named.items() if name not in known} == {}


def test_no_module_writes_the_process_environment() -> None:
    """Child processes get an environment built for them; the parent's stays as it was."""
    writes = re.compile(r"os\.environ\[[^]]*\]\s*=|os\.environ\.(update|setdefault|pop)\(|"
                        r"os\.putenv\(")
    offenders = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                 if writes.search(path.read_text("utf-8"))]
    assert offenders == []


def _help_flags(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """{variable: the option strings whose help names it}, over every subcommand."""
    found: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for name, flags in _help_flags(sub).items():
                    found.setdefault(name, set()).update(flags)
        for name in re.findall(r"\[env (JOBPOOL_\w+)[,\]]", action.help or ""):
            found.setdefault(name, set()).update(action.option_strings)
    return found


def test_help_names_the_variable_of_each_flag() -> None:
    shown = _help_flags(build_parser(Settings()))
    expected = {variable(item.name): {setting_of(item).flag} for item in fields(Settings)
                if setting_of(item).flag}
    assert shown == expected


def test_flags_default_to_the_settings_and_fold_back_into_them() -> None:
    settings = Settings(slots=9, grace=4.5, api_port=9000, service_account="svc")
    parser = build_parser(settings)
    args = parser.parse_args(["run", "--poll-interval", "0.5"])
    assert (args.slots, args.grace, args.poll_interval) == (9, 4.5, 0.5)
    assert settings_with_flags(settings, args) == replace(settings, poll_interval=0.5)
    assert parser.parse_args(["api"]).api_port == 9000


@pytest.mark.parametrize("command", [
    ["recover"], ["enqueue", "k", "--tenant", "t"], ["dlq", "replay", "1"],
    ["dlq", "discard", "1"], ["jobs", "stop", "1"], ["import", "f.csv", "--tenant", "t",
                                                     "--type", "k"], ["demo"],
])
def test_a_command_is_audited_as_the_person_running_it_never_the_service_account(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`jobpool dlq discard 57` was audited as jobpool-worker, a person's act as a machine's."""
    monkeypatch.setenv("LOGNAME", "alice")
    args = build_parser(Settings(service_account="svc")).parse_args(command)
    assert actor_of(args) == f"user:alice@{socket.gethostname()}"
    given = build_parser(Settings()).parse_args([*command, "--actor", "bob"])
    assert actor_of(given) == "user:bob"
    machine = build_parser(Settings()).parse_args([*command, "--actor", "service:nightly"])
    assert actor_of(machine) == "nightly"


def test_an_empty_actor_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser(Settings()).parse_args(["recover", "--actor", " "])


# -- from_env ---------------------------------------------------------------------------


def test_values_are_parsed_into_their_types() -> None:
    settings = Settings.from_env({
        "JOBPOOL_SLOTS": " 12 ", "JOBPOOL_GRACE": "1.5", "JOBPOOL_SCALE_INTERVAL": "60",
        "JOBPOOL_OPERATOR_NAMESPACES": "mdm, billing,,", "JOBPOOL_LOG_LEVEL": "debug",
        "JOBPOOL_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8, ::1/128", "JOBPOOL_LEASE_NAMESPACE": "",
        "UNRELATED": "x",
    })
    assert (settings.slots, settings.grace, settings.scale_interval) == (12, 1.5, 60.0)
    assert settings.operator_namespaces == ("mdm", "billing")
    assert settings.log_level == "debug"
    assert settings.lease_namespace is None  # empty is unset


def test_a_choice_is_read_in_any_case() -> None:
    """JOBPOOL_LOG_LEVEL=WARNING (as Python and most tools write levels) was refused."""
    settings = Settings.from_env({"JOBPOOL_LOG_LEVEL": "WARNING",
                                  "JOBPOOL_POOLER": " Transaction "})
    assert (settings.log_level, settings.pooler) == ("warning", "transaction")
    assert build_parser(Settings()).parse_args(
        ["recover", "--log-level", "Debug"]).log_level == "debug"


@pytest.mark.parametrize(("variable_name", "value", "message"), [
    ("JOBPOOL_SLOTS", "0", "JOBPOOL_SLOTS must be a whole number from 1 to 256, got '0'"),
    ("JOBPOOL_SLOTS", "four", "JOBPOOL_SLOTS must be a whole number from 1 to 256"),
    ("JOBPOOL_GRACE", "nan", "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got nan"),
    ("JOBPOOL_GRACE", "soon", "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got soon"),
    ("JOBPOOL_GRACE", "30s", "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got 30s"),
    ("JOBPOOL_GRACE", "\u0663\u0660", "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got \u0663"),
    ("JOBPOOL_STOP_GRACE", "1_0", "JOBPOOL_STOP_GRACE must be from 0.1 to 3600 seconds, got 1_0"),
    ("JOBPOOL_LEASE_TTL", "1e999", "JOBPOOL_LEASE_TTL must be from"),
    ("JOBPOOL_POLL_INTERVAL", "0.001", "JOBPOOL_POLL_INTERVAL must be from 0.01 to 3600"),
    ("JOBPOOL_SCALE_INTERVAL", "inf", "JOBPOOL_SCALE_INTERVAL must be from 1 to 3600 seconds"),
    ("JOBPOOL_API_PORT", "65536", "JOBPOOL_API_PORT must be a whole number from 0 to 65535"),
    ("JOBPOOL_LOG_LEVEL", "verbose",
     "JOBPOOL_LOG_LEVEL must be one of debug, info, warning, error, got 'verbose'"),
    ("JOBPOOL_DSN", "not a dsn", "JOBPOOL_DSN is not a libpq connection string: missing"),
    ("JOBPOOL_SMTP_URL", "http://mail:25", "JOBPOOL_SMTP_URL must start with smtp:// or "
     "smtps://, got http://"),
    ("JOBPOOL_CLAMD_URL", "clamd:3310", "JOBPOOL_CLAMD_URL must start with tcp:// or unix://"),
    ("JOBPOOL_SERVICE_ACCOUNT", "token:alice@example.com",
     "JOBPOOL_SERVICE_ACCOUNT must be a bare name, got 'token:alice@example.com' (the prefix "
     "'token:' marks an audit actor as an admin API token)"),
    ("JOBPOOL_SERVICE_ACCOUNT", "user:bob", "JOBPOOL_SERVICE_ACCOUNT must be a bare name, got "
     "'user:bob' (the prefix 'user:' marks an audit actor as a person)"),
    ("JOBPOOL_SERVICE_ACCOUNT", "evil\x1b[31m\nline", "JOBPOOL_SERVICE_ACCOUNT is not one "
     "printable line: it contains U+001B at index 4"),
    ("JOBPOOL_SERVICE_ACCOUNT", "   ", "JOBPOOL_SERVICE_ACCOUNT must name the account"),
    ("JOBPOOL_WEBHOOK_ALLOW_NETWORKS", "10.0.0.0/8, intranet",
     "JOBPOOL_WEBHOOK_ALLOW_NETWORKS must be comma-separated CIDR networks (e.g. 127.0.0.0/8, "
     "::1/128), got 'intranet'"),
])
def test_a_refused_value_names_its_variable(variable_name: str, value: str,
                                            message: str) -> None:
    with pytest.raises(ValueError) as refused:
        Settings.from_env({variable_name: value})
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("changes", [
    {"slots": 0}, {"grace": float("nan")}, {"log_level": "loud"}, {"api_port": "80"},
    {"operator_namespaces": ["mdm"]}, {"smtp_from": None}, {"clamd_url": "tcp://h:99999"},
])
def test_settings_made_in_code_are_checked_naming_the_field(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"^{next(iter(changes))} "):
        Settings(**changes)


def test_to_env_gives_a_child_the_same_settings() -> None:
    settings = Settings(dsn="postgresql://db/mdm", slots=7, grace=0.25, log_level="warning",
                        operator_namespaces=("a", "b"), smtp_url="smtp://127.0.0.1:2525")
    env = settings.to_env()
    assert Settings.from_env(env) == settings
    assert "JOBPOOL_DATA_DIR" not in env  # defaults stay unset
    assert Settings().to_env() == {}


# -- the environment of child processes -----------------------------------------------------


def test_lane_processes_get_the_settings_not_the_parents_jobpool_variables() -> None:
    """The DSN (the embedded server's too) reaches the processes in the environment built for
    them; a JOBPOOL_* variable of the parent that the settings do not hold does not."""
    pool = load_pool_file(EXAMPLE)
    settings = Settings(dsn="postgresql://embedded/x", poll_interval=0.5,
                        rate_limits='{"providers": {}}')
    inherited = {"PATH": "/usr/bin", "JOBPOOL_DSN": "postgresql://stale/y",
                 "JOBPOOL_SLOT": "typo", "JOBPOOL_RATE_LIMITS": '{"providers": {}}'}
    for proc in lane_processes(pool, settings, imports=(), until_empty=True,
                               inherited=inherited):
        assert proc.env["JOBPOOL_DSN"] == "postgresql://embedded/x"
        assert proc.env["JOBPOOL_POLL_INTERVAL"] == "0.5"
        assert proc.env["PATH"] == "/usr/bin"
        assert "JOBPOOL_SLOT" not in proc.env
        assert proc.env["JOBPOOL_LANE"] == proc.lane
        pods = worker_command(pool.worker_run(pool.lane(proc.lane)))[1]
        assert proc.env.get("JOBPOOL_RATE_LIMITS") == pods.get("JOBPOOL_RATE_LIMITS")


# -- the command line -----------------------------------------------------------------------


def test_a_refused_variable_stops_every_command_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """JOBPOOL_LOG_LEVEL=verbose used to be read as info without a word."""
    monkeypatch.setenv("JOBPOOL_LOG_LEVEL", "verbose")
    assert main(["status"]) == 2
    assert "JOBPOOL_LOG_LEVEL must be one of debug, info, warning, error" in capsys.readouterr().err


@pytest.mark.parametrize("tenants", [("ACME",), ("acme", "a" * 64), ("",)])
def test_a_worker_config_refuses_tenants_no_query_could_find(tenants: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="is neither a tenant key"):
        WorkerConfig(tenants=tenants)


# -- every bad value names its setting and where it came from --------------------------------


def _refused_text(kind: Text) -> str | None:
    """A text the kind refuses, or None for a kind that takes any text (free text, names)."""
    if type(kind) in (Text, Names):
        return None
    examples: dict[type[Text], str] = {
        Whole: str(getattr(kind, "high", 0) + 1), Seconds: "soon", Choice: "loud",
        Url: "ftp://host", Dsn: "not a dsn", Networks: "intranet", Stored: "lane-\udcff",
        ServiceAccount: "token:alice@example.com",
    }
    return examples[type(kind)]  # KeyError: a new kind needs a refused example here


REFUSABLE = [item.name for item in fields(Settings)
             if _refused_text(setting_of(item).kind) is not None]


def test_every_kind_that_can_refuse_a_text_is_tested() -> None:
    assert {type(setting_of(item).kind) for item in fields(Settings)} - {Text, Names} == {
        type(declaration(name).kind) for name in REFUSABLE}


@pytest.mark.parametrize("name", REFUSABLE)
def test_a_refused_variable_names_it(name: str) -> None:
    text = _refused_text(declaration(name).kind)
    assert text is not None
    with pytest.raises(ValueError, match=f"^{variable(name)} (must|is) "):
        Settings.from_env({variable(name): text})


def _subparsers(parser: argparse.ArgumentParser,
                path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                             argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _subparsers(sub, (*path, command))


@pytest.mark.parametrize("name", [name for name in REFUSABLE if declaration(name).flag])
def test_a_refused_flag_names_it_on_every_command_that_has_it(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag, text = declaration(name).flag, _refused_text(declaration(name).kind)
    assert flag is not None and text is not None
    commands = [path for path, sub in _subparsers(build_parser(Settings()))
                if flag in sub._option_string_actions]
    assert commands
    for path in commands:
        with pytest.raises(SystemExit):
            build_parser(Settings()).parse_args([*path, f"{flag}={text}"])
        assert re.search(f"argument {flag}: (must|is) ", capsys.readouterr().err), path


def _pool_with(path: str, value: Any) -> dict[str, Any]:
    """The example pool file with the field `path` (`[]`: the first item) set to `value`."""
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    *parents, last = path.replace("[]", ".0").split(".")
    node: Any = document
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[last] = value
    return document


POOL_FIELDS_REFUSED = {
    "spec.lanes[].workersPerPod": 0, "spec.heavyLane.workersPerPod": 65,
    "spec.worker.graceSeconds": 0, "spec.worker.metricsPort": 80,
    "spec.lanes[].rateLimits": {"providers": {"smtp": {"rps": -1}}},
    "metadata.name": "p" * 39, "metadata.namespace": "Not A Namespace",
    "spec.lanes[].name": "Not A Name",
}


def test_every_pool_field_of_a_setting_has_a_refused_example() -> None:
    declared = {path for item in fields(Settings) for path in setting_of(item).pool_fields}
    assert set(POOL_FIELDS_REFUSED) == declared


@pytest.mark.parametrize(("path", "value"), POOL_FIELDS_REFUSED.items())
def test_a_refused_pool_field_names_it_and_its_setting(path: str, value: Any) -> None:
    with pytest.raises(PoolSpecError) as refused:
        load_pool(_pool_with(path, value))
    message = str(refused.value)
    assert message.startswith(path.replace("[]", "[0]")), message
    assert f"(the setting {variable(setting_of_pool_field(path) or '?')})" in message


def test_a_pool_field_allows_no_value_its_setting_refuses() -> None:
    """The CRD's bounds and defaults lie within the setting's, so what the API server
    accepts, the worker it starts accepts too."""
    root = crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for item in fields(Settings):
        declared = setting_of(item)
        for path in declared.pool_fields:
            if path.startswith("metadata."):
                continue  # Kubernetes' own field
            node = root
            for part in path.split("."):
                many = part.endswith("[]")
                node = node["properties"][part.removesuffix("[]")]
                node = node["items"] if many else node
            for bound in ("minimum", "maximum", "default"):
                if bound in node and node["type"] in ("integer", "number"):
                    declared.kind.check(node[bound])  # ValueError naming the value
            if "default" in node and path != "spec.heavyLane.workersPerPod":  # one slot: heavy
                assert node["default"] == item.default, path


def test_a_command_line_refuses_what_the_worker_would_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"^slots must be a whole number from 1 to 256"):
        worker_command(WorkerRun(settings={"slots": 0}))
    with pytest.raises(ValueError, match=r"^metrics_port must be a whole number from 0 to 65535"):
        worker_command(WorkerRun(), metrics_port=70000)


def test_a_worker_config_is_its_settings() -> None:
    settings = Settings(slots=9, grace=1.5, poll_interval=0.25, lease_ttl=5.0,
                        pooler="transaction", listen_dsn="host=db")
    config = WorkerConfig.from_settings(settings, kinds=("a",), until_empty=True)
    assert (config.slots, config.grace, config.poll_interval, config.lease_ttl) == (
        9, 1.5, 0.25, 5.0)
    assert (config.pooler, config.listen_dsn, config.kinds, config.until_empty) == (
        "transaction", "host=db", ("a",), True)
    defaults = WorkerConfig()
    assert all(getattr(defaults, item.name) == item.default for item in fields(Settings)
               if hasattr(defaults, item.name))
    with pytest.raises(TypeError, match="slots come from the settings"):
        WorkerConfig.from_settings(settings, slots=2)


def _code_strings(path: Path) -> Iterator[str]:
    """The string constants of a module's code, its docstrings left out."""
    tree = ast.parse(path.read_text("utf-8"))
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            yield node.value


def test_the_pure_decisions_know_no_flag_of_the_command() -> None:
    """A pool plan yields typed values; the command line that carries them is made at the
    edge (`worker_command`), so a renamed flag is changed in one place."""
    flags = {flag for _, sub in _subparsers(build_parser(Settings()))
             for flag in sub._option_string_actions if flag.startswith("--") and flag != "--help"}
    pure = [*(PACKAGE / "core").rglob("*.py"), PACKAGE / "k8s" / "manifests.py"]
    spoken = {
        f"{path.relative_to(PACKAGE)}: {flag}" for path in pure for text in _code_strings(path)
        for flag in flags if re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
    }
    assert spoken == set()
