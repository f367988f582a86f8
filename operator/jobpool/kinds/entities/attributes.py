"""Entity keys and attribute values: what an import accepts, and how it is stored.

Pure: no I/O. `check_key` guards every user-supplied `type_key`/`attr_key` before it can reach
SQL; `validate_record` turns one staged record into an entity or a rejection naming the field.

Stored forms (the `attributes` jsonb of `mdm.ddm_entity`):

| data type | accepted input | stored as |
| --- | --- | --- |
| string | a string without NUL, at most 10,000 characters | the string |
| integer | a JSON integer or decimal digits, 64-bit signed range | JSON integer |
| number | a JSON number or decimal text, finite as an IEEE double | JSON number |
| boolean | true/false, or text true/false/t/f/yes/no/y/n/1/0 (any case) | JSON boolean |
| date | `YYYY-MM-DD` | `YYYY-MM-DD` |
| timestamp | ISO 8601 with a UTC offset (`Z` or `+hh:mm`) | `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC) |
| enum | one of the attribute's `enum_values` | the string |

Empty text and JSON null mean "no value": an error for a required attribute, otherwise the key
is left out. Unknown keys follow the import's policy: `reject` (default) rejects the record
naming the key, `ignore` drops the key.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

from jobpool.errors import JobpoolError

KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
"""type_key and attr_key: a lower-case letter, then up to 39 lower-case letters, digits or `_`."""

DataType = Literal["string", "integer", "number", "boolean", "date", "timestamp", "enum"]
UnknownKeys = Literal["reject", "ignore"]

MAX_STRING = 10_000
MAX_EXTERNAL_KEY = 255
MAX_FIELDS = 2_000
"""Fields of one record (CSV columns, JSON keys): far above the few hundred attributes of the
widest master-data types, low enough that one record's checks stay cheap."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INTEGER_TEXT = re.compile(r"^[+-]?\d+$")
_NUMBER_TEXT = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_DATE_TEXT = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TRUE = frozenset({"true", "t", "yes", "y", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "0"})


def _shown(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def check_key(what: str, value: object) -> str:
    """Return `value` if it matches KEY_PATTERN, else raise ValueError naming `what` and the rule.

    what: "type_key" or "attr_key" (for the message). Nothing else is done with a bad value.
    """
    if isinstance(value, str) and KEY_PATTERN.fullmatch(value):
        return value
    raise ValueError(
        f"invalid {what} {_shown(value)}: must match {KEY_PATTERN.pattern} (a lower-case "
        "letter, then up to 39 lower-case letters, digits or '_')"
    )


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute of an entity type, as validation needs it."""

    key: str
    data_type: DataType
    required: bool = False
    enum_values: tuple[str, ...] | None = None


class FieldValueError(JobpoolError, ValueError):
    """A value that its attribute does not accept; the message names the field."""


def _has_nul(text: str) -> bool:
    return "\x00" in text


def _as_string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__} {_shown(value)}")
    if _has_nul(value):
        raise ValueError("contains a NUL character")
    if len(value) > MAX_STRING:
        raise ValueError(f"is longer than {MAX_STRING} characters")
    return value


def _as_integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{_shown(value)} is not an integer")
    if isinstance(value, str) and not _INTEGER_TEXT.fullmatch(value.strip()):
        raise ValueError(f"{_shown(value)} is not an integer")
    if isinstance(value, str) and len(value.strip().lstrip("+-").lstrip("0")) > 19:
        raise ValueError(f"{_shown(value)} is out of range for a 64-bit integer")
    number = int(value.strip()) if isinstance(value, str) else value
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"{_shown(value)} is out of range for a 64-bit integer")
    return number


def _as_number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{_shown(value)} is not a number")
    if isinstance(value, str) and not _NUMBER_TEXT.fullmatch(value.strip()):
        raise ValueError(f"{_shown(value)} is not a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{_shown(value)} is out of range for a number (IEEE double)")
    if number.is_integer() and abs(number) < 2**53:
        return int(number)
    return number


def _as_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{_shown(value)} is not a boolean (true/false)")


def _as_date(value: Any) -> str:
    text = _as_string(value).strip()
    if not _DATE_TEXT.fullmatch(text):
        raise ValueError(f"{_shown(value)} is not a date (YYYY-MM-DD)")
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise ValueError(f"{_shown(value)} is not a valid date") from None


def _as_timestamp(value: Any) -> str:
    text = _as_string(value).strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{_shown(value)} is not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        raise ValueError(f"{_shown(value)} lacks a UTC offset (e.g. Z or +01:00)")
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{_shown(value)} is out of range for a timestamp") from None
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _as_enum(value: Any, allowed: tuple[str, ...]) -> str:
    text = _as_string(value)
    if text not in allowed:
        listed = ", ".join(repr(v) for v in allowed[:10]) + (", ..." if len(allowed) > 10 else "")
        raise ValueError(f"{_shown(value)} is not one of {listed}")
    return text


def coerce_value(spec: AttributeSpec, value: Any) -> Any:
    """The stored form of `value` for `spec`; raises FieldValueError naming the field."""
    try:
        match spec.data_type:
            case "string":
                return _as_string(value)
            case "integer":
                return _as_integer(value)
            case "number":
                return _as_number(value)
            case "boolean":
                return _as_boolean(value)
            case "date":
                return _as_date(value)
            case "timestamp":
                return _as_timestamp(value)
            case "enum":
                return _as_enum(value, spec.enum_values or ())
    except ValueError as exc:
        raise FieldValueError(f"field {spec.key!r}: {exc}") from None


def is_missing(value: Any) -> bool:
    """JSON null, or text that is empty or only whitespace: no value."""
    return value is None or (isinstance(value, str) and not value.strip())


@dataclass(frozen=True)
class ValidRecord:
    """A record that becomes (or updates) the entity `external_key`."""

    external_key: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class RejectedRecord:
    """A record that is not imported; `field` is the first offending field (None: the record)."""

    field: str | None
    message: str


Validated = ValidRecord | RejectedRecord


def parse_raw(raw: str) -> Any:
    """Decode a staged record (JSON text); raises ValueError with a short reason."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"record is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError("record is nested too deeply") from None
    except ValueError:  # Python's bound on reading integers
        raise ValueError(f"record holds a number of more than {sys.get_int_max_str_digits()} "
                         "digits") from None


def _external_key(record: Mapping[str, Any], key_field: str) -> str:
    value = record.get(key_field)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if is_missing(value):
        raise FieldValueError(f"field {key_field!r}: the external key is required")
    if not isinstance(value, str):
        raise FieldValueError(f"field {key_field!r}: the external key must be text")
    if _has_nul(value):
        raise FieldValueError(f"field {key_field!r}: contains a NUL character")
    if len(value) > MAX_EXTERNAL_KEY:
        raise FieldValueError(f"field {key_field!r}: longer than {MAX_EXTERNAL_KEY} characters")
    return value


def validate_record(
    raw: str, attributes: Mapping[str, AttributeSpec], *, key_field: str,
    unknown_keys: UnknownKeys = "reject", type_key: str = "",
) -> Validated:
    """Check one staged record against its type's attributes (see the module docstring).

    Every problem is reported, joined by "; "; `field` is the first field at fault.
    """
    try:
        record = parse_raw(raw)
    except ValueError as exc:
        return RejectedRecord(None, str(exc))
    if not isinstance(record, dict):
        return RejectedRecord(None, f"record must be an object, got {type(record).__name__}")
    if len(record) > MAX_FIELDS:
        return RejectedRecord(None, f"record has {len(record):,} fields, more than the limit "
                                    f"of {MAX_FIELDS:,}")
    errors: list[tuple[str, str]] = []
    external_key = ""
    try:
        external_key = _external_key(record, key_field)
    except FieldValueError as exc:
        errors.append((key_field, str(exc)))
    stored: dict[str, Any] = {}
    for key, spec in attributes.items():
        value = record.get(key)
        if is_missing(value):
            if spec.required:
                errors.append((key, f"field {key!r}: is required"))
            continue
        try:
            stored[key] = coerce_value(spec, value)
        except FieldValueError as exc:
            errors.append((key, str(exc)))
    if unknown_keys == "reject":
        for key in record:
            if key not in attributes and key != key_field:
                errors.append((key, f"field {_shown(key)}: is not an attribute of type "
                                    f"{type_key or '?'!r}"))
    if errors:
        return RejectedRecord(errors[0][0].replace("\x00", "\\0"),
                              "; ".join(message for _, message in errors))
    return ValidRecord(external_key, stored)
