"""Token leases and limit parsing: pure, no database (jobpool.core.ratelimit)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobpool.cli_arguments import worker_command
from jobpool.core.crd import API_VERSION
from jobpool.core.poolspec import load_pool_file
from jobpool.core.ratelimit import (
    STORE_RETRY,
    TOKEN_LIFETIME,
    Denied,
    Granted,
    Lease,
    LeaseFirst,
    Need,
    ProviderCaps,
    RateLimit,
    TenantLimits,
    bucket_wait,
    lease_size,
    leased,
    pair_cap,
    parse_provider_caps,
    parse_rate_limit,
    parse_tenant_limits,
    parse_tenant_limits_json,
    store_failed,
    take_token,
    tokens_now,
    wait_time,
)
from jobpool.worker.token_store import (
    PROMISE_LIFETIME,
    TokenStore,
    load_provider_caps,
    requeue_delay,
    warn_uncapped_kinds,
)

HALF = RateLimit(rps=0.5, burst=1)
T = Need("t", "tenant", HALF)
P = Need("p", "provider", RateLimit(rps=10, burst=1))


def test_a_lease_holds_a_fifth_of_a_second_of_the_rate() -> None:
    assert lease_size(RateLimit(rps=5, burst=5)) == 1
    assert lease_size(RateLimit(rps=14, burst=14)) == 2
    assert lease_size(RateLimit(rps=50, burst=50)) == 10  # 1 statement per 10 tokens
    assert lease_size(RateLimit(rps=1000, burst=20)) == 20  # never more than a burst
    assert lease_size(RateLimit(rps=0.01, burst=1)) == 1


def test_tokens_the_bucket_holds_are_due_at_once() -> None:
    assert leased(balance_after=3.0, taken=2, rps=5, now=10.0) == Lease(
        (10.0, 10.0), balance=3.0, leased_at=10.0)


def test_tokens_owed_are_due_when_the_refill_covers_them() -> None:
    # the bucket held 0.5 before the lease of 3: the 1st is due in 0.1 s, then every 0.2 s
    lease = leased(balance_after=-2.5, taken=3, rps=5, now=10.0)
    assert lease.due == pytest.approx((10.1, 10.3, 10.5))


def test_a_job_takes_one_due_token_from_each_bucket() -> None:
    leases = {"t": Lease((0.0, 2.0)), "p": Lease((0.0,))}
    decision = take_token([T, P], leases, now=0.5)
    assert decision == Granted({"t": Lease((2.0,)), "p": Lease(())})


def test_a_token_not_yet_due_denies_and_takes_nothing() -> None:
    leases = {"t": Lease((0.0,)), "p": Lease((0.25,))}
    assert take_token([T, P], leases, now=0.0) == Denied(retry_after=0.25, scope="provider")
    assert take_token([T, P], leases, now=0.25) == Granted({"t": Lease(()), "p": Lease(())})


def test_the_longest_wait_wins() -> None:
    leases = {"t": Lease((2.0,)), "p": Lease((0.5,))}
    assert take_token([T, P], leases, 0.0) == Denied(retry_after=2.0, scope="tenant")
    assert wait_time([T, P], leases, 0.0) == 2.0
    assert wait_time([], leases, 0.0) == 0.0


def test_a_bucket_without_a_lease_is_leased_first() -> None:
    assert take_token([T, P], {"t": Lease((0.0,))}, 0.0) == LeaseFirst((P,))
    assert wait_time([T, P], {"t": Lease((0.0,))}, 0.0) == 0.0  # claim it, then lease
    # a bucket whose token is not due is waited for: leasing the other first would not help
    assert wait_time([T, P], {"t": Lease((5.0,))}, 0.0) == 5.0


def test_an_unused_token_expires() -> None:
    lease = Lease((0.0, 0.0))
    assert lease.wait(TOKEN_LIFETIME) == 0.0
    assert lease.live(TOKEN_LIFETIME + 0.01) == Lease(())
    assert take_token([T], {"t": lease}, TOKEN_LIFETIME + 0.01) == LeaseFirst((T,))


def test_a_store_that_failed_holds_its_jobs_for_a_while_then_is_asked_again() -> None:
    leases = {"t": store_failed(now=0.0)}
    assert take_token([T], leases, 0.0) == Denied(retry_after=STORE_RETRY, scope="tenant")
    assert take_token([T], leases, STORE_RETRY) == LeaseFirst((T,))


# -- how many jobs of a limited pair a claim may take ------------------------------------

ONE = RateLimit(rps=1, burst=1)
FAST = RateLimit(rps=50, burst=50)  # leases of 10


def test_a_claim_may_take_as_many_jobs_as_tokens_are_due() -> None:
    lease = leased(balance_after=-1.0, taken=4, rps=1, now=0.0)  # 3 due now, 1 in 1 s
    assert tokens_now(FAST, lease, 0.0) == 3
    assert tokens_now(FAST, lease, 1.0) == 4
    assert tokens_now(FAST, Lease((0.0,)), TOKEN_LIFETIME + 0.01) == 10  # expired: lease again


def test_a_bucket_never_leased_here_may_give_a_leases_worth() -> None:
    assert tokens_now(ONE, Lease(), 0.0) == 1
    assert tokens_now(FAST, Lease(), 0.0) == 10
    assert bucket_wait(ONE, Lease(), 0.0) == 0.0


def test_a_spent_lease_waits_for_the_refill_of_the_balance_last_seen() -> None:
    """The bucket held 0 once this process took its token: another lease before a second
    has passed would owe its token, and the job would go back to pending."""
    spent = replace(leased(balance_after=0.0, taken=1, rps=1, now=0.0), due=())
    assert tokens_now(ONE, spent, 0.5) == 0
    assert bucket_wait(ONE, spent, 0.25) == pytest.approx(0.75)
    assert tokens_now(ONE, spent, 1.0) == 1
    assert bucket_wait(ONE, spent, 1.0) == 0.0
    assert tokens_now(ONE, spent, 60.0) == 1  # never more than the burst
    owed = replace(leased(balance_after=-2.0, taken=1, rps=1, now=0.0), due=())
    assert bucket_wait(ONE, owed, 0.0) == pytest.approx(3.0)
    many = replace(leased(balance_after=0.0, taken=10, rps=50, now=0.0), due=())
    assert tokens_now(FAST, many, 0.1) == 5  # 0.1 s of 50 tokens/s
    assert tokens_now(FAST, many, 10.0) == 10  # at most a lease's worth


def test_a_store_that_failed_caps_its_pairs_at_zero_until_asked_again() -> None:
    failed = store_failed(now=0.0)
    assert tokens_now(ONE, failed, 0.0) == 0
    assert bucket_wait(ONE, failed, 0.0) == STORE_RETRY
    assert tokens_now(ONE, failed, STORE_RETRY) == 1


def test_a_pairs_cap_is_its_scarcest_bucket_less_the_tokens_promised() -> None:
    tenant = Need("t", "tenant", FAST)
    provider = Need("p", "provider", RateLimit(rps=10, burst=10))
    leases = {"t": Lease((0.0, 0.0, 0.0)), "p": Lease((0.0, 0.0))}
    assert pair_cap([tenant, provider], leases, {}, 0.0) == 2
    assert pair_cap([tenant, provider], leases, {"p": 1}, 0.0) == 1
    assert pair_cap([tenant, provider], leases, {"t": 5}, 0.0) == 0
    assert pair_cap([], leases, {}, 0.0) is None  # unlimited



RPS_RANGE = "rps: must be a number of tokens per second from 0.00001 to 100000, got"
BURST_RANGE = "burst: must be a whole number from 1 to 100000, got"


@pytest.mark.parametrize(("raw", "message"), [
    ({"rps": 0}, f"{RPS_RANGE} 0"),
    ({"rps": -1, "burst": 1}, f"{RPS_RANGE} -1"),
    ({"rps": "fast"}, f"{RPS_RANGE} 'fast'"),
    ({"rps": "5"}, f"{RPS_RANGE} '5'"),
    ({"rps": True}, f"{RPS_RANGE} True"),
    ({"rps": float("nan")}, f"{RPS_RANGE} nan"),
    ({"rps": float("inf")}, f"{RPS_RANGE} inf"),
    ({"rps": 10**400}, f"{RPS_RANGE} a number of about 400 digits"),  # jsonb's 1e400, read back
    ({"rps": 1e308}, f"{RPS_RANGE} 1e+308"),
    ({"rps": 1e-320}, f"{RPS_RANGE} 1e-320"),
    ({"burst": 5}, f"{RPS_RANGE} None"),
    ({"rps": 1, "burst": 0}, f"{BURST_RANGE} 0"),
    ({"rps": 1, "burst": 1.5}, f"{BURST_RANGE} 1.5"),
    ({"rps": 1, "burst": True}, f"{BURST_RANGE} True"),
    ({"rps": 1, "burst": 10**30}, f"{BURST_RANGE} {10**30}"),
    ({"rps": 1, "burst": float("inf")}, f"{BURST_RANGE} inf"),
    ({"rps": 1, "brust": 2}, "unknown field(s) brust"),
    ([1, 2], "expected an object"),
])
def test_bad_limits_are_named(raw: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rate_limit(raw, "x.y")
    assert str(info.value).startswith("x.y")
    assert message in str(info.value)


def test_limits_at_the_bounds_are_accepted() -> None:
    assert parse_rate_limit({"rps": 0.00001}, "x") == RateLimit(0.00001, 1)
    assert parse_rate_limit({"rps": 100_000}, "x") == RateLimit(100_000.0, 100_000)
    assert parse_rate_limit({"rps": 1, "burst": 100_000}, "x") == RateLimit(1.0, 100_000)


def test_burst_defaults_to_ceil_rps() -> None:
    assert parse_rate_limit({"rps": 2.5}, "x") == RateLimit(2.5, 3)
    assert parse_rate_limit({"rps": 0.2}, "x") == RateLimit(0.2, 1)
    assert parse_rate_limit({"rps": 1, "burst": 4.0}, "x") == RateLimit(1.0, 4)


def test_tenant_limits_fall_back_to_the_wildcard() -> None:
    limits, problems = parse_tenant_limits(
        {"email_send": {"rps": 1, "burst": 2}, "*": {"rps": 5}}, "acme")
    assert problems == []
    assert limits.for_kind("email_send") == RateLimit(1, 2)
    assert limits.for_kind("reindex") == RateLimit(5, 5)


def test_a_bad_tenant_entry_is_dropped_and_reported_not_raised() -> None:
    limits, problems = parse_tenant_limits(
        {"email_send": {"rps": "x"}, "reindex": {"rps": 1}}, "acme")
    assert limits.for_kind("email_send") is None
    assert limits.for_kind("reindex") == RateLimit(1, 1)
    assert problems == [f"tenant acme: rate_limit.email_send.{RPS_RANGE} 'x'"]
    assert parse_tenant_limits("fast", "acme")[1] == [
        "tenant acme: rate_limit must be an object, got 'fast'"]


def test_provider_caps_contract() -> None:
    caps = parse_provider_caps(
        {"providers": {"ses": {"rps": 14, "burst": 20}}, "kinds": {"email_send": "ses"}})
    assert caps.for_kind("email_send") == ("ses", RateLimit(14, 20))
    assert caps.for_kind("reindex") is None


@pytest.mark.parametrize(("raw", "message"), [
    ({"kinds": {"email_send": "ses"}}, "kinds.email_send: provider 'ses' is not declared"),
    ({"providers": {"ses": {"burst": 1}}}, "providers.ses.rps"),
    ({"provider": {}}, "unknown key(s) provider"),
    ("ses", "expected an object"),
])
def test_bad_provider_caps_are_named(raw: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_provider_caps(raw)
    assert message in str(info.value)


def test_provider_caps_from_json_text_or_a_yaml_file(tmp_path: Path) -> None:
    doc = {"providers": {"ses": {"rps": 5, "burst": 5}}, "kinds": {"email_send": "ses"}}
    assert load_provider_caps(json.dumps(doc)).for_kind("email_send") == ("ses", RateLimit(5, 5))
    path = tmp_path / "caps.yaml"
    path.write_text("providers:\n  ses: {rps: 5}\nkinds:\n  email_send: ses\n")
    assert load_provider_caps(f"@{path}").for_kind("email_send") == ("ses", RateLimit(5, 5))
    assert load_provider_caps(None).providers == {}
    with pytest.raises(ValueError, match=r"JOBPOOL_RATE_LIMITS file .*missing\.yaml: cannot read"):
        load_provider_caps("@/nonexistent/missing.yaml")
    with pytest.raises(ValueError, match="JOBPOOL_RATE_LIMITS: not valid YAML"):
        load_provider_caps("{providers: [")


@pytest.mark.parametrize("content", [
    "root:$6$s3cret:19000:0:99999:7:::\n",
    "root: $6$s3cret\nfoo: [bar\n",
    '{"providers": {"smtp": {"rps": "s3cret"}}}',
    '{"providers": {"s3cret": 5}}',
])
def test_a_rate_limits_file_is_never_quoted_in_errors(tmp_path: Path, content: str) -> None:
    """The path comes from the environment and may name a file of secrets."""
    path = tmp_path / "shadow"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"file .*shadow: not usable rate limits") as info:
        load_provider_caps(f"@{path}")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(("path", "message"), [
    ("/dev/zero", "longer than 1048576 bytes"),
    ("/", "it is a directory, not a file"),
])
def test_a_rate_limits_file_is_read_within_a_bound(path: str, message: str) -> None:
    """`@/dev/zero` never ends: the read stops one byte past the limit."""
    with pytest.raises(ValueError, match=f"JOBPOOL_RATE_LIMITS file {path}: {message}"):
        load_provider_caps(f"@{path}")


def test_a_rate_limits_file_that_is_not_utf8_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "binary"
    path.write_bytes(b"providers: \xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8 text \\(byte 12 cannot be decoded\\)"):
        load_provider_caps(f"@{path}")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


TENANT = "7c4b5bd2-3f0e-4c43-9d0f-4f8a4a3f8e01"
OTHER = "0e3f5c55-2f8a-4a5e-9a68-7f0f9c6c2b10"


def row(tenant: str, key: str, rate_limit: object) -> dict[str, object]:
    """A `tenant_rate_limits` row: the limits as the JSON text PostgreSQL prints."""
    return {"id": tenant, "key": key,
            "rate_limit": None if rate_limit is None else json.dumps(rate_limit)}


NO_POOL: Any = None
"""The pool of a token store that holds every token it is asked for (it never leases)."""


def limiter_with(rate_limit: object, caps: str | None = None) -> tuple[TokenStore, Clock]:
    clock = Clock()
    limiter = TokenStore(load_provider_caps(caps), clock=clock)
    limiter.set_tenant_limits([row(TENANT, "acme", rate_limit), row(OTHER, "beta", None)])
    return limiter, clock


def test_a_pair_is_left_out_of_claims_until_its_token_is_due() -> None:
    limiter, clock = limiter_with({"k": {"rps": 0.5, "burst": 1}})
    limiter.pairs = {(TENANT, "k"), (OTHER, "k")}
    limiter.leases[f"tenant/{TENANT}/k"] = Lease((clock.now + 2.0,))
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 0}  # the unlimited tenant never is
    clock.now += 2.0
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 1}


def test_every_pair_a_tenants_limit_covers_is_capped_before_its_first_job() -> None:
    limiter, _ = limiter_with({"k": {"rps": 50, "burst": 50}, "*": {"rps": 1}})
    assert limiter.claim_caps(["k", "j"]) == {f"{TENANT}/k": 10, f"{TENANT}/j": 1}


def test_an_owed_provider_token_throttles_every_known_tenant_of_its_kinds() -> None:
    caps = '{"providers": {"ses": {"rps": 1, "burst": 1}}, "kinds": {"k": "ses"}}'
    limiter, clock = limiter_with(None, caps)
    limiter.pairs = {(TENANT, "k"), (OTHER, "k")}
    limiter.leases["provider/ses"] = Lease((clock.now + 1.0,))
    assert limiter.claim_caps(["k", "j"]) == {f"{TENANT}/k": 0, f"{OTHER}/k": 0, "*/k": 0}
    clock.now += 1.0
    limiter.claimed([{"tenant_id": TENANT, "job_kind": "k"}])
    # the kind's cap also bounds the pairs of tenants this worker has not met yet
    assert limiter.claim_caps(["k", "j"]) == {f"{TENANT}/k": 0, f"{OTHER}/k": 0, "*/k": 0}
    limiter.promised.clear()
    assert limiter.claim_caps(["k", "j"]) == {f"{TENANT}/k": 1, f"{OTHER}/k": 1, "*/k": 1}


def test_claimed_jobs_hold_their_tokens_from_the_next_claims_until_they_ask() -> None:
    limiter, clock = limiter_with({"k": {"rps": 50, "burst": 50}})
    limiter.leases[f"tenant/{TENANT}/k"] = Lease((clock.now,) * 3)
    limiter.claimed([{"tenant_id": TENANT, "job_kind": "k"}] * 2
                    + [{"tenant_id": OTHER, "job_kind": "k"}])  # unlimited: not counted
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 1}
    asyncio.run(limiter.acquire(NO_POOL, TENANT, "k"))  # one asks (and takes a token)
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 1}
    clock.now += PROMISE_LIFETIME + 0.01  # the other was handed back unstarted; tokens expired
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 10}
    assert limiter.promised == {}


def test_a_removed_limit_forgets_its_leases() -> None:
    limiter, clock = limiter_with({"k": {"rps": 0.01, "burst": 1}})
    limiter.pairs = {(TENANT, "k")}
    limiter.leases[f"tenant/{TENANT}/k"] = Lease((clock.now + 100.0,))
    limiter.claimed([{"tenant_id": TENANT, "job_kind": "k"}])
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 0}
    limiter.set_tenant_limits([row(TENANT, "acme", None)])
    assert limiter.claim_caps(["k"]) == {}
    assert limiter.leases == {}
    assert limiter.promised == {}


def test_labels_use_the_tenant_key() -> None:
    limiter, _ = limiter_with(None)
    assert limiter.tenant_label(TENANT) == "acme"
    assert limiter.tenant_label("unknown") == "unknown"


def test_requeue_delay_is_capped_so_relaxed_limits_reach_parked_jobs() -> None:
    assert requeue_delay(Denied(2.0, "tenant")) == 2.0
    assert requeue_delay(Denied(3600.0, "tenant")) == 60.0


# -- limits read from the database: one bad entry never disables the others ---------------


JSONB_1E400 = "1" + "0" * 400  # how PostgreSQL prints the jsonb number 1e400


@pytest.mark.parametrize(("text", "problem"), [
    (f'{{"k": {{"rps": {JSONB_1E400}}}, "j": {{"rps": 2}}}}', f"rate_limit.k.{RPS_RANGE} inf"),
    (f'{{"k": {{"rps": 1{"0" * 5000}}}, "j": {{"rps": 2}}}}', f"rate_limit.k.{RPS_RANGE} inf"),
    (f'{{"k": {{"rps": 1, "burst": {JSONB_1E400}}}, "j": {{"rps": 2}}}}',
     f"rate_limit.k.{BURST_RANGE} inf"),
    ('{"k": {"rps": true}, "j": {"rps": 2}}', f"rate_limit.k.{RPS_RANGE} True"),
    ('{"k": {"rps": "3"}, "j": {"rps": 2}}', f"rate_limit.k.{RPS_RANGE} '3'"),
])
def test_a_number_out_of_range_in_the_database_drops_only_its_entry(text: str,
                                                                   problem: str) -> None:
    limiter, _ = limiter_with(None)
    problems = limiter.set_tenant_limits([
        {"id": TENANT, "key": "acme", "rate_limit": text},
        row(OTHER, "beta", {"k": {"rps": 1, "burst": 1}}),
    ])
    assert problems == [f"tenant acme: {problem}"]
    assert limiter.tenants[TENANT].for_kind("j") == RateLimit(2, 2)  # the tenant's other entry
    assert limiter.tenants[OTHER].for_kind("k") == RateLimit(1, 1)  # and other tenants


def test_limits_json_that_python_cannot_decode_are_reported_not_raised() -> None:
    deep = '{"k": ' + "[" * 5000 + "]" * 5000 + "}"
    limits, problems = parse_tenant_limits_json(deep, "acme")
    assert limits.kinds == {}
    assert problems and problems[0].startswith("tenant acme: rate_limit")
    assert parse_tenant_limits_json(None, "acme") == (TenantLimits({}), [])
    assert parse_tenant_limits_json("null", "acme") == (TenantLimits({}), [])


# -- provider caps: refused where they are written ----------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ('{"providers": {"a": {"rps": .inf, "burst": 5}}}', f"providers.a.{RPS_RANGE} inf"),
    ('{"providers": {"a": {"rps": .nan}}}', f"providers.a.{RPS_RANGE} nan"),
    ('{"providers": {"a": {"rps": 1e400}}}', f"providers.a.{RPS_RANGE} inf"),
    (f'{{"providers": {{"a": {{"rps": {JSONB_1E400}}}}}}}',
     f"providers.a.{RPS_RANGE} a number of about 400 digits"),
    ('{"providers": {"a": {"rps": 5, "burst": 1000000}}}', f"providers.a.{BURST_RANGE} 1000000"),
    ('{"providers": {"a": {"rps": 5}}, "kinds": {"email_send": ["a"]}}',
     "kinds.email_send: expected a provider name, got ['a']"),
    ('{"providers": {"a": {"rps": 1}}}\n---\n{}', "expected one document, found 2"),
    ("providers: " + "[" * 100 + "]" * 100, "nested deeper than 32 levels"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_bad_provider_caps_name_the_variable_and_field(value: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        load_provider_caps(value)
    assert str(info.value).startswith("JOBPOOL_RATE_LIMITS: ")
    assert message in str(info.value)


def test_a_lanes_smallest_rate_reaches_its_workers() -> None:
    """The operator writes JOBPOOL_RATE_LIMITS as JSON, where a small rps reads `1e-05`: a
    string to YAML 1.1, so the value is read as JSON first."""
    written = ProviderCaps({"slow": RateLimit(0.00001, 1)}, {"email_send": "slow"}).to_json()
    assert "1e-05" in written
    assert load_provider_caps(written).for_kind("email_send") == ("slow", RateLimit(0.00001, 1))


ROUND_TRIP_LANES = [
    {"providers": {"slow": {"rps": 0.00001}}, "kinds": {"email_send": "slow"}},
    {"providers": {"ses": {"rps": 2.5}, "hooks": {"rps": 100000, "burst": 100000}},
     "kinds": {"email_send": "ses", "outbox_dispatch": "hooks", "virus_scan": "ses"}},
    {"providers": {"a": {"rps": 3, "burst": 1}, "b": {"rps": 0.3333333333333333}}},
    {"providers": {"unused": {"rps": 1}}},
    {},
]


@pytest.mark.parametrize("rate_limits", ROUND_TRIP_LANES)
def test_pool_spec_to_env_to_worker_is_the_identity(tmp_path: Path,
                                                    rate_limits: dict[str, Any]) -> None:
    """What the operator (and `jobpool run pool.yaml`) writes is what the worker reads: the
    smallest rps too, which its JSON spells `1e-05`."""
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": API_VERSION, "kind": "JobWorkerPool", "metadata": {"name": "p"},
        "spec": {"image": "jobpool:1", "database": {"secretName": "db"},
                 "lanes": [{"name": "a", "rateLimits": rate_limits}]},
    }))
    spec = load_pool_file(path)
    lane = spec.lane("a")
    assert lane.rate_limits is not None
    written = worker_command(spec.worker_run(lane))[1]["JOBPOOL_RATE_LIMITS"]
    assert load_provider_caps(written) == lane.rate_limits
    assert load_provider_caps(written).to_json() == written


def test_the_next_token_of_a_throttled_pair_is_known() -> None:
    limiter, clock = limiter_with({"k": {"rps": 10, "burst": 2}, "j": {"rps": 10, "burst": 2}})
    assert limiter.next_token_in() is None
    limiter.pairs = {(TENANT, "k"), (TENANT, "j")}
    limiter.leases[f"tenant/{TENANT}/k"] = Lease((clock.now + 0.3,))
    limiter.leases[f"tenant/{TENANT}/j"] = Lease((clock.now + 0.1, clock.now + 0.2))
    assert limiter.next_token_in() == pytest.approx(0.1)
    clock.now += 0.1
    assert limiter.next_token_in() == pytest.approx(0.2)  # j has a token due: not throttled


def test_the_refill_of_a_spent_lease_is_a_next_token() -> None:
    limiter, clock = limiter_with({"k": {"rps": 1, "burst": 1}})
    limiter.pairs = {(TENANT, "k")}
    limiter.leases[f"tenant/{TENANT}/k"] = replace(
        leased(balance_after=0.0, taken=1, rps=1, now=clock.now), due=())
    clock.now += 0.25
    assert limiter.next_token_in() == pytest.approx(0.75)
    assert limiter.claim_caps(["k"]) == {f"{TENANT}/k": 0}


def test_a_capped_kind_no_module_registered_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    """A misspelt kind in JOBPOOL_RATE_LIMITS caps nothing: the worker says so at start."""
    with caplog.at_level(logging.WARNING, logger="jobpool.ratelimit"):
        warn_uncapped_kinds(["email_sned", "reindex"], ["email_send", "reindex"])
    assert [r.getMessage() for r in caplog.records] == [
        "JOBPOOL_RATE_LIMITS caps job kind 'email_sned' (did you mean 'email_send'?), which no "
        "module registered: it caps nothing here"]
