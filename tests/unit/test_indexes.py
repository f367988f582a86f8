"""Index names, drift plans and EXPLAIN reading (jobpool.kinds.indexes.index_plans)."""

from __future__ import annotations

import pytest

from jobpool.errors import InvalidPayloadError
from jobpool.kinds.indexes.index_plans import (
    BuildPayload,
    BuildTimeouts,
    ExistingIndex,
    attribute_index_name,
    gin_index_name,
    plan_index,
    plan_outline,
    plan_uses_index,
)
from jobpool.payloads import decode_payload

TENANT = "7d7b9a52-3a0e-4e0b-9d55-1f9a3c3a2f10"
OTHER = "0c5e7c1e-62a2-4f53-8d4f-3f3fd1b1a111"


def test_names_are_deterministic_and_fit_63_bytes() -> None:
    longest = attribute_index_name(TENANT, "t" * 40, "a" * 40)
    assert longest == attribute_index_name(TENANT, "t" * 40, "a" * 40)
    assert len(longest.encode()) <= 63
    assert len(gin_index_name(TENANT, "t" * 40).encode()) <= 63
    assert gin_index_name(TENANT, "supplier").startswith("ix_entity_attributes_gin_supplier_")


def test_names_differ_by_tenant_and_by_keys_cut_off_in_the_readable_part() -> None:
    assert gin_index_name(TENANT, "supplier") != gin_index_name(OTHER, "supplier")
    first = attribute_index_name(TENANT, "t" * 40, "a" * 39 + "x")
    second = attribute_index_name(TENANT, "t" * 40, "a" * 39 + "y")
    assert first[:52] == second[:52] and first != second


def test_names_refuse_hostile_keys() -> None:
    with pytest.raises(ValueError, match="invalid attr_key"):
        attribute_index_name(TENANT, "customer", 'x"; drop table mdm.aa_job; --')


VALID = ExistingIndex("ddm_entity", valid=True, ready=True, comment="sig")


@pytest.mark.parametrize(("signature", "existing", "action"), [
    ("sig", None, "build"),
    ("sig", VALID, "keep"),
    ("sig", ExistingIndex("ddm_entity", valid=False, ready=True, comment="sig"), "rebuild"),
    ("sig", ExistingIndex("ddm_entity", valid=False, ready=False, comment=None), "rebuild"),
    ("sig", ExistingIndex("ddm_entity", valid=True, ready=True, comment="other"), "rebuild"),
    ("sig", ExistingIndex("aa_job", valid=True, ready=True, comment="sig"), "rebuild"),
    (None, VALID, "drop"),
    (None, None, "absent"),
])
def test_the_drift_check_never_trusts_an_invalid_index(
    signature: str | None, existing: ExistingIndex | None, action: str
) -> None:
    assert plan_index(signature, existing).action == action


EXPLAIN = [{"Plan": {"Node Type": "Limit", "Plans": [
    {"Node Type": "Index Scan", "Index Name": "ix_a", "Relation Name": "ddm_entity"}]}}]


def test_reading_an_explain_result() -> None:
    assert plan_uses_index(EXPLAIN, "ix_a") is True
    assert plan_uses_index(EXPLAIN, "ix_b") is False
    assert plan_outline(EXPLAIN) == "Limit > Index Scan using ix_a"


def test_timeouts_come_from_the_payload_or_the_default() -> None:
    default = BuildTimeouts(lock_timeout=60, statement_timeout=3600)
    assert decode_payload("x", BuildPayload, {}).timeouts(default) is default
    assert decode_payload("x", BuildPayload, {"lock_timeout": 1}).timeouts(
        default).as_settings() == {"lock_timeout": "1000", "statement_timeout": "3600000"}
    with pytest.raises(InvalidPayloadError, match=r"payload\.lock_timeout"):
        decode_payload("x", BuildPayload, {"lock_timeout": "soon"})
    with pytest.raises(InvalidPayloadError, match=r">= 0.0 - at `payload\.statement_timeout`"):
        decode_payload("x", BuildPayload, {"statement_timeout": -1})
