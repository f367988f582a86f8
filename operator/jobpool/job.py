"""The job a handler receives."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any


@dataclass(frozen=True)
class Job:
    """A claimed row of `mdm.aa_job`, one attribute per column.

    `attempts` counts this run (the claim increments it); `payload` is the decoded jsonb.
    """

    id: int
    tenant_id: uuid.UUID
    job_kind: str
    payload: Any
    status: str
    priority: int
    available_at: datetime
    created_at: datetime
    claimed_by: str
    claimed_at: datetime
    attempts: int
    max_attempts: int
    last_error: str | None
    idempotency_key: str | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        """Build from a `claim_jobs` row (extra columns are ignored)."""
        return cls(*_columns(row))


_columns = itemgetter(*Job.__dataclass_fields__)
"""A row's values in the order of Job's fields (one C call per job instead of a dict build)."""
