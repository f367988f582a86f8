"""The queue store: one method per named query of the queue's claims, outcomes, enqueue
and admin SQL files (`sql/claims.sql`, `sql/outcomes.sql`, ...)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection, IsolationLevel
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from jobpool.core.claim_bounds import (
    FULL_CLAIM_SHARE,
    SLOW_CLAIM,
    Bound,
    Change,
    ClaimBounds,
    Pair,
    bounds_json,
    pairs_read,
)
from jobpool.db.one_write import one_write_transaction
from jobpool.db.own_sessions import count_as_own
from jobpool.db.queries import Exec, Many, One, Row
from jobpool.registry import KindSpec

log = logging.getLogger(__name__)

CLAIM_TRANSACTION = One("claim_transaction")
CLAIM_SESSION = One("claim_session")
COMPLETE_JOBS = Many("complete_jobs")
COMPLETED_BEFORE = Many("completed_before")
CLAIM_JOBS = Many("claim_jobs")
COMPLETE_JOB = One("complete_job")
COMPLETE_JOB_OR_RAISE = Exec("complete_job_or_raise")
RETRY_JOB = One("retry_job")
DEAD_LETTER_JOB = One("dead_letter_job")
RELEASE_JOB = One("release_job")
RELEASE_UNRUN_CLAIMS = Many("release_unrun_claims")
REGISTER_KINDS = Exec("register_kinds")

OWN_ISOLATION = IsolationLevel.READ_COMMITTED
"""The isolation of every transaction a worker opens, sent with its BEGIN (so that it holds
behind a transaction pooler too), whatever the database's default_transaction_isolation:
claims, `done`s, retries, lease renewals, token leases, and a job's own transaction, which
carries the worker's `done` of the job and meets its lease renewals on the same row (under
SERIALIZABLE that renewal alone would fail the `done`). A handler may ask for another level
(docs/operations.md, "Production databases"); `jobpool.db.connect.open_pool` sets it."""

CLAIM_NOT_HELD = "JP001"
"""The SQLSTATE of a `done` that requires the claim (`QueueStore.done_statement`) when this
worker no longer holds it."""

UNCAPPED: Mapping[str, int] = MappingProxyType({})
"""No pair capped: every pair's jobs may be claimed up to the claim's limit."""

CLAIM_APPLICATION_NAME = "jobpool-claims"
"""The claim connection's name in pg_stat_activity (when the DSN gives none)."""

DEFAULT_LEASE = 30.0
"""Seconds a claim holds without renewal, unless its claimer says otherwise."""

CLAIM_CONNECT_TIMEOUT = 10.0
"""Seconds opening the claim connection may take before it counts as a lost connection."""


def escaped_literal(text: str) -> str:
    """`text` as a PostgreSQL escape string constant (`E'...'`) of ASCII characters alone:
    quotes doubled, backslashes escaped, every other character a `\\uXXXX` (`\\UXXXXXXXX`)
    escape. So it reads the same whatever `standard_conforming_strings` or client encoding a
    handler left in its session (in SJIS and EUC_JP a byte of another character may be a
    backslash). Raises ValueError on a NUL character, which no PostgreSQL text holds (and which
    would end the query text early)."""
    if "\0" in text:
        raise ValueError("a NUL character cannot be sent in a PostgreSQL text literal")
    escaped = text.replace("\\", "\\\\").replace("'", "''")
    if not escaped.isascii():
        escaped = NOT_ASCII.sub(_unicode_escape, escaped)
    return "E'" + escaped + "'"


NOT_ASCII = re.compile(r"[^\x00-\x7f]")


def _unicode_escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


class Completion(NamedTuple):
    """A job to mark done whose handler wrote nothing (its `done` commits on its own).

    result: the handler's result as checked JSON text (`core.jsondata.to_json_text`), or None.
    """

    job_id: int
    attempts: int
    result: str | None
    resent: bool = False
    """Sent before on a connection that failed, so that try may have committed unseen."""


class Written(NamedTuple):
    """What `QueueStore.complete_and_claim` did: `held`, the ids of the completions marked
    done (this worker still held them); `claimed`, the claimed rows; `busy`, the ids of
    completions still held whose row another session holds locked, to write again later.
    A completion in neither `held` nor `busy` lost its claim."""

    held: set[int]
    claimed: list[Row]
    busy: set[int]


class QueueStore:
    """Queue I/O for one worker (or admin) process.

    Methods that take `conn` run inside the caller's transaction (a job's transaction);
    `complete_and_claim` runs on a connection of the store's own (`close`, or leaving
    `async with`, closes it); the others borrow a connection from `pool` and commit at once;
    a worker replaces `pool` after an outage (`replace_pool`). Connections must return rows
    as dicts (`jobpool.db.connect`).
    """

    def __init__(self, pool: AsyncConnectionPool[Any], *, worker_id: str, actor: str,
                 lease: float = DEFAULT_LEASE, transaction_pooler: bool = False) -> None:
        self.pool = pool
        self.transaction_pooler = transaction_pooler
        """Behind a transaction pooler: the claim settings go with each claim transaction."""
        self.worker_id = worker_id
        self.actor = actor
        self.lease = lease
        """Seconds each claim is leased for (its claimer renews it: `jobpool.worker.leases`)."""
        self._claimer: AsyncConnection[Any] | None = None
        self._claim_bounds = ClaimBounds()
        """Where claims start while a snapshot held open slows the full claim."""
        self._claim_literals: tuple[str, str] | None = None
        """worker_id and actor as SQL literals (`done_statement`)."""

    async def register_kinds(self, specs: Iterable[KindSpec]) -> None:
        """Upsert the kinds and their defaults into `mdm.aa_job_kind`."""
        async with self.pool.connection() as conn:
            await register_kinds(conn, specs)

    async def claim(
        self, *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None, limit: int,
        caps: Mapping[str, int] = UNCAPPED,
    ) -> list[Row]:
        """Claim up to `limit` runnable jobs of `kinds` (and `tenants`, None = all).

        caps: the most jobs to take of each "tenant-uuid/kind" pair named (rate-limited:
        the jobs the worker can start now; 0 leaves the pair out). Raises ValueError for a
        negative cap.
        """
        return (await self.complete_and_claim(
            (), kinds=kinds, tenants=tenants, limit=limit, caps=caps)).claimed

    async def complete_and_claim(
        self, completions: Sequence[Completion], *, kinds: Sequence[str],
        tenants: Sequence[uuid.UUID] | None, limit: int, caps: Mapping[str, int] = UNCAPPED,
    ) -> Written:
        """Mark `completions` done and claim up to `limit` jobs, in one transaction.

        Returns the ids of the completions marked done, the claimed rows, and the ids of
        those still held whose row another session holds locked (passed over, not waited
        for: `Written`); the others lost their claim and are left alone. `limit` 0 claims
        nothing; `caps` as for `claim` (ValueError for a negative cap, before anything is
        sent). The claim
        (`claim_jobs`) reads only the (kind, tenant) pairs this worker serves, through
        ix_aa_job_lane also when the table has no statistics yet (a freshly filled queue);
        within a priority level tenants take turns (docs/concepts.md, "Fair turns between
        tenants"). While full claims are slow (a snapshot held open), the claims in between
        start where this store's last ones ended (`jobpool.core.claim_bounds`).

        It runs on the store's own claim connection (`claim_session`: a generic plan, the
        server's commit durability; behind a transaction pooler `claim_transaction`
        in each transaction instead), in one write (`one_write_transaction`): BEGIN at
        `OWN_ISOLATION`, the statements and COMMIT go out together, so a statement that fails
        undoes the others, and the transaction is never open on the server while the worker
        runs jobs. Any error closes that connection (the next call opens a fresh one) and is
        raised: psycopg.OperationalError when the server cannot be reached within
        `CLAIM_CONNECT_TIMEOUT` seconds.
        """
        capped = claim_caps(caps)
        resent = [c for c in completions if c.resent]
        bounds = self._claim_bounds.next_bounds(time.monotonic())
        statements: dict[str, tuple[str, Mapping[str, Any] | None]] = {}
        if self.transaction_pooler:
            statements["settings"] = (CLAIM_TRANSACTION.text, None)
        if completions:
            statements["done"] = (COMPLETE_JOBS.text, completion_parameters(
                completions, worker_id=self.worker_id, actor=self.actor))
        if resent:
            statements["done before"] = (COMPLETED_BEFORE.text, {
                "ids": [c.job_id for c in resent], "attempts": [c.attempts for c in resent],
                "worker_id": self.worker_id})
        claim = limit > 0
        if claim:
            statements["claim"] = (CLAIM_JOBS.text, claim_parameters(
                kinds=kinds, tenants=tenants, limit=limit, worker_id=self.worker_id,
                lease=self.lease, caps=capped, bounds=bounds))
        conn = await self._claim_connection()
        try:
            cursors = dict(zip(statements, await one_write_transaction(
                conn, list(statements.values())), strict=True))
            held: set[int] = set()
            busy: set[int] = set()
            if "done" in cursors:
                cursors["done"].row_factory = tuple_row  # (id, done) per row, no dict each
                for job_id, done in await cursors["done"].fetchall():
                    (held if done else busy).add(job_id)
            if "done before" in cursors:
                cursors["done before"].row_factory = tuple_row
                held.update(row[0] for row in await cursors["done before"].fetchall())
            claimed: list[Row] = await cursors["claim"].fetchall() if claim else []
        except BaseException:
            await self._drop_claim_connection()
            raise
        if claim:
            self._log_claim_mode(self._claim_bounds.claimed(
                claimed, full=bounds is None, now=time.monotonic(),
                pairs_read=pairs_read(kinds, tenants, claimed[0]["heads"] if claimed else 0)))
        return Written(held, claimed, busy)

    @staticmethod
    def _log_claim_mode(change: Change) -> None:
        """Say when claims turn bounded (`jobpool.core.claim_bounds`) and when they end."""
        if change == "bounded":
            log.warning(
                "claims take %.0f ms or more on the server, likely a snapshot held open (a "
                "long transaction) keeping the claimed jobs' index entries: claiming past the "
                "last job taken in each (kind, tenant) pair, with a full claim in %.0f %% of "
                "the time (docs/operations.md, 'A snapshot held open')",
                SLOW_CLAIM * 1000, FULL_CLAIM_SHARE * 100)
        elif change == "full":
            log.info("claims are fast again: every claim reads each pair from its head")

    async def _claim_connection(self) -> AsyncConnection[Any]:
        """The claim connection, opened (`claim_session`; transactions at `OWN_ISOLATION`,
        each begun explicitly by `one_write_transaction`) on first use or after it failed,
        like the pool's own (`jobpool.db.connect.open_pool`: dict rows, jobpool's loaders,
        TCP keepalives, its `prepare_threshold`)."""
        conn = self._claimer
        if conn is not None and not conn.closed:
            return conn
        try:
            async with asyncio.timeout(CLAIM_CONNECT_TIMEOUT):
                conn = count_as_own(await AsyncConnection.connect(
                    self._claim_conninfo(), autocommit=True, **self._pool_kwargs()))
                self._claimer = conn  # closed by `_drop_claim_connection` if the next fails
                await conn.set_isolation_level(OWN_ISOLATION)  # the BEGIN of each claim
                if not self.transaction_pooler:
                    await conn.execute(CLAIM_SESSION.text)
        except BaseException as exc:
            await self._drop_claim_connection()
            if isinstance(exc, TimeoutError):
                raise psycopg.OperationalError(
                    f"no connection within {CLAIM_CONNECT_TIMEOUT:g}s") from None
            raise
        return conn

    def _pool_kwargs(self) -> dict[str, Any]:
        """The keywords the pool opens its connections with (row factory, adapters)."""
        kwargs = self.pool.kwargs
        return {k: v for k, v in kwargs.items() if k != "autocommit"} if isinstance(
            kwargs, dict) else {}

    def _claim_conninfo(self) -> str:
        """The pool's connection string, named `CLAIM_APPLICATION_NAME` in pg_stat_activity
        unless it names its connections itself. Raises TypeError for a pool made without a
        connection string (`jobpool.db.connect.open_pool` always gives one)."""
        conninfo = self.pool.conninfo
        if not isinstance(conninfo, str):
            raise TypeError("the queue store's pool needs a connection string, not a function")
        params = conninfo_to_dict(conninfo)
        params.setdefault("application_name", CLAIM_APPLICATION_NAME)
        return make_conninfo("", **params)

    async def _drop_claim_connection(self) -> None:
        conn, self._claimer = self._claimer, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def replace_pool(self, pool: AsyncConnectionPool[Any]) -> AsyncConnectionPool[Any]:
        """Use `pool` from now on (after an outage) and a fresh claim connection; returns the
        retired pool, for the caller to close."""
        retired, self.pool = self.pool, pool
        await self._drop_claim_connection()
        return retired

    async def close(self) -> None:
        """Close the claim connection (the pool stays open: it belongs to its opener)."""
        await self._drop_claim_connection()

    async def __aenter__(self) -> QueueStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _cas(self, job_id: int, attempts: int) -> dict[str, Any]:
        return {"id": job_id, "attempts": attempts, "worker_id": self.worker_id,
                "actor": self.actor}

    async def complete(
        self, conn: AsyncConnection[Any], job_id: int, attempts: int, result: str | None,
    ) -> bool:
        """Mark done in the job's transaction; False if this worker lost the claim.

        result: checked JSON text (`core.jsondata.to_json_text`) or None.
        """
        row = await COMPLETE_JOB(conn, {**self._cas(job_id, attempts), "result": result})
        return bool(row and row["changed"])

    def done_statement(self, job_id: int, attempts: int, result: str | None) -> bytes:
        """The `done` of attempt `attempts` of job `job_id` as one statement of ASCII text,
        its values literals (`escaped_literal`), to send in one query with the job's COMMIT
        (`jobpool.db.connect.end_job`): when this worker no longer holds the claim it fails
        with SQLSTATE `CLAIM_NOT_HELD`, so the COMMIT after it never runs and the handler's
        writes are rolled back. The worker's own literals are quoted once per store.

        result: checked JSON text (`core.jsondata.to_json_text`) or None.
        """
        if self._claim_literals is None:
            self._claim_literals = (escaped_literal(self.worker_id), escaped_literal(self.actor))
        worker_id, actor = self._claim_literals
        return COMPLETE_JOB_OR_RAISE.text.format(
            id=int(job_id), attempts=int(attempts), worker_id=worker_id, actor=actor,
            result="NULL" if result is None else escaped_literal(result),
        ).encode("ascii")

    async def committed_done(self, job_id: int, attempts: int) -> bool:
        """Whether this worker's `done` of attempt `attempts` of job `job_id` committed (when
        the query that ended with its COMMIT failed after it, or the answer was lost)."""
        async with self.pool.connection() as conn:
            rows = await COMPLETED_BEFORE(conn, {
                "ids": [job_id], "attempts": [attempts], "worker_id": self.worker_id})
        return bool(rows)

    async def complete_alone(self, completion: Completion) -> bool:
        """Mark one batched completion done in a transaction of its own (after its batch
        failed, so that only the job at fault fails); False if this worker lost the claim."""
        async with self.pool.connection() as conn:
            return await self.complete(conn, completion.job_id, completion.attempts,
                                       completion.result)

    async def retry(self, job_id: int, attempts: int, *, delay: float, error: str) -> bool:
        """Back to pending in `delay` seconds; False if this worker lost the claim."""
        async with self.pool.connection() as conn:
            row = await RETRY_JOB(conn, {**self._cas(job_id, attempts),
                                        "delay": delay, "error": error})
        return row is not None

    async def dead_letter(self, job_id: int, attempts: int, *, error: str) -> bool:
        """Park in the DLQ with audit `job_dlq`; False if this worker lost the claim."""
        async with self.pool.connection() as conn:
            row = await DEAD_LETTER_JOB(conn, {**self._cas(job_id, attempts), "error": error})
        return row is not None

    async def release(self, job_id: int, attempts: int, *, delay: float = 0.0) -> bool:
        """Hand back without using up the attempt; False if this worker lost the claim."""
        async with self.pool.connection() as conn:
            row = await RELEASE_JOB(conn, {**self._cas(job_id, attempts), "delay": delay})
        return row is not None

    async def release_unrun_claims(self, running: Sequence[int]) -> list[Row]:
        """Hand back the jobs running under this worker's claim except `running` (the ones it
        runs): claims that committed while it saw the connection fail. Returns their
        (id, job_kind). They keep their place in the queue and their attempt is not counted:
        they never ran."""
        async with self.pool.connection() as conn:
            return await RELEASE_UNRUN_CLAIMS(
                conn, {"running": list(running), "worker_id": self.worker_id})


def completion_parameters(completions: Sequence[Completion], *, worker_id: str,
                          actor: str) -> dict[str, Any]:
    """`complete_jobs`' parameters for `completions` by `worker_id`, audited as `actor`: the
    ids and attempts as array literals (`int_array`); the results as a list, or None when no
    job returned one (unnest pads the missing array with nulls)."""
    results = [c.result for c in completions]
    return {
        "ids": int_array(c.job_id for c in completions),
        "attempts": int_array(c.attempts for c in completions),
        "results": results if any(result is not None for result in results) else None,
        "worker_id": worker_id, "actor": actor,
    }


def int_array(values: Iterable[int]) -> str:
    """An array literal of `values` ('{1,2,3}'), for a parameter cast to bigint[] or int[]
    in the statement. psycopg adapts a list element by element in Python, looking for the
    smallest type that holds them all: for the ids and attempts of a batched `done` that is
    about a microsecond per job, the literal a tenth of it."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def claim_parameters(
    *, kinds: Sequence[str], tenants: Sequence[uuid.UUID] | None, limit: int, worker_id: str,
    lease: float, caps: Mapping[str, list[Any]] | None = None,
    bounds: Mapping[Pair, Bound] | None = None,
) -> dict[str, Any]:
    """The parameters of `claim_jobs`: up to `limit` jobs of `kinds` (and `tenants`, None =
    all) for `worker_id`, leased for `lease` seconds; `caps` as `claim_caps` returns them
    (None: no pair capped); `bounds` for a bounded claim (`jobpool.core.claim_bounds`: only
    those pairs, each past its position), None for a full one."""
    if bounds is not None:
        tenant_ids: list[uuid.UUID] | None = []
    else:
        tenant_ids = None if tenants is None else list(dict.fromkeys(tenants))
    return {
        "kinds": list(kinds), "tenants": tenant_ids, "limit": limit, "worker_id": worker_id,
        "lease": lease, "bounds": None if bounds is None else bounds_json(bounds),
        **(claim_caps(UNCAPPED) if caps is None else caps),
    }


def claim_caps(caps: Mapping[str, int]) -> dict[str, list[Any]]:
    """The claim's `capped` pairs and their `caps`, two arrays in one order; ValueError
    naming the pair whose cap is negative (a cap is a count of jobs)."""
    bad = sorted(pair for pair, cap in caps.items() if cap < 0)
    if bad:
        raise ValueError(f"claim caps must be >= 0 jobs, got {caps[bad[0]]} for {bad[0]}")
    return {"capped": list(caps), "caps": list(caps.values())}


async def register_kinds(conn: AsyncConnection[Any], specs: Iterable[KindSpec]) -> None:
    """Upsert kinds on `conn` (for processes without a QueueStore)."""
    await REGISTER_KINDS(conn, kind_rows(specs))


def kind_rows(specs: Iterable[KindSpec]) -> dict[str, list[Any]]:
    """The parameters of `register_kinds`: one array per column of `mdm.aa_job_kind`."""
    specs = list(specs)
    return {
        "names": [s.name for s in specs],
        "priorities": [s.defaults.priority for s in specs],
        "max_attempts": [s.defaults.max_attempts for s in specs],
        "stale_ttls": [s.defaults.stale_ttl for s in specs],
    }
