"""Tenant keys, references (key or id) and metadata: pure rules (jobpool.core.tenants)."""

from __future__ import annotations

import uuid

import pytest

from jobpool.core.tenants import (
    check_tenant_key,
    check_tenant_metadata,
    tenant_id_of,
    tenant_ref,
    tenant_uuid,
)


@pytest.mark.parametrize("key", ["acme", "a", "acme-eu.1", "globex_2", "0day", "x" * 63])
def test_valid_keys(key: str) -> None:
    assert check_tenant_key(key) == key


@pytest.mark.parametrize(
    "key",
    ["", "Acme", "with space", "ünïcode", "-lead", "x" * 64, "Robert'); DROP TABLE mdm.aa_job;--"],
)
def test_invalid_keys_name_the_rule(key: str) -> None:
    with pytest.raises(ValueError, match="lower-case letters, digits"):
        check_tenant_key(key)


@pytest.mark.parametrize("key", [
    "00000000-0000-0000-0000-000000000000",
    "e177aafe45304604974c4d04e62e9995",  # what uuid.UUID, so enqueue's tenant_id, reads too
    "e177aafe-45304604-974c4d04-e62e9995",
])
def test_a_key_may_not_shadow_a_tenant_id(key: str) -> None:
    with pytest.raises(ValueError, match="must not look like a tenant id"):
        check_tenant_key(key)
    assert check_tenant_key(key[:-1]) == key[:-1]  # 31 hex digits name no uuid


UPPER = "7C4B5BD2-3F0E-4C43-9D0F-4F8A4A3F8E01"


def test_a_tenant_id_is_taken_in_any_case() -> None:
    assert tenant_ref(UPPER) == UPPER.lower()
    assert tenant_ref(UPPER.lower()) == UPPER.lower()
    assert tenant_id_of(tenant_ref(UPPER)) == uuid.UUID(UPPER)
    assert tenant_ref("acme") == "acme" and tenant_id_of("acme") is None
    assert tenant_id_of("7c4b5bd23f0e4c439d0f4f8a4a3f8e01") is None  # a valid key, not an id


@pytest.mark.parametrize("ref", ["ACME", "", "a b", "{" + UPPER + "}", "x" * 64])
def test_a_reference_that_is_neither_key_nor_id_names_both_rules(ref: str) -> None:
    with pytest.raises(ValueError, match=r"is neither a tenant key .* nor a tenant id"):
        tenant_ref(ref)


@pytest.mark.parametrize(("metadata", "message"), [
    ([], "metadata must be a JSON object, got array"),
    (None, "metadata must be a JSON object, got null"),
    ({"rate_limit": {"k": {"rps": 10**400}}}, "tenant acme: rate_limit.k.rps: must be a number"),
    ({"rate_limit": {"k": {"rps": 1e308}}}, "tenant acme: rate_limit.k.rps: must be a number"),
    ({"rate_limit": {"k": {"rps": True}}}, "tenant acme: rate_limit.k.rps: must be a number"),
    ({"rate_limit": {"k": {"rps": 1, "burst": "9"}}}, "tenant acme: rate_limit.k.burst: must be"),
    ({"rate_limit": {"k": {"rps": 1}, "j": {"rps": 0}}}, "tenant acme: rate_limit.j.rps: must be"),
    ({"rate_limit": 5}, "tenant acme: rate_limit must be an object, got 5"),
    ({"x": [{"y": float("nan")}]}, "metadata.x[0].y is nan, which JSON cannot hold"),
    ({"x": "a\x00b"}, "metadata.x contains a NUL character"),
])
def test_metadata_a_worker_could_not_use_is_refused_naming_the_field(metadata: object,
                                                                     message: str) -> None:
    with pytest.raises(ValueError) as info:
        check_tenant_metadata(metadata, "acme")
    assert str(info.value).startswith(message)


def test_metadata_nested_too_deeply_is_refused_without_recursion() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(100_000):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"^metadata is nested more than 32 levels deep"):
        check_tenant_metadata(deep, "acme")
    fine = {"rate_limit": {"email_send": {"rps": 2, "burst": 10}}, "labels": {"tier": ["gold"]}}
    assert check_tenant_metadata(fine, "acme") is fine


def test_metadata_over_64_kib_is_refused_before_its_rate_limits_are_read() -> None:
    """300,000 rate-limited kinds (about 10 MB) would stall every worker that reads them."""
    huge = {"rate_limit": {f"kind_{n}": {"rps": 1} for n in range(300_000)}}
    with pytest.raises(ValueError, match=r"^metadata is \d+ bytes of JSON, more than the "
                                         r"limit of 65536"):
        check_tenant_metadata(huge, "acme")


def test_a_tenant_id_is_read_from_a_uuid_or_its_text() -> None:
    tenant = uuid.uuid4()
    assert tenant_uuid(tenant) is tenant
    assert tenant_uuid(str(tenant).upper()) == tenant


def test_a_tenant_key_where_an_id_belongs_is_named_as_such() -> None:
    """A service that passes the key it knows gets told what to pass instead."""
    with pytest.raises(ValueError, match=r"^tenant_id must be a UUID, got 'acme': it looks like a "
                                         r"tenant key; this takes the tenant's id \(`jobpool "
                                         r"tenants list`"):
        tenant_uuid("acme")


@pytest.mark.parametrize("value", ["not a key", 42, None, ["acme"], "x" * 500])
def test_anything_else_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ValueError) as refused:
        tenant_uuid(value)
    assert str(refused.value).startswith(f"tenant_id must be a UUID, got {repr(value)[:20]}")
    assert "tenant key" not in str(refused.value) and len(str(refused.value)) < 140
