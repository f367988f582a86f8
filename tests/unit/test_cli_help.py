"""The command line helps: defaults in --help, no abbreviations, "did you mean"."""

from __future__ import annotations

import argparse
import filecmp
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobpool.cli import build_parser, main
from jobpool.core.actors import actor_kind, actor_name, cli_actor, token_subject
from jobpool.core.suggestions import did_you_mean
from jobpool.demo import EXAMPLE_POOL
from jobpool.errors import UnknownKindError
from jobpool.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def parsers(parser: argparse.ArgumentParser, path: str = "jobpool"
            ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command, named by its command line."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


def test_no_parser_takes_an_abbreviated_option() -> None:
    found = dict(parsers(build_parser(Settings())))
    assert {"jobpool run", "jobpool dlq discard", "jobpool api", "jobpool operator",
            "jobpool import"} <= set(found)
    assert [name for name, parser in found.items() if parser.allow_abbrev] == []


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--slot", "8"], "unrecognized arguments: --slot (did you mean '--slots'?)"),
    (["api", "--prot", "80"], "unrecognized arguments: --prot 80 (did you mean '--port'"),
    (["statsu"], "invalid choice: 'statsu'"),
    (["dlq", "replya", "1"], "(did you mean 'replay'?)"),
])
def test_a_near_miss_is_an_error_naming_what_was_meant(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--slot 8` was silently taken as `--slots 8`."""
    with pytest.raises(SystemExit) as ended:
        build_parser(Settings()).parse_args(argv)
    assert ended.value.code == 2
    assert message in capsys.readouterr().err


def test_a_misspelt_command_gets_the_one_meant(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(Settings()).parse_args(["statsu"])
    assert "(did you mean 'status'?)" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "shown"), [
    ("run", ["JOBPOOL_SLOTS, default 4]", "JOBPOOL_GRACE, default 30.0]",
             "JOBPOOL_POLL_INTERVAL, default 2.0]", "JOBPOOL_METRICS_PORT, default 9108]",
             "JOBPOOL_PROCESSES, default 1]"]),
    ("api", ["JOBPOOL_API_PORT, default 8080]", "JOBPOOL_API_HOST, default 0.0.0.0]"]),
    ("demo", ["(default: 10)"]),
    ("dlq list", ["default: 100", "list ids after this one (default: 0)"]),
])
def test_help_shows_the_defaults(command: str, shown: list[str],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`jobpool run --help` named each variable but not the defaults."""
    with pytest.raises(SystemExit):
        build_parser(Settings()).parse_args([*command.split(), "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for expected in shown:
        assert expected in text


def test_help_never_shows_a_secret_from_the_environment(
    capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(dsn="postgresql://u:hunter2hunter2@db/x",
                        api_jwt_secret="s" * 40)
    for command in (["api", "--help"], ["status", "--help"]):
        with pytest.raises(SystemExit):
            build_parser(settings).parse_args(command)
        out = capsys.readouterr().out
        assert "hunter2" not in out and "s" * 40 not in out


def test_a_refused_dsn_names_its_variable(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`JOBPOOL_DSN='not a dsn' jobpool status` said only what libpq said."""
    monkeypatch.setenv("JOBPOOL_DSN", "not a dsn")
    assert main(["status"]) == 2
    assert "JOBPOOL_DSN is not a libpq connection string" in capsys.readouterr().err
    monkeypatch.delenv("JOBPOOL_DSN")
    with pytest.raises(SystemExit):
        main(["status", "--dsn", "host=h port"])
    assert "argument --dsn: is not a libpq connection string" in capsys.readouterr().err


def test_the_demo_pool_ships_with_the_package() -> None:
    """`jobpool demo` outside the repository's root could not read examples/pool.yaml."""
    assert filecmp.cmp(EXAMPLE_POOL, ROOT / "examples" / "pool.yaml", shallow=False)
    assert build_parser(Settings()).parse_args(["demo"]).pool is None


def test_an_unknown_kind_suggests_the_registered_one_it_looks_like() -> None:
    message = str(UnknownKindError("emial_send", ["email_send", "virus_scan"]))
    assert message.startswith("unknown job kind 'emial_send' (did you mean 'email_send'?):")
    assert "did you mean" not in str(UnknownKindError("zzz", ["email_send"]))
    local = str(UnknownKindError("email_send", ["email_send"]))
    assert "did you mean" not in local
    assert "'email_send' is registered in this process but not in the database" in local
    assert did_you_mean("stauts", ["status", "migrate"]) == " (did you mean 'status'?)"


@pytest.mark.parametrize(("given", "stored", "kind", "name"), [
    ("alice@host", "user:alice@host", "person", "alice@host"),
    ("user:bob", "user:bob", "person", "bob"),
    ("service:nightly-cron", "nightly-cron", "service account", "nightly-cron"),
])
def test_a_cli_actor_is_a_person_unless_it_says_its_kind(
    given: str, stored: str, kind: str, name: str
) -> None:
    assert cli_actor(given) == stored
    assert (actor_kind(stored), actor_name(stored)) == (kind, name)


def test_token_subjects_and_service_accounts_are_told_apart() -> None:
    assert actor_kind(token_subject("alice@example.com")) == "token"
    assert actor_kind("system:serviceaccount:mdm:jobpool-worker") == "service account"
    assert actor_kind("jobpool-worker") == "service account"  # rows from before the prefixes
    for empty in ("", " ", "service:", "service: "):
        with pytest.raises(ValueError, match="an actor must name someone"):
            cli_actor(empty)


def test_a_cli_actor_cannot_pass_for_an_admin_api_token() -> None:
    with pytest.raises(ValueError, match=r"cannot be an admin API token \('token:ci'\): name a "
                                         "person"):
        cli_actor("token:ci")
    with pytest.raises(ValueError, match="cannot be an admin API token"):
        cli_actor("service:token:ci")  # stored bare, it would read as the token's


@pytest.mark.parametrize("given", ["a\x1b[31mb", "a\nb", "service:cron\r", "\u202eecila"])
def test_a_cli_actor_that_is_not_one_printable_line_is_refused(given: str) -> None:
    """The audit history prints the actor, as the API refuses a token `sub` of such text."""
    with pytest.raises(ValueError, match=r"an actor contains U\+.*only printable text"):
        cli_actor(given)


def test_version_names_the_installed_release(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as ended:
        build_parser(Settings()).parse_args(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.strip() == f"jobpool {version('jobpool')}"
