"""Finding a tenant by its key or id, for the admin commands and API and for the worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection

from jobpool.core.tenants import tenant_id_of, tenant_ref
from jobpool.db.queries import One, Row
from jobpool.errors import UnknownTenantError

RESOLVE_TENANT = One("resolve_tenant")


async def resolve_tenant(conn: AsyncConnection[Any], ref: str, *,
                         tenants: Sequence[str] | None = None) -> Row:
    """`{"id", "key"}` of the tenant whose key or id (a uuid, in any case) is `ref`.

    Raises ValueError for a `ref` that is neither a key nor a uuid, UnknownTenantError for
    one that names no tenant or one outside `tenants`.
    """
    canonical = tenant_ref(ref)
    tenant_id = tenant_id_of(canonical)
    row = await RESOLVE_TENANT(conn, {
        "key": canonical if tenant_id is None else None, "id": tenant_id})
    if row is None or (tenants is not None and row["key"] not in tenants):
        raise UnknownTenantError(ref)
    return row
