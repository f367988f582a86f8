"""The admin API's document promises no more than the server takes: every text parameter a
client may send says which text the server refuses, so a client generated from the document
(or a fuzzer) never sends a request the document calls valid and gets a 400."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from jobpool.api.openapi import document

UNSTORABLE = ["a\x00b", "\x00"]
"""Text PostgreSQL cannot store, which the server answers with a 400 naming the NUL."""


def text_parameters() -> Iterator[tuple[str, dict[str, Any]]]:
    """(`METHOD path name`, schema) of each string parameter, an operation's or its path's."""
    for path, item in document()["paths"].items():
        shared = item.get("parameters", [])
        for method, operation in item.items():
            if method == "parameters":
                continue
            for parameter in [*shared, *operation.get("parameters", [])]:
                if parameter["schema"].get("type") == "string":
                    yield f"{method.upper()} {path} {parameter['name']}", parameter["schema"]


def test_the_document_has_text_parameters_to_check() -> None:
    names = [name for name, _ in text_parameters()]
    assert "POST /v1/pauses reason" in names


@pytest.mark.parametrize(("name", "schema"), list(text_parameters()))
def test_no_text_parameter_admits_a_nul(name: str, schema: dict[str, Any]) -> None:
    if "enum" in schema:
        assert not any("\x00" in value for value in schema["enum"]), name
        return
    assert "pattern" in schema, f"{name} admits any text, NUL included"
    for text in UNSTORABLE:
        assert re.search(schema["pattern"], text) is None, (name, text)


def test_a_reason_may_be_any_other_line_of_text() -> None:
    reason = dict(text_parameters())["POST /v1/pauses reason"]
    for text in ["mail provider down", "Störung: SMTP 421, retry later", "", "😀 ' ; --",
                 "10\u00a0h"]:
        assert re.search(reason["pattern"], text) is not None, text
    for text in ["two\nlines", "a\ttab", "\x1b[31mred", "\u202eright to left", "csi \x9b"]:
        assert re.search(reason["pattern"], text) is None, text  # the server's 400 too
