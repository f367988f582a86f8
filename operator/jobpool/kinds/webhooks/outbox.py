"""Write outbox events and webhook subscriptions on the caller's connection.

How a service writes an event: `await jobpool.publish_event(conn, tenant_id=...,
event_type="order.paid", payload={...})` inside the transaction of the business change. The
event exists if and only if that transaction commits, and so does its `outbox_dispatch` job.

Decision: the job comes from a trigger on `mdm.aa_outbox_event` (migration 0002), not from
this module. The guarantee "every committed event is dispatched, without a polling period"
then holds whoever inserts the row: this function, plain SQL, a service in another
language, a data migration. This module only validates and inserts, so a bad event type or
payload is refused with a clear message before it reaches the database.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row

from jobpool.core.jsondata import to_json_text
from jobpool.core.tenants import tenant_uuid
from jobpool.db.queries import One
from jobpool.errors import UnknownTenantError
from jobpool.kinds.webhooks.signing import encode_secret, signing_key
from jobpool.kinds.webhooks.ssrf import webhook_target

INSERT_OUTBOX_EVENT = One("insert_outbox_event")
INSERT_WEBHOOK_SUBSCRIPTION = One("insert_webhook_subscription")

EVENT_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
"""Event types: dot-separated lower-case words, e.g. `entity.updated` (at most 200 chars)."""
ALL_EVENTS = "*"


@dataclass(frozen=True)
class PublishedEvent:
    """An event row: `id` (the job payload refers to it) and `uid` (part of `webhook-id`)."""

    id: int
    uid: uuid.UUID
    tenant_id: uuid.UUID
    event_type: str
    created_at: datetime


@dataclass(frozen=True)
class Subscription:
    """A webhook subscription; `secret` is the `whsec_...` key receivers verify with."""

    id: int
    tenant_id: uuid.UUID
    url: str
    event_types: tuple[str, ...]
    secret: str


def check_event_type(event_type: str) -> str:
    """Return `event_type` if valid, else raise ValueError saying what a valid one looks like."""
    if not isinstance(event_type, str) or len(event_type) > 200 or not EVENT_TYPE.fullmatch(
            event_type):
        raise ValueError(
            f"invalid event type {event_type!r}: use dot-separated lower-case words "
            "(letters, digits, '_'), e.g. 'entity.updated', at most 200 characters")
    return event_type


def _event_params(tenant_id: uuid.UUID | str, event_type: str, payload: Any) -> dict[str, Any]:
    try:
        text = to_json_text(payload, name="payload")
    except ValueError as exc:
        raise ValueError(f"payload of a {event_type!r} event is refused: {exc}") from None
    return {"tenant_id": tenant_uuid(tenant_id), "event_type": check_event_type(event_type),
            "payload": text}


async def _insert_for_tenant(
    conn: AsyncConnection[Any], query: One, params: dict[str, Any]
) -> dict[str, Any]:
    """Run the INSERT ... RETURNING `query` for `params["tenant_id"]`; return its row.

    Raises UnknownTenantError when no such tenant exists (the foreign key refuses the row).
    """
    async with conn.cursor(row_factory=dict_row) as cur:
        try:
            await cur.execute(query.text, params)
        except psycopg.errors.ForeignKeyViolation as exc:
            raise UnknownTenantError(str(params["tenant_id"])) from exc
        row = await cur.fetchone()
    assert row is not None
    return row


def _published(row: dict[str, Any]) -> PublishedEvent:
    return PublishedEvent(row["id"], row["uid"], row["tenant_id"], row["event_type"],
                          row["created_at"])


async def publish_event(
    conn: AsyncConnection[Any], *, tenant_id: uuid.UUID | str, event_type: str, payload: Any
) -> PublishedEvent:
    """Write one outbox event in the caller's transaction; its dispatch job comes with it.

    payload: JSON-able; subscribers receive `{"type", "timestamp", "data": payload}`.
    Raises ValueError (bad event type or payload), UnknownTenantError; the caller's
    transaction is then aborted, as with any failed statement.
    """
    return _published(await _insert_for_tenant(
        conn, INSERT_OUTBOX_EVENT, _event_params(tenant_id, event_type, payload)))


def publish_event_sync(
    conn: Connection[Any], *, tenant_id: uuid.UUID | str, event_type: str, payload: Any
) -> PublishedEvent:
    """`publish_event` for a synchronous psycopg connection."""
    params = _event_params(tenant_id, event_type, payload)
    with conn.cursor(row_factory=dict_row) as cur:
        try:
            cur.execute(INSERT_OUTBOX_EVENT.text, params)
        except psycopg.errors.ForeignKeyViolation as exc:
            raise UnknownTenantError(str(params["tenant_id"])) from exc
        row = cur.fetchone()
    assert row is not None
    return _published(row)


def check_webhook_url(url: str) -> str:
    """Return `url` if a webhook can be delivered to it, else raise ValueError naming why.

    The rules are `ssrf.webhook_target`'s (http(s), host, port 1-65535, no user information,
    no IPv6 zone id, ASCII host names, at most 2048 characters); deliveries check them again.
    Where the host points is checked at delivery time, after DNS resolution (the SSRF guard).
    """
    webhook_target(url)
    return url


async def subscribe_webhook(
    conn: AsyncConnection[Any], *, tenant_id: uuid.UUID | str, url: str,
    event_types: Sequence[str], secret: str | None = None,
) -> Subscription:
    """Add a webhook subscription for `event_types` (`"*"` = all) of a tenant.

    secret: a `whsec_<base64>` secret (at least 16 bytes of key); None generates 32 random
    bytes. Returns the subscription with its secret, which the receiver needs to verify.
    Raises ValueError (bad URL, event type or secret), UnknownTenantError.
    """
    types = tuple(event_types)
    if not types:
        raise ValueError("a subscription needs at least one event type ('*' for all)")
    for event_type in types:
        if event_type != ALL_EVENTS:
            check_event_type(event_type)
    key = encode_secret(secrets.token_bytes(32)) if secret is None else secret
    signing_key(key)
    params = {"tenant_id": tenant_uuid(tenant_id), "url": check_webhook_url(url), "secret": key,
              "event_types": list(types)}
    row = await _insert_for_tenant(conn, INSERT_WEBHOOK_SUBSCRIPTION, params)
    return Subscription(row["id"], row["tenant_id"], row["url"], tuple(row["event_types"]), key)
