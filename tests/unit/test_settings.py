"""The one settings object: every `JOBPOOL_*` variable, its parsing, its flag, its row in the
configuration reference,
and the environment child processes get from it."""

from __future__ import annotations

import argparse
import re
import socket
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from jobpool.cli import build_parser, main
from jobpool.cli_arguments import actor_of, settings_with_flags
from jobpool.core.poolspec import load_pool_file
from jobpool.settings import Settings, setting_of, variable
from jobpool.worker.config import WorkerConfig
from jobpool.worker.supervisor import lane_processes

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "jobpool"
EXAMPLE = REPO / "examples" / "pool.yaml"
CONFIGURATION_REFERENCE = REPO / "docs" / "configuration.md"
"""The page whose table lists every setting."""


def _default_text(value: Any) -> str:
    if value in (None, ()):
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if isinstance(value, int) else f"`{value}`"


def configuration_table() -> str:
    """The configuration reference's table, one row per field of `Settings`."""
    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for item in fields(Settings):
        declared = setting_of(item)
        flag = f"`{declared.flag}`" if declared.flag else ""
        rows.append(f"| `{variable(item.name)}` | {flag} | {_default_text(item.default)} | "
                    f"{declared.doc} |")
    return "\n".join(rows) + "\n"


def test_the_documented_table_is_every_setting() -> None:
    """Paste the expected table (printed on failure) into the configuration reference."""
    page = CONFIGURATION_REFERENCE.read_text("utf-8")
    assert configuration_table() in page, "\n" + configuration_table()


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


@pytest.mark.parametrize(("variable_name", "value", "message"), [
    ("JOBPOOL_SLOTS", "0", "JOBPOOL_SLOTS must be a whole number from 1 to 256, got '0'"),
    ("JOBPOOL_SLOTS", "four", "JOBPOOL_SLOTS must be a whole number from 1 to 256"),
    ("JOBPOOL_GRACE", "nan", "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got nan"),
    ("JOBPOOL_GRACE", "soon", "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got soon"),
    ("JOBPOOL_POLL_INTERVAL", "0.001", "JOBPOOL_POLL_INTERVAL must be from 0.01 to 3600"),
    ("JOBPOOL_SCALE_INTERVAL", "inf", "JOBPOOL_SCALE_INTERVAL must be from 1 to 3600 seconds"),
    ("JOBPOOL_API_PORT", "65536", "JOBPOOL_API_PORT must be a whole number from 0 to 65535"),
    ("JOBPOOL_LOG_LEVEL", "verbose",
     "JOBPOOL_LOG_LEVEL must be one of debug, info, warning, error, got 'verbose'"),
    ("JOBPOOL_DSN", "not a dsn", "JOBPOOL_DSN is not a libpq connection string: missing"),
    ("JOBPOOL_SMTP_URL", "http://mail:25", "JOBPOOL_SMTP_URL must start with smtp:// or "
     "smtps://, got http://"),
    ("JOBPOOL_CLAMD_URL", "clamd:3310", "JOBPOOL_CLAMD_URL must start with tcp:// or unix://"),
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
        assert proc.env.get("JOBPOOL_RATE_LIMITS") == pool.lane_env(
            pool.lane(proc.lane)).get("JOBPOOL_RATE_LIMITS")


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
