"""Flags shared by the `jobpool` command and its subcommand modules (api, operator, import).

A setting's flag takes its default from `Settings`, checks its value as the `JOBPOOL_*`
variable's is checked, and names the variable in --help.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from jobpool.settings import LOG_LEVELS, Seconds, Settings, Whole, parser_of, setting_of, variable


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
    parser.add_argument(declared.flag, help=f"{meaning} [env {variable(name)}]", **kwargs)


def settings_with_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """`settings` with the values of the setting flags `args` holds (given or defaulted)."""
    given = vars(args)
    return replace(settings, **{
        item.name: given[item.name] for item in fields(Settings)
        if setting_of(item).flag and item.name in given
    })


def add_common_arguments(parser: argparse.ArgumentParser, settings: Settings) -> None:
    """--dsn, --data-dir and --log-level, for every subcommand that opens the database."""
    add_setting(parser, settings, "dsn")
    add_setting(parser, settings, "data_dir")
    add_setting(parser, settings, "log_level", metavar="{" + ",".join(LOG_LEVELS) + "}")


def add_actor(parser: argparse.ArgumentParser, settings: Settings,
              default: str | None = None) -> None:
    """--actor: the principal this command writes to the audit log."""
    add_setting(parser, settings, "service_account", dest="actor",
                default=default or settings.service_account)
