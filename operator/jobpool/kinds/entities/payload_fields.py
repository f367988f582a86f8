"""Payload fields shared by the entity kinds (bulk_import, reindex, index_sync, gin_backfill).

The kinds declare their payloads as `msgspec.Struct` models (`jobpool.payloads`); these are
the constrained field types they share, and the key check each runs after decoding.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from jobpool.kinds.entities.attributes import check_key

DEFAULT_BATCH = 1000
MAX_BATCH = 10_000

PositiveId = Annotated[int, msgspec.Meta(ge=1)]
"""A row id: a whole number >= 1."""
BatchSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH)]
"""Records or entities per committed batch, 1 to MAX_BATCH."""


def check_entity_keys(payload: msgspec.Struct, *names: str) -> None:
    """Check the fields `names` of `payload` as type_key/attr_key before any can reach SQL;
    raises ValueError naming the field and the rule."""
    for name in names:
        try:
            check_key(name, getattr(payload, name))
        except ValueError as exc:
            raise ValueError(f"payload.{name}: {exc}") from None
