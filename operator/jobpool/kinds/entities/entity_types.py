"""Looking up a tenant's entity type by its key."""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection

from jobpool.db.queries import One
from jobpool.errors import PermanentError

ENTITY_TYPE_BY_KEY = One("entity_type_by_key")


async def find_entity_type(
    conn: AsyncConnection[Any], tenant_id: uuid.UUID, type_key: str
) -> dict[str, Any] | None:
    """The tenant's `ddm_entity_type` row with `type_key` (a checked key), or None."""
    return await ENTITY_TYPE_BY_KEY(conn, {"tenant_id": tenant_id, "type_key": type_key})


async def require_entity_type(
    conn: AsyncConnection[Any], tenant_id: uuid.UUID, type_key: str
) -> dict[str, Any]:
    """As `find_entity_type`, for a job: a missing type is a PermanentError naming it."""
    row = await find_entity_type(conn, tenant_id, type_key)
    if row is None:
        raise PermanentError(f"no entity type {type_key!r} for this tenant")
    return row
