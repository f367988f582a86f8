"""The pure JSON checks: depth without recursion, storable text, the never-raising loader."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobpool.core.jsondata import (
    MAX_DEPTH,
    MAX_JSONB_BYTES,
    UndecodableJson,
    load_json,
    nesting_depth,
    storable_text,
    text_problem,
    to_json_text,
    within_depth,
)


def deep_text(levels: int, opener: str = '{"a":', closer: str = "}") -> str:
    return opener * levels + "1" + closer * levels


@pytest.mark.parametrize(("text", "depth"), [
    ("1", 0), ('"x"', 0), ("{}", 1), ("[[],[[]]]", 3), ('{"a":[1,{"b":{}}]}', 4),
    ('{"a":"}}}]]]"}', 1), ('{"a":"[[[{{{"}', 1), ('["\\"[[["]', 1), ('["\\\\", [[1]]]', 3),
    ('{"k\\"}":[1]}', 2), ('{"é{": [[{}]]}', 4), (deep_text(5000), 5000),
    (deep_text(3000, "[", "]"), 3000),
])
def test_nesting_depth_ignores_strings_and_needs_no_recursion(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth
    assert nesting_depth(text.encode()) == depth


def test_within_depth_is_exact_at_the_limit() -> None:
    assert within_depth(deep_text(MAX_DEPTH))
    assert not within_depth(deep_text(MAX_DEPTH + 1))
    # many shallow objects: more brackets than the limit, but shallow
    assert within_depth(json.dumps([{"a": [n]} for n in range(1000)]))
    assert within_depth(json.dumps({"a": "{[" * 500}))


@pytest.mark.parametrize(("value", "problem"), [
    ({"t": "a\x00b"}, "result.t contains a NUL character"),
    ({"t": "x\ud800"}, r"result.t contains a lone surrogate (U+D800) at index 1"),
    ({"t": ["ok", "\udc80"]}, "result.t[1] contains a lone surrogate (U+DC80: the byte 0x80"),
    ({"a\x00": 1}, "result has a key that contains a NUL character"),
    ({"x": float("nan")}, "result.x is nan, which JSON cannot hold"),
    ({"x": float("-inf")}, "result.x is -inf, which JSON cannot hold"),
    ({"x": {1, 2}}, "result.x is of type set, which is not JSON"),
    ({(1, 2): 1}, "result has a key of type tuple"),
    ({"x": 10 ** 5000}, "result.x is an integer too long to write as text"),
    ({"odd key": b"bytes"}, "result['odd key'] is of type bytes"),
])
def test_to_json_text_names_the_place_and_the_problem(value: Any, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        to_json_text(value, name="result")
    assert problem in str(caught.value)


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 980, 3000, 100_000])
def test_too_deep_values_are_refused_without_recursion_error(levels: int) -> None:
    with pytest.raises(ValueError, match="payload is nested more than 100 levels deep"):
        to_json_text(nested(levels), name="payload")


def test_a_circular_reference_is_named_and_ends_the_walk() -> None:
    loop: dict[str, Any] = {"b": [1, 2]}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular reference"):
        to_json_text(loop, name="payload")


def test_a_value_past_what_jsonb_holds_is_refused_by_its_size_in_bytes() -> None:
    """A text of MAX_JSONB_BYTES bytes passes, one byte more does not; a character past
    ASCII counts its UTF-8 bytes (the server would refuse the value, or lose the connection
    on it past 1 GB, on every retry)."""
    quoted = MAX_JSONB_BYTES - len('{"t": ""}')
    assert len(to_json_text({"t": "x" * quoted}, name="result")) == MAX_JSONB_BYTES
    with pytest.raises(ValueError) as caught:
        to_json_text({"t": "x" * (quoted + 1)}, name="result")
    assert str(caught.value).startswith(
        "result is 268,435,456 bytes of JSON, more than the 268,435,455 a jsonb value holds")
    with pytest.raises(ValueError, match="payload is 268,435,457 bytes of JSON"):
        to_json_text({"t": "é" * (quoted // 2 + 1)}, name="payload")


def test_storable_values_pass_unchanged() -> None:
    value = {"deep": nested(MAX_DEPTH - 1), "text": "\\u0000 is text", "emoji": "\U0001f600",
             "shared": [[1]] * 3, "n": 10 ** 100, "f": 1.5, "none": None, "t": (1, 2)}
    assert json.loads(to_json_text(value, name="payload")) == {**value, "t": [1, 2]}


def test_text_problem_and_storable_text() -> None:
    assert text_problem("plain é \U0001f600") is None
    assert "NUL" in (text_problem("a\x00") or "")
    assert "U+DFFF" in (text_problem("\udfff") or "")
    escaped = storable_text("a\x00b\ud800c")
    assert escaped == "a\\x00b\\ud800c"
    assert text_problem(escaped) is None


def test_load_json_decodes_ordinary_values() -> None:
    assert load_json(b'{"a": [1, "x{"]}') == {"a": [1, "x{"]}
    assert load_json(memoryview(b'"\xc3\xa9"')) == "é"
    assert load_json(deep_text(MAX_DEPTH)) == json.loads(deep_text(MAX_DEPTH))


@pytest.mark.parametrize(("data", "reason"), [
    (deep_text(980).encode(), "nested 980 levels deep, more than the limit of 100"),
    (deep_text(200_000, "[", "]").encode(), "nested 200000 levels deep"),
    (b'{"n": ' + b"1" * 5000 + b"}", "ValueError: Exceeds the limit (4300 digits)"),
    (b'{"t": "\xff"}', "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
])
def test_load_json_never_raises_and_says_why(data: bytes, reason: str) -> None:
    value = load_json(data)
    assert isinstance(value, UndecodableJson)
    assert reason in value.reason
    # it is a plain JSON object to whatever prints or serves it
    shown = json.loads(json.dumps(value))
    assert shown["undecodable"] == value.reason
    assert len(shown["text"]) <= 200
