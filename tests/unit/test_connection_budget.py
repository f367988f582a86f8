"""The connection budget: the slots a worker runs with for what the role and server allow."""

from __future__ import annotations

import pytest

from jobpool.core.connection_budget import Allowance, Need, plan_slots
from jobpool.errors import ConnectionBudgetError


def allowance(*, role_limit: int = -1, role_in_use: int = 1, server_max: int = 100,
              reserved: int = 3, server_in_use: int = 1) -> Allowance:
    return Allowance(role="app", role_limit=role_limit, role_in_use=role_in_use,
                     server_max=server_max, reserved=reserved, server_in_use=server_in_use)


def test_the_need_counts_slots_own_writes_claims_leases_probe_listener_gauges_upkeep() -> None:
    assert Need(4).total == 4 + 6
    assert Need(4, gauges=True).total == 11
    assert Need(4, listener=False).total == 9
    assert Need(4, maintenance=False).total == 9
    assert Need(4, gauges=True).describe() == (
        "11 (4 slot(s) + own writes + claims + leases + probe + LISTEN + queue gauges + "
        "maintenance)")


def test_every_slot_runs_when_the_need_fits() -> None:
    budget = plan_slots(Need(4), allowance(role_limit=10))
    assert (budget.slots, budget.limit, budget.shortfall()) == (4, None, None)


def test_a_role_limit_below_the_need_leaves_fewer_slots_and_says_which_limit() -> None:
    budget = plan_slots(Need(4), allowance(role_limit=8))
    assert budget.slots == 2
    assert budget.shortfall() == (
        "running 2 of 4 slot(s): the worker needs 10 (4 slot(s) + own writes + claims + leases "
        "+ probe + LISTEN + maintenance) connections, role app's CONNECTION LIMIT 8 - 0 in use "
        "by others leaves 8")


def test_the_role_s_other_sessions_count_against_its_limit() -> None:
    assert plan_slots(Need(4), allowance(role_limit=12, role_in_use=5)).slots == 2


def test_the_server_limit_counts_reserved_and_other_clients() -> None:
    budget = plan_slots(Need(8), allowance(server_max=20, reserved=3, server_in_use=8))
    assert budget.slots == 20 - 3 - 7 - 6
    assert budget.limit is not None and "max_connections 20" in budget.limit


def test_the_tighter_of_role_and_server_wins() -> None:
    tight_server = allowance(role_limit=50, server_max=12, reserved=3, server_in_use=1)
    assert plan_slots(Need(8), tight_server).slots == 12 - 3 - 6
    tight_role = allowance(role_limit=9, server_max=100)
    assert plan_slots(Need(8), tight_role).slots == 3


def test_no_slot_fitting_is_refused_naming_the_limit_and_the_need() -> None:
    with pytest.raises(ConnectionBudgetError) as caught:
        plan_slots(Need(4, gauges=True), allowance(role_limit=7))
    message = str(caught.value)
    assert "role app's CONNECTION LIMIT 7" in message
    assert "needs 11 (4 slot(s)" in message and "at least 8 with one slot" in message


def test_a_role_with_no_limit_is_bounded_by_the_server_alone() -> None:
    assert plan_slots(Need(200), allowance(role_limit=-1, server_max=100)).slots == 100 - 3 - 6
