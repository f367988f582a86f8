"""A worker's leases on its running jobs, kept outside its event loop.

Every claim is leased for `lease` seconds (`claim_jobs` stamps `lease_expires_at`). A thread of
the worker's own, on a connection of its own, renews the leases of the jobs the worker holds
every `lease / 3` seconds, so that a handler blocking the event loop (`time.sleep` in an async
handler, a CPU-bound loop) does not let its claims lapse while the worker lives. On a
long-running worker the same thread takes back lapsed claims of any worker every
`recover_every` seconds (one worker at a time: `recovery_turn`), so a dead worker's jobs run
again about a lease after it died. The same thread writes the worker's heartbeat in the
registry of live workers (worker/heartbeat.py), so that a blocked loop neither shows its live
worker dead nor lets its row be deleted. And it watches the event loop: a loop that has not run for
`LOOP_BLOCKED_AFTER` seconds is logged by the thread, naming the job and kind whose task holds
it, and again by the loop with the duration once it runs.

A job's lease is renewed until its outcome is written (`finishing` marks the start of that
write, `release` its end): a job whose row stops being running under this worker's claim
while it is not finishing lost its claim (recovered elsewhere, or stopped by an admin): it
is logged once and handed to `lost` in the event loop, which cancels its handler
(worker/stops.py). A handler that outlives its kind's timeout by a lease (only a blocked
loop, or a handler that ignores cancellation, gets there) is no longer renewed: its claim
lapses and runs elsewhere, rather than a hung worker holding it for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from jobpool.core.retry import error_text
from jobpool.db.connect import with_tcp_liveness
from jobpool.db.failures import closed_meanwhile, open_or_none
from jobpool.db.own_sessions import count_as_own
from jobpool.db.queries import Many, One
from jobpool.db.store import OWN_ISOLATION
from jobpool.worker.heartbeat import Heartbeat
from jobpool.worker.maintenance import log_recovered

LEASE_SESSION = One("lease_session")
LEASE_TRANSACTION = One("lease_transaction")
RECOVER_STALE_CLAIMS = Many("recover_stale_claims")
RECOVERY_TURN = One("recovery_turn")
RENEW_LEASES = Many("renew_leases")
STOPPED_JOBS = Many("stopped_jobs")

log = logging.getLogger("jobpool.worker")

RECOVER_EVERY = 5.0
"""Seconds between a long-running worker's tries at recovering lapsed claims (capped at half
its lease)."""

WATCH_EVERY = 0.25
"""Seconds between the thread's looks at the event loop (and at what is due)."""

LOOP_BLOCKED_AFTER = 1.0
"""Seconds without the event loop running after which it counts as blocked and is logged."""

RETRY_AFTER_FAILURE = 1.0
"""Seconds before a failed renewal or recovery is tried again (capped at a third of the lease)."""

APPLICATION_NAME = "jobpool-leases"
"""The lease connection's name in pg_stat_activity (when the DSN gives none)."""

CONNECT_TIMEOUT = 10
"""Seconds opening the lease connection may take."""


@dataclass
class Held:
    """A job this worker runs: what the thread needs to renew its lease and to name it."""

    kind: str
    renew_until: float
    """`time.monotonic()` past which the lease is left to lapse (unless finishing)."""
    finishing: bool = False
    """Its outcome is being written: a lease that is not renewed then is not a lost claim."""


class LeaseKeeper:
    """Renews the leases of one worker's jobs from a thread; recovers lapsed claims; watches
    the event loop.

    `lease`: seconds each renewal extends a lease by (> 0). `recover`: take back lapsed claims
    every min(RECOVER_EVERY, lease / 2) seconds (long-running workers; not a one-off drain).
    `lost(job_id, stopped)`: called in the event loop for each held job whose claim a renewal
    found gone (at most `lease / 3` + `WATCH_EVERY` seconds after it went); `stopped`: the
    job carries the manual stop flag (else stale-claim recovery took it back).
    `heartbeat`: the worker's registry row, beaten every `heartbeat.every` seconds (None:
    none). `start()` and `watch_loop()` run in the worker's event loop; `hold`, `finishing`
    and `release` are called from it; `beat` and `stop` in a thread of `asyncio.to_thread`;
    the rest runs on the thread.
    """

    def __init__(self, dsn: str, *, worker_id: str, actor: str, lease: float, recover: bool,
                 transaction_pooler: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 lost: Callable[[int, bool], None] | None = None,
                 heartbeat: Heartbeat | None = None) -> None:
        if not lease > 0:
            raise ValueError(f"lease must be > 0 seconds, got {lease}")
        self.dsn = dsn
        self.worker_id = worker_id
        self.actor = actor
        self.lease = lease
        self.transaction_pooler = transaction_pooler
        """`dsn` leads to a pooler in transaction mode: the timeouts go with each transaction
        (`_bounded`), never as session settings."""
        self.recover_every = min(RECOVER_EVERY, lease / 2) if recover else None
        self.clock = clock
        self.lost = lost
        self.heartbeat = heartbeat
        self.problem: str | None = None
        """Why renewal (or recovery) fails, for /readyz; None while it works."""
        self._held: dict[int, Held] = {}
        self._locked: set[int] = set()
        """Held jobs whose row was locked by another session at the last renewal."""
        self._locked_told: set[int] = set()
        """Those of them the log was told about (`_note_locked`)."""
        self._lock = threading.Lock()
        self._conn_lock = threading.Lock()
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_seen = clock()
        self._blocked_since: float | None = None
        self._blocked_by = ""

    # -- from the event loop ---------------------------------------------------------------

    def hold(self, job_id: int, kind: str, timeout: float) -> None:
        """Renew job `job_id`'s lease from now on (just claimed; its handler may take
        `timeout` seconds)."""
        with self._lock:
            self._held[job_id] = Held(kind, self.clock() + timeout + self.lease)

    def running(self, job_id: int, kind: str, timeout: float) -> None:
        """Job `job_id`, held since its claim (`hold`), starts running now: its lease is renewed for
        its handler's `timeout` seconds from now on. Without the lock: one attribute written
        (atomic), read by the thread at its next renewal."""
        held = self._held.get(job_id)
        if held is None:
            self.hold(job_id, kind, timeout)
            return
        held.renew_until = self.clock() + timeout + self.lease

    def finishing(self, job_id: int) -> None:
        """Job `job_id`'s outcome is about to be written (its lease is still renewed)."""
        with self._lock:
            held = self._held.get(job_id)
            if held is not None:
                held.finishing = True

    def is_finishing(self, job_id: int) -> bool:
        """Whether job `job_id`'s outcome is being written (`finishing` was called)."""
        with self._lock:
            held = self._held.get(job_id)
            return held is not None and held.finishing

    def release(self, job_id: int) -> None:
        """Job `job_id` is over here: its lease is no longer renewed."""
        with self._lock:
            self._held.pop(job_id, None)

    def start(self) -> None:
        """Start the thread (in the worker's event loop, whose task names it reads)."""
        self._loop = asyncio.get_running_loop()
        self._loop_seen = self.clock()
        self._thread = threading.Thread(target=self._run, name="jobpool-leases", daemon=True)
        self._thread.start()

    async def watch_loop(self) -> None:
        """Show the thread that the event loop runs, and log how long it was blocked once it
        runs again; never returns."""
        last = self._loop_seen = self.clock()
        while True:
            await asyncio.sleep(WATCH_EVERY)
            now = self._loop_seen = self.clock()
            blocked = now - last - WATCH_EVERY
            if blocked >= LOOP_BLOCKED_AFTER:
                log.warning("the event loop was blocked for %.1fs by %s", blocked,
                            self._blocked_by if self._blocked_since is not None
                            else "a task that ended before it was seen")
            self._blocked_since = None
            last = now

    def stop(self) -> None:
        """Stop the thread, delete the worker's registry row (on the lease connection, if it
        is open: a row left behind dies with its heartbeat) and close the connection. Blocks
        up to one round: call it in a thread of its own from the event loop."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._conn_lock:
            if self.heartbeat is not None and self._conn is not None and not self._conn.closed:
                self.heartbeat.forget(self._conn)
            self._drop_connection()

    def blocked(self) -> tuple[float, str] | None:
        """Seconds the event loop has been blocked and by what, while it is; else None."""
        since = self._blocked_since
        return None if since is None else (self.clock() - since, self._blocked_by)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        renew_every = self.lease / 3
        next_renewal = self.clock() + renew_every
        next_recovery = self.clock()
        next_beat = self.clock() + (self.heartbeat.every if self.heartbeat else 0.0)
        while not self._stopping.wait(WATCH_EVERY):
            now = self.clock()
            self._watch(now)
            if now >= next_renewal:
                next_renewal = now + (renew_every if self._attempt(self.renew)
                                      else min(RETRY_AFTER_FAILURE, renew_every))
            if self.heartbeat is not None and now >= next_beat:
                every = self.heartbeat.every
                next_beat = now + (every if self._attempt(self.beat)
                                   else min(RETRY_AFTER_FAILURE, every))
            if self.recover_every is not None and now >= next_recovery:
                next_recovery = now + (self.recover_every if self._attempt(self.recover_lapsed)
                                       else min(RETRY_AFTER_FAILURE, self.recover_every))

    def _attempt(self, work: Callable[[], bool | None]) -> bool:
        """Run `work`, keeping the thread alive whatever it raises; True if it succeeded. A
        work that returns False had nothing to send: it says nothing of the database (a
        renewal with no job held, while the heartbeat fails), so no "works again". Work
        that found its kept connection closed by the server meanwhile (a restart, a pooler
        dropping it) runs again at once on a new one before anything is reported."""
        try:
            sent = self._once_more_if_closed_meanwhile(work)
        except Exception as exc:
            problem = f"lease thread failing: {error_text(exc)}"
            if problem != self.problem:
                log.warning("%s; trying again", problem,
                            exc_info=None if isinstance(exc, psycopg.Error) else exc)
            self.problem = problem
            return False
        if self.problem is not None and sent is not False:
            log.info("lease thread works again")
            self.problem = None
        return True

    def _once_more_if_closed_meanwhile(self, work: Callable[[], bool | None]) -> bool | None:
        """`work()`, and once more when the connection it reused had been closed by the
        server while it idled (`closed_meanwhile`)."""
        kept = open_or_none(self._conn)
        try:
            return work()
        except psycopg.Error as exc:
            if not closed_meanwhile(kept, exc):
                raise
        return work()

    def renew(self) -> bool:
        """Renew the leases of the held jobs now; log the claims lost meanwhile. False when
        no job was held (nothing sent). Raises psycopg.Error (the connection is replaced on
        the next call)."""
        now = self.clock()
        with self._lock:
            renewing = {job_id for job_id, held in self._held.items()
                        if held.finishing or now < held.renew_until}
            overdue = [(job_id, held) for job_id, held in self._held.items()
                       if job_id not in renewing]
            for job_id, _ in overdue:
                del self._held[job_id]
        for job_id, held in overdue:
            log.error("job %d (%s) runs past its timeout and a lease more without stopping (a "
                      "handler blocking the event loop?): its lease is left to lapse, and the "
                      "job runs again elsewhere", job_id, held.kind)
        if not renewing:
            return False
        rows = self._execute(RENEW_LEASES, {"ids": sorted(renewing), "lease": self.lease,
                                              "worker_id": self.worker_id})
        lost = renewing - {row["id"] for row in rows}
        self._note_locked({row["id"] for row in rows if not row["renewed"]})
        stopped = self._stopped(lost)
        gone: list[int] = []
        with self._lock:
            for job_id in sorted(lost):
                job = self._held.get(job_id)
                if job is None or job.finishing:
                    continue  # its outcome was written meanwhile: nothing was lost
                del self._held[job_id]
                gone.append(job_id)
                if job_id not in stopped:  # a stop is logged where its handler is cancelled
                    log.warning("job %d (%s): lease lost (recovered elsewhere); its result "
                                "will be discarded", job_id, job.kind)
        if self.lost is not None and self._loop is not None:
            for job_id in gone:
                self._loop.call_soon_threadsafe(self.lost, job_id, job_id in stopped)
        return True

    def _note_locked(self, locked: set[int]) -> None:
        """Warn once per stretch about each held job whose row another session held locked
        through two renewals in a row (its lease was not renewed then; the others were). A
        job being finished holds its own row until its COMMIT, and a stop or another short
        transaction may meet one renewal: those say nothing."""
        with self._lock:
            for job_id in sorted(locked & self._locked - self._locked_told):
                held = self._held.get(job_id)
                if held is None or held.finishing:
                    continue
                log.warning("job %d (%s): another session holds a lock on its row, so its "
                            "lease is not renewed until that lock goes (a handler locking its "
                            "own job's row, or a long transaction); if it lapses meanwhile, "
                            "stale-claim recovery takes the claim back once the lock is gone",
                            job_id, held.kind)
                self._locked_told.add(job_id)
            self._locked = locked
            self._locked_told &= locked

    def _stopped(self, lost: set[int]) -> set[int]:
        """Those of the `lost` claims that a stop took away; empty if that cannot be read
        (then they count as recovered elsewhere: the handler is cancelled all the same)."""
        if not lost:
            return set()
        try:
            return {row["id"] for row in self._execute(STOPPED_JOBS, {"ids": sorted(lost)})}
        except psycopg.Error as exc:
            log.warning("could not read whether lost claims were stopped: %s", error_text(exc))
            return set()

    def beat(self) -> None:
        """Write the worker's registry row now (registering it when missing; the worker's
        start-up calls it before its first claim). Raises psycopg.Error."""
        if self.heartbeat is None:
            return
        with self._conn_lock:
            conn = self._connection()
            try:
                with self._bounded(conn):
                    self.heartbeat.beat(conn)
            except psycopg.Error:
                self._drop_connection()
                raise

    def recover_lapsed(self) -> None:
        """Take back lapsed claims of any worker, unless another worker is doing so now."""
        with self._conn_lock:
            conn = self._connection()
            try:
                with self._bounded(conn), conn.transaction():
                    turn = RECOVERY_TURN.sync(conn)
                    rows = RECOVER_STALE_CLAIMS.sync(conn, {"actor": self.actor}) \
                        if turn and turn["locked"] else []
            except psycopg.Error:
                self._drop_connection()
                raise
        log_recovered(rows)

    def _watch(self, now: float) -> None:
        """Log the event loop blocked, naming what holds it (`watch_loop` logs for how long
        once it runs again)."""
        seen = self._loop_seen
        if now - seen >= LOOP_BLOCKED_AFTER and self._blocked_since is None:
            self._blocked_by = self._culprit()
            self._blocked_since = seen
            log.warning("the event loop has not run for %.1fs: %s blocks it (a handler must "
                        "not call blocking code: use asyncio.to_thread); leases are renewed "
                        "meanwhile", now - seen, self._blocked_by)

    def _culprit(self) -> str:
        """The job (and kind) whose task the event loop runs now, or the task's name."""
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            return "code outside any task"
        name = task.get_name()
        job_id = name.removeprefix("job-")
        if job_id.isdigit():
            with self._lock:
                held = self._held.get(int(job_id))
            return f"job {job_id} ({held.kind if held else 'finished'})"
        return f"task {name}"

    def _execute(self, query: Many, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._conn_lock:
            conn = self._connection()
            try:
                with self._bounded(conn):
                    return query.sync(conn, params)
            except psycopg.Error:
                self._drop_connection()
                raise

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        """The lease connection (autocommit, `lease_session`), opened on first use or after
        it failed. No prepared statements: a statement every few seconds gains nothing from
        them, and a pooler in transaction mode refuses them."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        params = conninfo_to_dict(with_tcp_liveness(self.dsn))
        params.setdefault("application_name", APPLICATION_NAME)
        params.setdefault("connect_timeout", CONNECT_TIMEOUT)
        conn = count_as_own(psycopg.Connection.connect(
            make_conninfo("", **params), autocommit=True, row_factory=dict_row,
            prepare_threshold=None))
        conn.isolation_level = OWN_ISOLATION  # stated in each BEGIN (`_bounded`, recovery)
        try:
            if not self.transaction_pooler:
                LEASE_SESSION.sync(conn, self._timeouts())
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    @contextlib.contextmanager
    def _bounded(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Run what the block sends on `conn` under the lease connection's timeouts: the
        session's own (`lease_session`, set when it opened) on a direct connection; behind a
        transaction pooler, in a transaction of its own that sets them as SET LOCAL
        (`lease_transaction`): a session setting would stay on whichever server connection
        ran it, and cancel other clients' statements after a renewal period."""
        if not self.transaction_pooler:
            yield
            return
        with conn.transaction():
            LEASE_TRANSACTION.sync(conn, self._timeouts())
            yield

    def _timeouts(self) -> dict[str, int]:
        """The lease connection's lock and statement timeout: a renewal period, in ms."""
        return {"timeout_ms": int(self.lease / 3 * 1000)}

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
