"""The tenant scope of admin tokens, and what the console's overview shows of it (pure)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from jobpool.api.auth import AuthError, Principal, token_tenants
from jobpool.api.overview import rate_limited_pairs, scoped_lanes

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 30, 12, 5, tzinfo=UTC)


def test_a_list_of_tenant_keys_is_the_scope_and_star_is_every_tenant() -> None:
    assert token_tenants({"tenants": ["globex", "acme", "acme"]}, "a") == ("acme", "globex")
    assert token_tenants({"tenants": "*"}, "a") is None
    assert Principal("a", None).scope == "*"
    assert Principal("a", ("acme",)).scope == ["acme"]


@pytest.mark.parametrize(("claims", "status", "message"), [
    ({}, 403, "token of 'a' lacks the 'tenants' claim"),
    ({"tenants": None}, 401, "must be '*' or a list"),
    ({"tenants": []}, 401, "must be '*' or a list"),
    ({"tenants": ["*"]}, 401, "'*' is not a tenant key"),
    ({"tenants": ["acme", "Bad Key"]}, 401, "'Bad Key' is not a tenant key"),
    ({"tenants": ["a"] * 1001}, 401, "1 to 1000 tenant keys"),
    # an issuer that puts tenant ids in the claim: named, not a token that silently sees nothing
    ({"tenants": ["acme", "e9497430-8a3b-4c2d-9e1f-0123456789ab"]}, 401,
     "'e9497430-8a3b-4c2d-9e1f-0123456789ab' is a tenant id, not a tenant key"),
])
def test_a_missing_or_malformed_claim_is_refused(claims: dict[str, Any], status: int,
                                                 message: str) -> None:
    with pytest.raises(AuthError, match=re.escape(message)) as raised:
        token_tenants(claims, "a")
    assert raised.value.status == status


LIMITS = [
    {"key": "acme", "rate_limit": '{"email_send": {"rps": 5, "burst": 10}, '
                                  '"*": {"rps": 1, "burst": 1}, "bad": {"rps": -1}}'},
    {"key": "globex", "rate_limit": "not json"},
]
WAITING = [
    {"tenant": "acme", "kind": "email_send", "waiting": 3, "next_due_at": T1},
    {"tenant": "acme", "kind": "reindex", "waiting": 2, "next_due_at": T1},
    {"tenant": "acme", "kind": "outbox_dispatch", "waiting": 1, "next_due_at": T0},
    {"tenant": "globex", "kind": "email_send", "waiting": 9, "next_due_at": T0},
]


def test_rate_limited_pairs_carry_their_waiting_jobs_and_the_next_due_time() -> None:
    assert rate_limited_pairs(LIMITS, WAITING) == [
        {"tenant": "acme", "kind": "*", "rps": 1, "burst": 1, "waiting": 3, "next_due_at": T0},
        {"tenant": "acme", "kind": "email_send", "rps": 5, "burst": 10, "waiting": 3,
         "next_due_at": T1},
    ]


def test_a_pair_with_nothing_waiting_has_no_due_time() -> None:
    assert rate_limited_pairs(LIMITS[:1], [])[1] == {
        "tenant": "acme", "kind": "email_send", "rps": 5, "burst": 10, "waiting": 0,
        "next_due_at": None}


LANES = [
    {"name": "default", "kinds": None, "exclude_kinds": ["reindex"], "tenants": []},
    {"name": "big", "kinds": ["email_send"], "exclude_kinds": [], "tenants": ["acme", "globex"]},
    {"name": "initech", "kinds": ["email_send"], "exclude_kinds": [], "tenants": ["initech"]},
]


def test_a_scoped_token_sees_the_lanes_of_its_tenants_and_only_their_names() -> None:
    assert scoped_lanes(LANES, None) == LANES
    assert [(lane["name"], lane["tenants"]) for lane in scoped_lanes(LANES, ("globex",))] == [
        ("default", []), ("big", ["globex"])]
