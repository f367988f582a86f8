"""Configuration: one frozen dataclass built from `JOBPOOL_*` variables."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlsplit

DEFAULT_METRICS_PORT = 9108
INT_BOUNDS = {
    "metrics_port": (0, 65535),
    "clamd_stream_max_length": (1, 4 * 1024**3),
}
"""Allowed range of each integer setting; clamd's StreamMaxLength is at most 4 GiB."""
URL_SETTINGS = ("smtp_url", "clamd_url")
"""Settings holding a URL whose port is checked at start, not first when a job needs it."""


@dataclass(frozen=True)
class Settings:
    """Process-wide settings; every field has a `JOBPOOL_<FIELD>` variable.

    dsn: libpq connection string; None starts the embedded PostgreSQL in `data_dir`.
    smtp_url: `smtp://user:pass@host:port?starttls=true` (or `smtps://`). smtp_from: the
    sender, a bare address checked like a payload's `from` (so not `@localhost`, a special-use
    name that address checks refuse).
    metrics_port: worker `/metrics`, `/healthz`, `/readyz`. clamd_url: `tcp://host:port` or
    `unix:///path`. service_account: the actor of machine transitions in the audit log.
    webhook_allow_networks: comma-separated CIDRs that webhook targets may resolve to even
    when loopback, private, link-local or metadata addresses (default: none).
    clamd_stream_max_length: bytes; clamd's `StreamMaxLength`, used only to judge a stream
    that clamd cut off without a readable reply. attachment_file_root: the folder that
    `file://` attachment URIs must lie under (unset: `file://` is refused).
    """

    dsn: str | None = None
    data_dir: str = ".jobpool"
    smtp_url: str | None = None
    smtp_from: str = "jobpool@localhost.localdomain"
    metrics_port: int = DEFAULT_METRICS_PORT
    api_jwt_secret: str | None = None
    api_jwt_public_key: str | None = None
    api_jwt_audience: str | None = None
    clamd_url: str | None = None
    rate_limits: str | None = None
    service_account: str = "jobpool-worker"
    webhook_allow_networks: str | None = None
    clamd_stream_max_length: int = 26_214_400
    attachment_file_root: str | None = None

    def __post_init__(self) -> None:
        for name, (low, high) in INT_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, "
                                 f"got {value!r}")
        for name in URL_SETTINGS:
            _check_url_port(f"JOBPOOL_{name.upper()}", getattr(self, name))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read `JOBPOOL_<FIELD>` from `env`.

        Raises ValueError naming the variable whose value is not a whole number in the
        range of INT_BOUNDS.
        """
        values: dict[str, Any] = {}
        for field in fields(cls):
            variable = f"JOBPOOL_{field.name.upper()}"
            raw = env.get(variable)
            if raw is None or raw == "":
                continue
            is_int = field.type == "int"
            values[field.name] = _int(variable, raw, *INT_BOUNDS[field.name]) if is_int else raw
        return replace(cls(), **values)


def _int(variable: str, raw: str, low: int, high: int) -> int:
    text = raw.strip()
    if not re.fullmatch(r"-?[0-9]{1,20}", text) or not low <= int(text) <= high:
        raise ValueError(f"{variable} must be a whole number from {low} to {high}, "
                         f"got {raw[:40]!r}")
    return int(text)


def _check_url_port(variable: str, url: str | None) -> None:
    """Refuse a URL whose port is not 0..65535 (the message leaves out the URL: it may hold a
    password)."""
    if not url:
        return
    try:
        _ = urlsplit(url).port
    except ValueError as exc:
        raise ValueError(f"{variable} is not a usable URL: {exc}") from None


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
