"""What one worker process is given, as typed values, apart from how it is given them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerRun:
    """What one worker process is given, as typed values: the process that starts it (the
    operator's manifests, a local run of a pool file, `jobpool run --processes N`) turns them
    into its command line and environment (`jobpool.cli_arguments.worker_command`).

    kinds: the kinds served, None for every registered kind but `exclude_kinds`. tenants:
    tenant keys or ids, () for all. imports: modules that register more kinds. settings:
    setting name (a field of `jobpool.settings.Settings`) -> value, e.g. {"slots": 4}.
    env: more environment variables as given (a pool's `spec.worker.env`).
    """

    kinds: tuple[str, ...] | None = None
    exclude_kinds: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    env: tuple[tuple[str, str], ...] = ()
