"""outbox_dispatch: fan each outbox event out to its subscriptions, deliver each as a signed POST.

Two payload shapes, one kind (`DispatchPayload`):

- `{"event_id": n}` (from the trigger on `aa_outbox_event`): fix the event's body, create one
  `aa_webhook_delivery` row per active matching subscription and enqueue one job for each,
  all in the job's transaction.
- `{"delivery_id": n}`: POST the body to one subscriber with Standard Webhooks headers.
  2xx delivered; 408, 429, 5xx, timeouts and connection errors retry with the kind's backoff
  or the receiver's Retry-After; 410 deactivates the subscription; other 4xx, 3xx, a bad URL
  or secret and a refused target go to the DLQ. Each delivery is its own job, so one failing
  subscriber never holds up or re-sends to another.

A failed attempt is recorded on the delivery row through a second connection, because the
job's transaction rolls back when the handler raises. Whatever the receiver, its HTTP client
or DNS sent is escaped and bounded before it is stored (`jobpool.kinds.webhooks.signing`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, assert_never

import aiohttp
import msgspec
import psycopg
from aiohttp.abc import AbstractResolver, ResolveResult
from psycopg import AsyncConnection

from jobpool.core.retry import truncate_error
from jobpool.db.connect import open_side_connection
from jobpool.db.queries import Exec, Many, One
from jobpool.enqueue import NewJob, enqueue_many
from jobpool.errors import JobpoolError, PermanentError, RetryAfter
from jobpool.job import Job
from jobpool.kinds.webhooks.signing import (
    Delivered,
    DeliveryOutcome,
    Gone,
    Rejected,
    Transient,
    Undeliverable,
    classify_response,
    event_body,
    failure_reason,
    signed_headers,
)
from jobpool.kinds.webhooks.ssrf import (
    Address,
    InvalidWebhookURLError,
    Network,
    Target,
    TargetRefusedError,
    check_target,
    parse_networks,
    webhook_target,
)
from jobpool.registry import cleanup_step, kind

COMPACT_OUTBOX_EVENTS = One("compact_outbox_events")
DELIVERY_TO_SEND = One("delivery_to_send")
FAN_OUT_OUTBOX_EVENT = Many("fan_out_outbox_event")
LOCK_OUTBOX_EVENT = One("lock_outbox_event")
RECORD_DELIVERED = Exec("record_delivered")
RECORD_DELIVERY_SKIPPED = Exec("record_delivery_skipped")
RECORD_GONE = One("record_gone")
SET_DELIVERY_JOBS = Exec("set_delivery_jobs")
RECORD_DELIVERY_ATTEMPT = Exec("record_delivery_attempt")

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
"""Seconds to open the TCP (and TLS) connection to a receiver."""
TOTAL_TIMEOUT = 15.0
"""Seconds for one whole request, response included."""
RESPONSE_READ_LIMIT = 64 * 1024
"""Bytes of a receiver's response body read at most; the rest is never read."""
USER_AGENT = "jobpool-webhooks/1"
OUTBOX_RETENTION = 7 * 86_400.0
"""Seconds a dispatched event (with its delivery rows) is kept once its deliveries settled."""
COMPACT_BATCH = 5_000
COMPACT_MAX_BATCHES = 20

Resolve = Callable[[str, int], Awaitable[list[Address]]]


class DeliveryFailed(JobpoolError):
    """A transient delivery failure: the job retries with the kind's backoff."""


class TransportError(JobpoolError):
    """No HTTP answer: DNS failure, connection refused or reset, timeout, TLS error, a
    malformed response; the message is storable (`failure_reason`)."""


# -- payload -------------------------------------------------------------------------------


class DispatchPayload(msgspec.Struct, frozen=True, omit_defaults=True,
                      forbid_unknown_fields=True):
    """An outbox_dispatch payload: exactly one of `event_id` (fan the event out) and
    `delivery_id` (send one delivery)."""

    event_id: Annotated[int, msgspec.Meta(ge=1)] | None = None
    delivery_id: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def __post_init__(self) -> None:
        if (self.event_id is None) == (self.delivery_id is None):
            raise ValueError("outbox_dispatch payload must be {\"event_id\": n} or "
                             "{\"delivery_id\": n}")


# -- HTTP with the SSRF guard --------------------------------------------------------------


async def system_resolve(host: str, port: int) -> list[Address]:
    """The addresses DNS (getaddrinfo) gives for `host`, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[Address] = []
    for _, _, _, _, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]))
        if address not in found:
            found.append(address)
    return found


resolve: Resolve = system_resolve
"""Name resolution used by deliveries; tests swap it to make a name resolve to an address."""


class PinnedResolver(AbstractResolver):
    """Answers aiohttp with the addresses the guard checked, so nothing is resolved twice."""

    def __init__(self, host: str, addresses: list[Address]) -> None:
        self.host = host
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self.host:
            raise OSError(f"resolver pinned to {self.host!r} was asked for {host!r}")
        return [
            ResolveResult(
                hostname=host, host=str(address), port=port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                proto=0, flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
            for address in self.addresses
        ]

    async def close(self) -> None:
        """Nothing to release."""


async def checked_addresses(target: Target, allow: tuple[Network, ...]) -> list[Address]:
    """Resolve the target's host once and check every address.

    Raises TargetRefusedError (a refused address), TransportError (DNS failure).
    """
    if target.address is not None:
        addresses = [target.address]
    else:
        try:
            addresses = await resolve(target.host, target.port)
        except OSError as exc:
            raise TransportError(failure_reason(f"cannot resolve {target.host!r}: {exc}")
                                 ) from exc
    check_target(target.host, addresses, allow)
    return addresses


@dataclass(frozen=True)
class Answer:
    """A receiver's HTTP answer as received: status, two headers, start of the body."""

    status: int
    retry_after: str | None
    location: str | None
    body: bytes


async def _read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes:
    data = bytearray()
    while len(data) < limit:
        chunk = await stream.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


async def post_webhook(
    url: str, headers: Mapping[str, str], body: bytes, allow: tuple[Network, ...]
) -> Answer:
    """POST `body` to `url` after the SSRF guard, connecting only to the checked addresses.

    Host header and TLS SNI stay the URL's host name. No redirects, no proxies from the
    environment, CONNECT_TIMEOUT / TOTAL_TIMEOUT, at most RESPONSE_READ_LIMIT bytes read.
    Raises InvalidWebhookURLError, TargetRefusedError (both: nothing was connected to),
    TransportError.
    """
    target = webhook_target(url)
    addresses = await checked_addresses(target, allow)
    connector = aiohttp.TCPConnector(resolver=PinnedResolver(target.host, addresses),
                                     use_dns_cache=False, force_close=True)
    timeout = aiohttp.ClientTimeout(total=TOTAL_TIMEOUT, sock_connect=CONNECT_TIMEOUT)
    request_headers = {"content-type": "application/json", "user-agent": USER_AGENT, **headers}
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                         auto_decompress=False) as session, session.post(
                url, data=body, headers=request_headers, allow_redirects=False) as response:
            received = await _read_capped(response.content, RESPONSE_READ_LIMIT)
            return Answer(response.status, response.headers.get("Retry-After"),
                          response.headers.get("Location"), received)
    except TimeoutError as exc:
        raise TransportError(f"no answer from {target.host!r} within {TOTAL_TIMEOUT:g}s"
                             ) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise TransportError(failure_reason(f"{type(exc).__name__}: {exc}")) from exc


# -- database ------------------------------------------------------------------------------


async def record_outside(tx: AsyncConnection[Any], query: Exec, params: Mapping[str, Any]
                         ) -> None:
    """Run query `name` on a second, autocommit connection to `tx`'s database.

    For bookkeeping that must survive the rollback of the job's transaction; a failure is
    logged, never raised (the job's own row still records the attempt).
    """
    try:
        async with await open_side_connection(tx, application_name="jobpool outbox") as side:
            await query(side, params)
    except psycopg.Error as exc:
        log.warning("could not record a failed webhook attempt (%s): %s", query.name, exc)


# -- the kind ------------------------------------------------------------------------------


async def fan_out(job: Job, tx: AsyncConnection[Any], event_id: int) -> dict[str, Any]:
    """Create the event's deliveries and their jobs in the job's transaction."""
    event = await LOCK_OUTBOX_EVENT(tx, {"id": event_id})
    if event is None:
        raise PermanentError(f"outbox event {event_id} does not exist (compacted?)")
    if event["dispatched"]:
        return {"event_id": event_id, "deliveries": 0, "already_dispatched": True}
    if event["occurred_at"] is None:
        raise PermanentError(
            f"outbox event {event_id} has created_at {event['created_at_text']}, which an "
            "RFC 3339 timestamp cannot carry (years 0001-9999)")
    body = event_body(event["event_type"], event["occurred_at"], event["data_json"])
    rows = await FAN_OUT_OUTBOX_EVENT(tx, {"id": event_id, "body": body})
    jobs = await enqueue_many(tx, [
        NewJob(row["tenant_id"], "outbox_dispatch", {"delivery_id": row["id"]},
               idempotency_key=f"webhook_delivery:{row['id']}")
        for row in rows
    ], actor=job.context.actor)
    if rows:
        await SET_DELIVERY_JOBS(tx, {
            "ids": [row["id"] for row in rows], "job_ids": [j.id for j in jobs]})
    return {"event_id": event_id, "deliveries": len(rows)}


def _allow_networks(job: Job) -> tuple[Network, ...]:
    """The networks webhook targets may resolve to, by the job's settings (checked when they
    were built)."""
    return parse_networks(job.context.settings.webhook_allow_networks)


async def _attempt(
    delivery: Mapping[str, Any], body: bytes, allow: tuple[Network, ...]
) -> DeliveryOutcome:
    """Send one signed attempt (to a target resolving into public networks or `allow`) and
    say what the answer means."""
    try:
        headers = signed_headers(delivery["secret"], delivery["webhook_id"],
                                 int(delivery["now_epoch"]), body)
    except ValueError as exc:
        return Undeliverable(f"subscription {delivery['subscription_id']}: {exc}")
    try:
        answer = await post_webhook(delivery["url"], headers, body, allow)
    except (InvalidWebhookURLError, TargetRefusedError) as exc:
        return Undeliverable(str(exc))
    except TransportError as exc:
        return Transient(str(exc))
    return classify_response(answer.status, now=delivery["db_now"], body=answer.body,
                             retry_after=answer.retry_after, location=answer.location)


async def _failed(
    tx: AsyncConnection[Any], delivery_id: int, *, final: bool, reason: str,
    status_code: int | None,
) -> None:
    """Record a failed attempt: `failed` when no retry follows, else still `pending`."""
    await record_outside(tx, RECORD_DELIVERY_ATTEMPT, {
        "id": delivery_id, "status": "failed" if final else "pending",
        "status_code": status_code, "error": truncate_error(reason),
    })


async def deliver(job: Job, tx: AsyncConnection[Any], delivery_id: int) -> dict[str, Any]:
    """Send one delivery; record success or 410 in the job's transaction, failures apart."""
    delivery = await DELIVERY_TO_SEND(tx, {"id": delivery_id})
    if delivery is None:
        raise PermanentError(f"webhook delivery {delivery_id} does not exist (compacted?)")
    result: dict[str, Any] = {"delivery_id": delivery_id, "webhook_id": delivery["webhook_id"]}
    if delivery["status"] in ("delivered", "gone", "skipped"):
        return {**result, "status": delivery["status"], "already": True}
    if not delivery["active"]:
        await RECORD_DELIVERY_SKIPPED(tx, {
            "id": delivery_id, "reason": "subscription is not active"})
        return {**result, "status": "skipped"}
    outcome = await _attempt(delivery, bytes(delivery["body"]), _allow_networks(job))
    match outcome:
        case Delivered(status=code):
            await RECORD_DELIVERED(tx,
                             {"id": delivery_id, "status_code": code})
            return {**result, "status": "delivered", "status_code": code}
        case Gone(reason=reason):
            await RECORD_GONE(tx, {
                "id": delivery_id, "reason": truncate_error(reason), "job_id": job.id,
                "actor": job.context.actor})
            log.warning("webhook subscription %d answered 410 and was deactivated",
                        delivery["subscription_id"])
            return {**result, "status": "gone", "status_code": 410}
        case Rejected(reason=reason, status=code):
            await _failed(tx, delivery_id, final=True, reason=reason, status_code=code)
            raise PermanentError(f"webhook {delivery['url']} rejected the delivery: {reason}")
        case Undeliverable(reason=reason):
            await _failed(tx, delivery_id, final=True, reason=reason, status_code=None)
            raise PermanentError(f"webhook delivery {delivery_id} not sent: {reason}")
        case Transient(reason=reason, delay=delay, status=code):
            await _failed(tx, delivery_id, final=job.attempts >= job.max_attempts,
                          reason=reason, status_code=code)
            message = f"webhook {delivery['url']}: {reason}"
            if delay is not None:
                raise RetryAfter(delay, f"{message} (Retry-After {delay:g}s)")
            raise DeliveryFailed(message)
        case _:
            assert_never(outcome)


@kind("outbox_dispatch", priority=100, max_attempts=20, stale_ttl=5 * 60, timeout=120,
      backoff_base=30, backoff_max=24 * 3600, backoff_jitter=0.1, payload=DispatchPayload)
async def outbox_dispatch(job: Job, tx: AsyncConnection[Any]) -> dict[str, Any]:
    """Fan out one event, or deliver one (event, subscription) pair."""
    request: DispatchPayload = job.payload
    if request.event_id is not None:
        return await fan_out(job, tx, request.event_id)
    assert request.delivery_id is not None
    return await deliver(job, tx, request.delivery_id)


@cleanup_step("outbox")
async def compact_outbox(tx: AsyncConnection[Any]) -> dict[str, int]:
    """Delete events dispatched more than OUTBOX_RETENTION ago whose deliveries settled."""
    total = 0
    for _ in range(COMPACT_MAX_BATCHES):
        row = await COMPACT_OUTBOX_EVENTS(
            tx, {"retention": OUTBOX_RETENTION, "batch": COMPACT_BATCH})
        deleted = int(row["deleted"]) if row else 0
        total += deleted
        if deleted < COMPACT_BATCH:
            break
    return {"outbox_events_deleted": total}
