"""Finding a tenant by its key or id, for the admin commands and API and for the worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from jobpool.core.tenants import tenant_id_of, tenant_ref
from jobpool.db.queries import Many, One, Row
from jobpool.errors import UnknownTenantError

RESOLVE_TENANT = One("resolve_tenant")
TENANT_KEYS = Many("tenant_keys")


async def resolve_tenant(conn: AsyncConnection[Any], ref: str, *,
                         tenants: Sequence[str] | None = None) -> Row:
    """`{"id", "key"}` of the tenant whose key or id (a uuid, in any case) is `ref`.

    Raises ValueError for a `ref` that is neither a key nor a uuid, UnknownTenantError for
    one that names no tenant or one outside `tenants`, with the likeliest key meant among
    those `tenants` (all: None) for its "did you mean".
    """
    canonical = tenant_ref(ref)
    tenant_id = tenant_id_of(canonical)
    row = await RESOLVE_TENANT(conn, {
        "key": canonical if tenant_id is None else None, "id": tenant_id})
    if row is None or (tenants is not None and row["key"] not in tenants):
        keys = [r["key"] for r in await TENANT_KEYS(conn)]
        raise UnknownTenantError(ref, [k for k in keys if tenants is None or k in tenants])
    return row
