"""The database link's outage paths, on a fake of its own `Connector` protocol.

Real outages (a restarted server, terminated sessions) are in tests/integration/
test_outages.py; here the connector answers or fails when told to, so that going offline,
reconnecting, the pool's replacement and the refusal at the start are driven on purpose.
"""

from __future__ import annotations

import asyncio
import random

import psycopg
import pytest

from jobpool.errors import ConnectionBudgetError, SchemaNotMigratedError
from jobpool.worker.background import BackgroundTasks
from jobpool.worker.database_link import DatabaseLink

LOST = psycopg.OperationalError("server closed the connection unexpectedly")


class FakeConnector:
    """Probes fail with what `down` holds (first first); `attach` records each call."""

    def __init__(self) -> None:
        self.down: list[Exception] = []
        self.fits = 0
        self.attached: list[tuple[str | None, bool]] = []
        self.pools = 0

    async def probe(self) -> None:
        if self.down:
            raise self.down.pop(0)

    async def fit(self) -> None:
        self.fits += 1

    async def attach(self, store: str | None, *, replace: bool) -> str:
        self.attached.append((store, replace))
        if store is None or replace:
            self.pools += 1
        return "store"


class Arrivals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    async def __call__(self, store: str, first: bool) -> None:
        self.seen.append((store, first))


def link(connector: FakeConnector, arrivals: Arrivals | None = None,
         refused: list[bool] | None = None) -> DatabaseLink[str]:
    return DatabaseLink(connector, arrive=arrivals or Arrivals(), background=BackgroundTasks(),
                        wake=asyncio.Event(),
                        refused=lambda: (refused if refused is not None else []).append(True),
                        rng=random.Random(3))


async def online(dl: DatabaseLink[str]) -> None:
    await asyncio.wait_for(dl.online.wait(), 10.0)


async def test_the_first_answer_attaches_a_store_starts_up_and_goes_online() -> None:
    connector, arrivals = FakeConnector(), Arrivals()
    dl = link(connector, arrivals)
    assert dl.problem == "waiting for the database" and not dl.online.is_set()

    await dl.reconnect()

    assert dl.online.is_set() and dl.problem is None and dl.wake.is_set()
    assert dl.store == "store" and dl.started
    assert connector.fits == 1 and connector.attached == [(None, False)]
    assert arrivals.seen == [("store", True)]


async def test_while_the_database_is_down_the_problem_says_why() -> None:
    connector = FakeConnector()
    connector.down = [LOST, SchemaNotMigratedError("the schema is at 3, this worker needs 11")]
    dl = link(connector)
    task = asyncio.create_task(dl.reconnect())
    problems: list[str | None] = []
    while not task.done():
        problems.append(dl.problem)
        await asyncio.sleep(0.01)
    assert "database unreachable: server closed the connection unexpectedly" in problems
    assert "the schema is at 3, this worker needs 11" in problems
    assert dl.online.is_set() and dl.problem is None


async def test_a_lost_connection_takes_the_link_offline_and_back_with_a_fresh_pool() -> None:
    connector, arrivals = FakeConnector(), Arrivals()
    dl = link(connector, arrivals)
    await dl.reconnect()
    connector.down = [LOST]  # still down at the first probe

    dl.lost(LOST)

    assert not dl.online.is_set()
    assert dl.problem == "database unreachable: server closed the connection unexpectedly"
    await online(dl)
    assert connector.attached[-1] == ("store", True)  # replaced: its connections are dead
    assert connector.fits == 2  # the budget is checked again before the new pool
    assert arrivals.seen == [("store", True), ("store", False)]  # then leftovers are settled
    await dl.background.stop()


async def test_a_lost_connection_that_answers_at_once_keeps_the_pool_checked() -> None:
    connector, arrivals = FakeConnector(), Arrivals()
    dl = link(connector, arrivals)
    await dl.reconnect()

    dl.lost(LOST)
    await online(dl)

    assert connector.attached[-1] == ("store", False)  # the pool drops its dead connections
    assert connector.pools == 1 and connector.fits == 1
    await dl.background.stop()


async def test_a_statement_error_on_a_live_connection_keeps_the_link_online() -> None:
    dl = link(FakeConnector())
    await dl.reconnect()
    dl.lost(psycopg.errors.UndefinedTable('relation "nope" does not exist'))
    assert dl.online.is_set() and dl.problem is None
    assert not dl.background.running("reconnect")


async def test_replacing_the_connections_goes_offline_then_onto_a_fresh_pool() -> None:
    connector = FakeConnector()
    dl = link(connector)
    await dl.reconnect()

    dl.replace_connections("claim failed: DuplicatePreparedStatement", pause=0.01)

    assert not dl.online.is_set() and dl.problem == "claim failed: DuplicatePreparedStatement"
    await online(dl)
    assert connector.attached[-1] == ("store", True) and connector.pools == 2
    await dl.background.stop()


async def test_no_slot_in_the_budget_at_the_start_refuses_to_start() -> None:
    connector = FakeConnector()

    async def no_room() -> None:
        raise ConnectionBudgetError("the role may open 2 connections; a worker needs 4")

    connector.fit = no_room  # type: ignore[method-assign]
    refused: list[bool] = []
    dl = link(connector, refused=refused)

    await dl.reconnect()

    assert refused == [True] and not dl.online.is_set() and not dl.started
    assert isinstance(dl.refusal, ConnectionBudgetError)
    assert dl.problem == "connection budget: the role may open 2 connections; a worker needs 4"


async def test_a_write_on_a_lost_connection_is_written_again_once_the_database_answers() -> None:
    dl = link(FakeConnector())
    await dl.reconnect()
    tries: list[int] = []

    async def write() -> bool:
        tries.append(len(tries))
        if len(tries) == 1:
            raise LOST
        return True

    assert await asyncio.wait_for(dl.write(write), 10.0) is True
    assert tries == [0, 1]
    await dl.background.stop()


async def test_a_write_after_a_conflict_is_tried_again_and_other_errors_are_raised() -> None:
    dl = link(FakeConnector())
    await dl.reconnect()
    outcomes: list[BaseException | str] = [
        psycopg.errors.SerializationFailure("could not serialize access"), "written"]

    async def write() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert await dl.write(write) == "written"

    async def refused() -> str:
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    with pytest.raises(psycopg.errors.QueryCanceled):
        await dl.write(refused)
    assert dl.online.is_set()
