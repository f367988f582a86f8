"""Flags shared by the `jobpool` command and its subcommand modules (api, operator, import).

A setting's flag takes its default from `Settings`, checks its value as the `JOBPOOL_*`
variable's is checked, and names the variable and its default in --help. Every parser is a
`CommandParser`: no abbreviated long options, defaults in --help, "did you mean" for a
command or choice that is none.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any

from jobpool.core.actors import cli_actor
from jobpool.core.suggestions import did_you_mean
from jobpool.core.tenants import tenant_ref
from jobpool.core.worker_run import WorkerRun
from jobpool.settings import (
    LOG_LEVELS,
    Names,
    Scope,
    Seconds,
    Settings,
    Whole,
    command_line,
    declaration,
    names_of,
    parser_of,
    setting_of,
    variable,
)


def _worth_showing(default: Any) -> bool:
    """Whether --help shows `default` (not for None, False, an empty value, or none at all)."""
    if default is None or default is False or default is argparse.SUPPRESS:
        return False
    return not (isinstance(default, str | tuple | list) and not default)


class DefaultsInHelp(argparse.HelpFormatter):
    """Appends "(default: X)" to an argument's help when it has a default worth showing
    (not None, False or empty); a setting's flag says its own (`add_setting`)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        said = "%(default)" in text or "[env " in text or text == argparse.SUPPRESS
        if said or not _worth_showing(action.default):
            return action.help
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text.strip()} (default: %(default)s)".lstrip()
        return action.help


class CommandParser(argparse.ArgumentParser):
    """The parser of `jobpool` and of each of its subcommands (argparse makes the subparsers
    of the same class).

    Long options are never abbreviated: `--slot 8` is an error, not `--slots 8`, so that a
    flag added later cannot change what an old command line means. A command or choice that
    is none gets the known ones that look like it ("did you mean 'status'?").
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        kwargs.setdefault("formatter_class", DefaultsInHelp)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """As argparse's; an argument given no help still shows its default."""
        if _worth_showing(kwargs.get("default")) and kwargs.get("help") is None:
            kwargs["help"] = "default: %(default)s"
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but an unknown option is an error here, where this (sub)command's
        options are known to suggest from: `--slot` (did you mean '--slots'?)."""
        parsed, extras = super().parse_known_args(args, namespace)
        unknown = [arg.split("=", 1)[0] for arg in extras if arg.startswith("-")]
        if unknown:
            hint = did_you_mean(unknown[0], self._option_string_actions)
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed, extras

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            choices = action.choices or ()
            hint = did_you_mean(str(value), (str(choice) for choice in choices))
            raise argparse.ArgumentError(action, f"{exc.message}{hint}") from None


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` as an argparse type: its ValueError becomes the usage error's message."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`, else an error naming the range."""
    return _argument_type(Whole(low, high).parse)


def seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: seconds from `low` to `high` (nan, infinity and words refused)."""
    return _argument_type(Seconds(low, high).parse)


def add_setting(parser: argparse.ArgumentParser, settings: Settings, name: str,
                **kwargs: Any) -> None:
    """Add the flag of the setting `name`: its default from `settings`, its values checked as
    the variable's are, its help the setting's meaning and variable.

    The flag's dest is the setting's name, so `settings_with_flags` folds it back in; `dest`
    in `kwargs` keeps a flag that only takes its default from the setting (`--actor`) apart.
    """
    item = next(item for item in fields(Settings) if item.name == name)
    declared = setting_of(item)
    assert declared.flag is not None, f"setting {name} has no flag"
    meaning = declared.doc.replace("`", "").replace("%", "%%")
    kwargs.setdefault("dest", name)
    kwargs.setdefault("default", getattr(settings, name))
    if kwargs.get("action") is None:
        kwargs.setdefault("type", _argument_type(parser_of(name)))
    default = kwargs["default"]
    shown = "" if declared.secret or default in (None, (), "") else f", default {default}"
    parser.add_argument(declared.flag, help=f"{meaning} [env {variable(name)}"
                        f"{shown.replace('%', '%%')}]", **kwargs)


def settings_with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the values of the setting flags `args` holds (given or defaulted)."""
    given = vars(args)
    return replace(settings, **{
        item.name: given[item.name] for item in fields(Settings)
        if setting_of(item).flag and item.name in given
    })


_names = Names().parse


def _tenant_refs(text: str) -> tuple[str, ...]:
    """--tenants: at least one tenant key or id, each checked (an invalid one names no
    tenant, so a worker waiting for it would never start)."""
    refs = _names(text)
    if not refs:
        raise argparse.ArgumentTypeError(f"give at least one tenant key or id, got {text!r}")
    try:
        return tuple(tenant_ref(ref) for ref in refs)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


KINDS, EXCLUDE_KINDS, TENANTS, IMPORT, UNTIL_EMPTY = (
    "--kinds", "--exclude-kinds", "--tenants", "--import", "--until-empty")
"""The flags of `jobpool run` that are no setting (what a worker serves), here once for its
parser and for the command lines that start workers (`worker_command`)."""


def add_worker_arguments(parser: argparse.ArgumentParser, settings: Settings) -> None:
    """The flags of `jobpool run`: what it serves, and every worker setting that has a flag."""
    parser.add_argument(KINDS, type=_names, help="comma-separated kinds to serve (default: all)")
    parser.add_argument(EXCLUDE_KINDS, type=_names, help="comma-separated kinds not to serve")
    parser.add_argument(TENANTS, type=_tenant_refs,
                        help="comma-separated tenant keys or ids (default: all)")
    parser.add_argument(IMPORT, dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE to register more kinds (repeatable)")
    parser.add_argument(UNTIL_EMPTY, action="store_true",
                        help="exit once nothing runnable is left")
    add_settings(parser, settings, "worker")


def add_settings(parser: argparse.ArgumentParser, settings: Settings, scope: Scope,
                 **options: Mapping[str, Any]) -> None:
    """Add the flag of every setting that applies to `scope` and has one, in the declared
    order; `options` gives one's more `add_setting` arguments by its name (metavar, action)."""
    for name in names_of(scope):
        if declaration(name).flag is not None:
            add_setting(parser, settings, name, **options.get(name, {}))


def worker_command(run: WorkerRun, *, until_empty: bool = False,
                   **settings: Any) -> tuple[list[str], dict[str, str]]:
    """The `jobpool` arguments and the environment variables that start a worker as `run`
    says: the run's settings, what it serves, then `settings` (setting name -> value, what
    the starting process adds), a setting as its flag if it has one, else as its variable;
    then `run.env`. The arguments of a run begin with those of the same run without
    `settings`, so a local lane's command line reads as its pods' does.

    Raises ValueError naming a setting whose value it refuses (`slots must be ...`).
    """
    flags, env = command_line(run.settings)
    args = ["run", *flags]
    if run.kinds is not None:
        args += [KINDS, ",".join(run.kinds)]
    for flag, names in ((EXCLUDE_KINDS, run.exclude_kinds), (TENANTS, run.tenants)):
        if names:
            args += [flag, ",".join(names)]
    for module in run.imports:
        args += [IMPORT, module]
    more_flags, more_env = command_line(settings)
    args += more_flags
    if until_empty:
        args.append(UNTIL_EMPTY)
    return args, env | more_env | dict(run.env)


def add_common_arguments(parser: argparse.ArgumentParser, settings: Settings) -> None:
    """--dsn, --data-dir and --log-level, for every subcommand that opens the database."""
    add_setting(parser, settings, "dsn")
    add_setting(parser, settings, "data_dir")
    add_setting(parser, settings, "log_level", metavar="{" + ",".join(LOG_LEVELS) + "}")


def command_user() -> str:
    """`user@host` of the person running this command: the login name (`getpass.getuser`,
    from LOGNAME/USER or the password database; the uid when neither has one) and the host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def add_actor(parser: argparse.ArgumentParser) -> None:
    """--actor: who this command's changes are audited as (a person by default, never the
    workers' service account: a person's replay or discard must be told from a machine's)."""
    parser.add_argument(
        "--actor", type=_argument_type(cli_actor), default=None,
        help="who the audit log names for this command's changes (default: you, "
             f"{command_user().replace('%', '%%')}; `service:NAME` for a machine, e.g. a cron "
             "job)")


def actor_of(args: argparse.Namespace) -> str:
    """The audit actor of a command given `args` (its --actor, else the person running it)."""
    given: str | None = args.actor
    return given if given is not None else cli_actor(command_user())
