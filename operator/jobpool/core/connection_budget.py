"""The connection budget: how many database connections a worker needs, how many the role
and the server leave it, and how many slots it can run with.

A worker holds one connection per slot (a handler's `tx`), one for its own writes (outcomes
written alone, rate-limit tokens, its live-worker heartbeat), one for claims, one for its
lease thread (renewals and recovery), one for LISTEN (none when poll-only), one for the queue
gauges when it serves /metrics, one, briefly, for the periodic maintenance when its turn comes
(a long-running worker), and one, briefly, for probing the database after a failure (the
others are still held then). A worker that starts with
more slots than the server lets it connect would hold what it got and wait forever for the
rest (claiming nothing), so it starts with the slots that fit, or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobpool.errors import ConnectionBudgetError

OWN_WRITES = 1
CLAIMS = 1
LEASES = 1
PROBE = 1


@dataclass(frozen=True)
class Need:
    """The connections a worker with `slots` slots opens (`total`)."""

    slots: int
    listener: bool = True
    gauges: bool = False
    maintenance: bool = True

    @property
    def fixed(self) -> int:
        """Connections besides the slots' own."""
        return (OWN_WRITES + CLAIMS + LEASES + PROBE + int(self.listener) + int(self.gauges)
                + int(self.maintenance))

    @property
    def total(self) -> int:
        return self.slots + self.fixed

    def describe(self) -> str:
        """`11 (4 slot(s) + own writes + claims + leases + probe + LISTEN + queue gauges +
        maintenance)`."""
        parts = [f"{self.slots} slot(s)", "own writes", "claims", "leases", "probe"]
        parts += (["LISTEN"] * self.listener + ["queue gauges"] * self.gauges
                  + ["maintenance"] * self.maintenance)
        return f"{self.total} ({' + '.join(parts)})"


@dataclass(frozen=True)
class Allowance:
    """What the database lets this worker open, as read on one connection of it.

    role: the role's name; role_limit: its CONNECTION LIMIT (`rolconnlimit`, -1: none);
    role_in_use: the role's sessions now, across databases; server_max: `max_connections`;
    reserved: connections the role may not use (`superuser_reserved_connections`, plus
    `reserved_connections` from PostgreSQL 16; 0 for a superuser); server_in_use: client
    sessions now; held: sessions counted above that are this worker's own (the reading one
    included), which it gives back or keeps within its need.
    """

    role: str
    role_limit: int
    role_in_use: int
    server_max: int
    reserved: int
    server_in_use: int
    held: int = 1

    def free(self) -> tuple[int, str]:
        """The connections this worker may hold, and the limit that sets it (a phrase)."""
        server = self.server_max - self.reserved - self.server_in_use + self.held
        by_server = (server, f"the server's max_connections {self.server_max} - {self.reserved} "
                     f"reserved - {self.server_in_use - self.held} in use by others")
        if self.role_limit < 0:
            return by_server
        role = self.role_limit - self.role_in_use + self.held
        by_role = (role, f"role {self.role}'s CONNECTION LIMIT {self.role_limit} - "
                   f"{self.role_in_use - self.held} in use by others")
        return min(by_role, by_server, key=lambda choice: choice[0])


@dataclass(frozen=True)
class Budget:
    """The slots a worker runs with: `slots` (≤ the wanted ones); `limit` names what cut them
    (None when all fit); `need` the connections wanted, `free` those the database leaves."""

    slots: int
    wanted: Need
    free: int
    limit: str | None

    def shortfall(self) -> str | None:
        """A sentence when the worker runs with fewer slots than configured, else None."""
        if self.limit is None:
            return None
        return (f"running {self.slots} of {self.wanted.slots} slot(s): the worker needs "
                f"{self.wanted.describe()} connections, {self.limit} leaves {self.free}")


def plan_slots(wanted: Need, allowance: Allowance) -> Budget:
    """The slots that fit `allowance`: all of `wanted.slots` if the need fits, else as many
    as leave room for the fixed connections (`Need.fixed`).

    Raises ConnectionBudgetError when not one slot fits (the worker would claim nothing while
    holding its connections).
    """
    free, limit = allowance.free()
    if wanted.total <= free:
        return Budget(wanted.slots, wanted, free, None)
    slots = free - wanted.fixed
    if slots < 1:
        raise ConnectionBudgetError(
            f"{limit} leaves {max(free, 0)} connection(s); the worker needs "
            f"{wanted.describe()}, at least {wanted.fixed + 1} with one slot: raise the limit "
            "or run fewer workers")
    return Budget(slots, wanted, free, limit)
