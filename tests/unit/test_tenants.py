import pytest

from jobpool.core.tenants import check_tenant_key


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


def test_a_key_may_not_shadow_a_tenant_id() -> None:
    with pytest.raises(ValueError, match="must not look like a tenant id"):
        check_tenant_key("00000000-0000-0000-0000-000000000000")
