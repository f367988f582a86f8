"""Attribute values and keys (jobpool.kinds.entities.attributes)."""

from __future__ import annotations

import json

import pytest

from jobpool.kinds.entities.attributes import (
    AttributeSpec,
    FieldValueError,
    RejectedRecord,
    ValidRecord,
    check_key,
    coerce_value,
    validate_record,
)

ATTRS = {
    "name": AttributeSpec("name", "string", required=True),
    "age": AttributeSpec("age", "integer"),
    "score": AttributeSpec("score", "number"),
    "active": AttributeSpec("active", "boolean"),
    "born": AttributeSpec("born", "date"),
    "seen": AttributeSpec("seen", "timestamp"),
    "tier": AttributeSpec("tier", "enum", enum_values=("gold", "silver")),
}


@pytest.mark.parametrize("key", ["customer", "a", "a1_b2", "x" * 40])
def test_good_keys_pass(key: str) -> None:
    assert check_key("type_key", key) == key


@pytest.mark.parametrize("key", [
    "x; drop table mdm.aa_job", "a" * 41, "a" * 70, "Customer", "1abc", "_a", "", "a-b",
    "a\x00", 'a"b', None, 7,
])
def test_bad_keys_are_refused_naming_the_rule(key: object) -> None:
    with pytest.raises(ValueError, match=r"invalid type_key .*\^\[a-z\]\[a-z0-9_\]\{0,39\}\$"):
        check_key("type_key", key)


@pytest.mark.parametrize(("spec", "value", "stored"), [
    ("age", "42", 42), ("age", " -7 ", -7), ("age", 2**63 - 1, 2**63 - 1),
    ("score", "2.5", 2.5), ("score", "1e3", 1000), ("score", 3, 3),
    ("active", "YES", True), ("active", "0", False), ("active", False, False),
    ("born", "2024-02-29", "2024-02-29"),
    ("seen", "2024-03-01T10:00:00+01:00", "2024-03-01T09:00:00.000000Z"),
    ("seen", "2024-03-01T10:00:00.5Z", "2024-03-01T10:00:00.500000Z"),
    ("tier", "gold", "gold"), ("name", "Ünïcode", "Ünïcode"),
])
def test_values_are_stored_in_their_canonical_form(spec: str, value: object,
                                                   stored: object) -> None:
    assert coerce_value(ATTRS[spec], value) == stored


@pytest.mark.parametrize(("spec", "value", "message"), [
    ("age", "99999999999999999999", "out of range for a 64-bit integer"),
    ("age", 2**63, "out of range"), ("age", "4.5", "is not an integer"),
    ("age", True, "is not an integer"), ("score", "1e400", "out of range"),
    ("score", float("nan"), "out of range"), ("score", "abc", "is not a number"),
    ("active", "maybe", "is not a boolean"), ("born", "2023-02-30", "is not a valid date"),
    ("born", "01.02.2023", "is not a date"), ("seen", "2024-03-01T10:00:00", "lacks a UTC offset"),
    ("seen", "yesterday", "is not an ISO 8601 timestamp"), ("tier", "bronze", "is not one of"),
    ("name", "a\x00b", "contains a NUL character"), ("name", 5, "expected text"),
])
def test_bad_values_name_the_field(spec: str, value: object, message: str) -> None:
    with pytest.raises(FieldValueError, match=f"field '{spec}': .*{message}"):
        coerce_value(ATTRS[spec], value)


def _record(**fields: object) -> str:
    return json.dumps({"external_key": "k1", **fields})


def test_a_valid_record_keeps_only_given_values() -> None:
    checked = validate_record(_record(name="A", age="", tier=None), ATTRS,
                              key_field="external_key")
    assert checked == ValidRecord("k1", {"name": "A"})


def test_every_problem_is_reported_and_the_first_field_named() -> None:
    checked = validate_record(_record(age="x", colour="red"), ATTRS, key_field="external_key",
                              type_key="customer")
    assert isinstance(checked, RejectedRecord)
    assert checked.field == "name"
    assert "field 'name': is required" in checked.message
    assert "field 'age'" in checked.message
    assert "field 'colour': is not an attribute of type 'customer'" in checked.message


def test_unknown_keys_can_be_ignored() -> None:
    checked = validate_record(_record(name="A", colour="red"), ATTRS, key_field="external_key",
                              unknown_keys="ignore")
    assert checked == ValidRecord("k1", {"name": "A"})


@pytest.mark.parametrize(("raw", "field", "message"), [
    ("{not json", None, "not valid JSON"), ("[1]", None, "must be an object"),
    (json.dumps({"name": "A"}), "external_key", "external key is required"),
    (json.dumps({"external_key": "k" * 256, "name": "A"}), "external_key", "longer than 255"),
    (json.dumps({"external_key": "a\x00", "name": "A"}), "external_key", "NUL"),
])
def test_records_without_a_usable_shape_or_key_are_rejected(raw: str, field: str | None,
                                                            message: str) -> None:
    checked = validate_record(raw, ATTRS, key_field="external_key")
    assert isinstance(checked, RejectedRecord)
    assert checked.field == field and message in checked.message
