"""Configuration: one frozen dataclass built from `JOBPOOL_*` variables (STYLE habit 9)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

DEFAULT_METRICS_PORT = 9108


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

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read `JOBPOOL_<FIELD>` from `env`; raises ValueError naming a bad variable."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            raw = env.get(f"JOBPOOL_{field.name.upper()}")
            if raw is None or raw == "":
                continue
            if field.type == "int":
                try:
                    values[field.name] = int(raw)
                except ValueError:
                    raise ValueError(
                        f"JOBPOOL_{field.name.upper()} must be an integer, got {raw!r}"
                    ) from None
            else:
                values[field.name] = raw
        return replace(cls(), **values)


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
