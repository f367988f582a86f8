"""One import batch, decided: which staged records become entities, which are rejected.

Pure: no I/O. The bulk_import kind reads a batch of staged rows, calls `plan_batch`, and
writes the plan in one transaction with the progress marker.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jobpool.kinds.entities.attributes import (
    MAX_FIELDS,
    AttributeSpec,
    RejectedRecord,
    UnknownKeys,
    validate_record,
)

RowStatus = Literal["staged", "imported", "rejected"]
ERROR_LIMIT = 2000
FIELD_LIMIT = 200
"""Characters of a field name: `error_field` keeps this many, so a CSV header name is capped
at it (attribute keys have at most 40)."""

MAX_RECORD_CHARS = 1_048_576
"""Characters of one staged record (a JSON Lines line, a CSV record with its line breaks, the
CSV header): MAX_FIELDS values of ~500 characters; bounds the memory a line can take."""

MAX_BATCH_CHARS = 64 * 1_048_576
"""Characters of staged records that one import batch reads; a batch of wide records ends
before `batch_size` rows rather than holding up to 10,000 x MAX_RECORD_CHARS in memory."""


def _listed(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(name[:40]) for name in names[:limit])
    return shown + (f" and {len(names) - limit:,} more" if len(names) > limit else "")


def check_header(fields: Sequence[str]) -> list[str]:
    """The CSV header's column names, stripped, in linear time.

    Raises ValueError naming the problem: more than MAX_FIELDS columns, an empty name, a NUL
    character, a name longer than FIELD_LIMIT, or names given more than once (a record could
    not hold both values).
    """
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"the CSV header has {len(fields):,} columns, more than the limit of "
                         f"{MAX_FIELDS:,}")
    names = [name.strip() for name in fields]
    for column, name in enumerate(names, start=1):
        if not name or "\x00" in name:
            raise ValueError(f"the CSV header's column {column} has an empty name or a NUL "
                             "character")
        if len(name) > FIELD_LIMIT:
            raise ValueError(f"the CSV header's column {column} has a name of {len(name):,} "
                             f"characters, more than the limit of {FIELD_LIMIT}")
    duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
    if duplicates:
        raise ValueError(f"the CSV header names {_listed(duplicates)} more than once")
    return names


@dataclass(frozen=True)
class StagedRow:
    """A row of `mdm.aa_import_row` as the batch reads it."""

    line_no: int
    raw: str
    status: RowStatus = "staged"
    error_field: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Entity:
    """A valid record: the entity it upserts, and the line it came from."""

    line_no: int
    external_key: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class RowOutcome:
    """What happened to one staged row."""

    line_no: int
    status: Literal["imported", "rejected"]
    error_field: str | None = None
    error: str | None = None


@dataclass
class BatchPlan:
    """The outcomes of a batch, its valid entities in chunks, and the new progress marker.

    No external key appears twice in one chunk (one INSERT ... ON CONFLICT cannot touch a row
    twice); chunks keep file order. (Staging rejects a key's later lines in one file,
    `KeyLines`; a key repeats here only across files.)
    """

    last_line: int
    outcomes: dict[int, RowOutcome] = field(default_factory=dict)
    chunks: list[list[Entity]] = field(default_factory=list)

    def reject(self, line_no: int, error_field: str | None, error: str) -> None:
        """Turn a line into a rejected one (also after the database refused it)."""
        self.outcomes[line_no] = RowOutcome(
            line_no, "rejected", None if error_field is None else error_field[:FIELD_LIMIT],
            error[:ERROR_LIMIT])

    @property
    def rejected(self) -> int:
        return sum(o.status == "rejected" for o in self.outcomes.values())


def _chunk(entities: Sequence[Entity]) -> list[list[Entity]]:
    chunks: list[list[Entity]] = []
    current: list[Entity] = []
    keys: set[str] = set()
    for entity in entities:
        if entity.external_key in keys:
            chunks.append(current)
            current, keys = [], set()
        current.append(entity)
        keys.add(entity.external_key)
    if current:
        chunks.append(current)
    return chunks


def plan_batch(
    rows: Sequence[StagedRow], attributes: Mapping[str, AttributeSpec], *, key_field: str,
    unknown_keys: UnknownKeys, type_key: str,
) -> BatchPlan:
    """Validate each row (rows rejected at staging stay rejected); rows must be non-empty."""
    plan = BatchPlan(last_line=max(row.line_no for row in rows))
    entities: list[Entity] = []
    for row in rows:
        if row.status == "rejected":
            plan.reject(row.line_no, row.error_field, row.error or "rejected at staging")
            continue
        checked = validate_record(row.raw, attributes, key_field=key_field,
                                  unknown_keys=unknown_keys, type_key=type_key)
        if isinstance(checked, RejectedRecord):
            plan.reject(row.line_no, checked.field, f"line {row.line_no}: {checked.message}")
            continue
        plan.outcomes[row.line_no] = RowOutcome(row.line_no, "imported")
        entities.append(Entity(row.line_no, checked.external_key, checked.attributes))
    plan.chunks = _chunk(entities)
    return plan


class KeyLines:
    """The line where each external key of one file first appears, to refuse a later line
    with the same key: both would upsert one entity, and the later one would silently
    replace the earlier.

    key_field: the record field holding the key (`external_key` by default).
    """

    def __init__(self, key_field: str) -> None:
        self.key_field = key_field
        self.first_line: dict[str, int] = {}

    def duplicate(self, line_no: int, raw: str) -> str | None:
        """The error for the record `raw` (JSON text) on `line_no` when its key appeared on an
        earlier line, else None (records without a usable key are left to validation)."""
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            return None
        key = record.get(self.key_field) if isinstance(record, dict) else None
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        if not isinstance(key, str):
            return None
        first = self.first_line.setdefault(key, line_no)
        if first == line_no:
            return None
        return (f"line {line_no}: field {self.key_field!r}: {key[:60]!r} is on line {first} "
                "already; a file may set each entity once")
