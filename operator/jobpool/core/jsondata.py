"""JSON that PostgreSQL's jsonb stores and that every jobpool process can decode again.

One job's data must never stop a worker, strand the other jobs of its batch or make an
admin read answer 500. So values are checked on the way in (`to_json_text`: payloads,
results, events) and decoded defensively on the way out (`load_json`, registered on every
connection jobpool opens), and both sides share one nesting limit, `MAX_DEPTH`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

MAX_DEPTH = 100
"""Deepest nesting of arrays and objects a stored value may have.

Python's json module, PostgreSQL's jsonb functions and a handler's own recursive walk all
spend a stack frame per level, and Python's default recursion limit (1000) is shared with
everything else on the stack. Real payloads are a few levels deep; 100 leaves an order of
magnitude on both sides.
"""

MAX_JSONB_BYTES = 268_435_455
"""Largest JSON text, in UTF-8 bytes, that `to_json_text` passes: a jsonb value holds at most
2^28 - 1 bytes. Past it the server refuses the value (SQLSTATE class 54) and aborts the
caller's transaction, again on every retry (PostgreSQL takes no value past 1 GB at all).
Measured on the text, close to the stored size: escapes make the text larger, many small
numbers make it smaller, so the server may still refuse a value near the limit (a job's
result so refused goes to the DLQ, `ResultRefused`)."""

PREVIEW = 200
"""Characters of an undecodable value's stored text that `UndecodableJson` keeps."""

_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""`\\u0000` in JSON text that is an escape, not an escaped backslash followed by `u0000`."""
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[]{}'))
_STEP = {ord("{"): 1, ord("["): 1, ord("}"): -1, ord("]"): -1}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UndecodableJson(dict[str, str]):
    """Stands in for a stored JSON value this process will not decode (too deep, or invalid).

    It is a plain JSON object to anything that prints or serves it:
    `{"undecodable": <reason>, "text": <first PREVIEW characters of the stored text>}`; code
    that must not act on it (the worker, before it runs a handler) tests isinstance.
    """

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(undecodable=reason, text=text[:PREVIEW])

    @property
    def reason(self) -> str:
        """Why the value was not decoded, e.g. "nested 980 levels deep, more than the limit
        of 100"."""
        return self["undecodable"]


def nesting_depth(text: str | bytes) -> int:
    """Deepest nesting of arrays and objects in JSON `text`, counted without recursion.

    Brackets inside strings do not count; for text that is not JSON the count is a guess.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if b"\\" in data:  # escaped backslashes and quotes are string content
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = data.translate(None, _NOT_STRUCTURE)  # quotes and brackets only
    brackets = b"".join(structure.split(b'"')[::2])  # what lies between strings
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def within_depth(text: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON `text` nests at most `limit` levels; cheap for the common shallow text."""
    if isinstance(text, str):
        openers = text.count("{") + text.count("[")
    else:
        openers = text.count(b"{") + text.count(b"[")
    return openers <= limit or nesting_depth(text) <= limit


def text_problem(text: str) -> str | None:
    """What keeps the string `text` out of PostgreSQL (a NUL, a lone surrogate), or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        # U+DC80..U+DCFF is how Python carries a byte of an argument or variable that is not
        # UTF-8: a person typed that byte, not a surrogate
        byte = (f": the byte 0x{code - 0xDC00:02X} of text that is not UTF-8"
                if 0xDC80 <= code <= 0xDCFF else "")
        return (f"contains a lone surrogate (U+{code:04X}{byte}) at index "
                f"{exc.start}, which is not valid Unicode")
    return None


def json_type(value: Any) -> str:
    """The JSON name of the type of decoded JSON `value` (`null`, `array`, ...), as errors
    about JSON name it; the Python name for anything else."""
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"),
                       (int, "number"), (float, "number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


NOT_IN_A_LINE = r"\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
"""The characters `line_problem` refuses, as the body of a regular-expression class (Python's
and JSON Schema's): the C0 and C1 controls and DEL (escape sequences, CSI, line breaks),
the line and paragraph separators, and the bidirectional controls (U+202E reverses what
follows it)."""
_NOT_IN_A_LINE = re.compile(f"[{NOT_IN_A_LINE}]")


def line_problem(text: str) -> str | None:
    """What keeps `text` from being one line of text as a terminal shows it (a character of
    NOT_IN_A_LINE), or what keeps it out of PostgreSQL (`text_problem`); None if nothing.
    For text people type that commands print in tables (a pause's reason, an audit actor):
    an escape sequence in it would act on the terminal of whoever lists it."""
    problem = text_problem(text)
    found = _NOT_IN_A_LINE.search(text) if problem is None else None
    if found is None:
        return problem
    return (f"contains U+{ord(found[0]):04X} at index {found.start()}: only printable text, "
            "no control characters, line breaks or direction overrides")


def escape_line(text: str) -> str:
    """`text` with each character of NOT_IN_A_LINE escaped as Python writes it (`\\x1b`,
    `\\n`, `\\u202e`): one line that cannot act on a terminal."""
    return _NOT_IN_A_LINE.sub(_line_escape, text)


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _line_escape(match: re.Match[str]) -> str:
    """Tab and line breaks as Python writes them; the rest as `storable_text` does."""
    return _SHORT_ESCAPES.get(match[0]) or _escape(match)


_UNSTORABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""NUL and other control characters but tab and newline, and lone surrogates."""


def expect_text(value: Any, field: str) -> str:
    """`value` if it is a string: a field of parsed YAML or JSON that holds text, most of all
    one that names something (a tenant, a kind, a schedule, a provider, a key of a mapping of
    them), never converted. Raises ValueError naming `field`, the
    value and its type (`tenant must be a string, got 5 (int)`): YAML reads `tenant: 5` or
    `tenant: yes` as a number or a boolean, and its text would name another tenant than
    the one meant."""
    if isinstance(value, str):
        return value
    huge = isinstance(value, int) and value.bit_length() > 64  # thousands of digits, maybe
    shown = "a huge number" if huge else repr(value)[:80]
    raise ValueError(f"{field} must be a string, got {shown} ({type(value).__name__})")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape carries it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def storable_text(text: str) -> str:
    """`text` made storable in a PostgreSQL text column, nothing of it lost.

    Messages quote what handlers and other systems produced (exceptions, response bodies,
    headers, client and DNS errors). PostgreSQL refuses NUL in text, UTF-8 cannot encode
    lone surrogates (how Python carries undecodable bytes) and control characters garble
    terminals; so those become escapes: `\\x00`, `\\xff` for an undecodable byte,
    `\\ud800`, `\\u0085`. Tab and newline stay.
    """
    return _UNSTORABLE.sub(_escape, text)


def to_json_text(value: Any, *, name: str, limit: int = MAX_DEPTH) -> str:
    """The JSON text of `value`, checked so that a jsonb column takes it as it is.

    name: how messages call the value ("payload", "result"). Raises ValueError naming the
    place and the problem: a value that is not JSON (NaN or Infinity, an object of another
    type, a circular reference), a string with a NUL character or a lone surrogate,
    nesting deeper than `limit` levels, or a text past `MAX_JSONB_BYTES`. The checks of the
    text are exact; the walk that names the place only runs when one fails.
    """
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(value_problem(value, name, limit) or f"{name} is not JSON: {exc}"
                         ) from None
    size = size_past_jsonb_limit(text)
    if size is not None:
        raise ValueError(f"{name} is {size:,} bytes of JSON, more than the {MAX_JSONB_BYTES:,} "
                         "a jsonb value holds; keep large data elsewhere (a table, object "
                         "storage) and pass a reference")
    problem = json_text_problem(text, limit)
    if problem is not None:
        raise ValueError(value_problem(value, name, limit) or f"{name} {problem}")
    return text


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict, for `json.loads(object_pairs_hook=...)` on text a
    person wrote (a flag, a variable): a key given twice raises ValueError naming it, where
    JSON readers, PostgreSQL's jsonb among them, keep the last value and drop the first
    without a word."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key[:80]!r} is given twice in one object (only one "
                             "value would be kept)")
        found[key] = value
    return found


def size_past_jsonb_limit(text: str) -> int | None:
    """The size of `text` in UTF-8 bytes when past `MAX_JSONB_BYTES`, else None. Encodes only
    a text long enough to be (a character takes 1 to 4 bytes; a lone surrogate, refused
    later, counts 3)."""
    if len(text) * 4 <= MAX_JSONB_BYTES:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > MAX_JSONB_BYTES else None


def json_text_problem(text: str, limit: int = MAX_DEPTH) -> str | None:
    """What keeps JSON `text` (as json.dumps writes it) out of a jsonb column, or None."""
    if "\\u0000" in text and _NUL.search(text):
        return "contains a NUL character (\\u0000), which PostgreSQL cannot store"
    problem = text_problem(text)
    if problem is not None:
        return problem
    if not within_depth(text, limit):
        return f"is nested {nesting_depth(text)} levels deep, more than the limit of {limit}"
    return None


def value_problem(value: Any, name: str, limit: int = MAX_DEPTH) -> str | None:
    """The first place in `value` that is not storable JSON, as "<path> <problem>", or None.

    Walks without recursion; a container met a second time is not walked again (so a
    circular reference ends the walk, and json.dumps names it).
    """
    seen: set[int] = set()
    for path, depth, item in _walk(value, name, seen):
        if isinstance(item, dict | list | tuple) and depth > limit:
            return f"{name} is nested more than {limit} levels deep (the limit)"
        problem = _scalar_problem(item)
        if problem is not None:
            return f"{_shorten(path)} {problem}"
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str | int | float | bool) and key is not None:
                    return (f"{_shorten(path)} has a key of type {type(key).__name__}; "
                            "JSON object keys are strings")
                problem = text_problem(key) if isinstance(key, str) else _scalar_problem(key)
                if problem is not None:
                    return f"{_shorten(path)} has a key that {problem}"
    return None


def _walk(value: Any, name: str, seen: set[int]) -> Iterator[tuple[str, int, Any]]:
    """(path, depth, item) for `value` and everything in it, depth first."""
    stack: list[tuple[str, int, Any]] = [(name, 1, value)]
    while stack:
        path, depth, item = stack.pop()
        yield path, depth, item
        if not isinstance(item, dict | list | tuple) or id(item) in seen:
            continue
        seen.add(id(item))
        children = (item.items() if isinstance(item, dict) else enumerate(item))
        stack.extend(reversed([(_child_path(path, key, isinstance(item, dict)), depth + 1, child)
                               for key, child in children]))


def _scalar_problem(item: Any) -> str | None:
    if item is None or isinstance(item, bool | dict | list | tuple):
        return None
    if isinstance(item, str):
        return text_problem(item)
    if isinstance(item, float):
        return None if math.isfinite(item) else f"is {item}, which JSON cannot hold"
    if isinstance(item, int):
        try:
            repr(item)
        except ValueError:
            return "is an integer too long to write as text"
        return None
    return (f"is of type {type(item).__name__}, which is not JSON "
            "(use str, int, float, bool, None, list or dict)")


def _child_path(path: str, key: Any, in_object: bool) -> str:
    if not in_object:
        return f"{path}[{key}]"
    if isinstance(key, str) and _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}"
    return f"{path}[{storable_text(repr(key))[:40]}]"


def _shorten(path: str, limit: int = 200) -> str:
    return path if len(path) <= limit else f"{path[:limit]}…"


def load_json(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode JSON text read from PostgreSQL (UTF-8 bytes, or str), never raising.

    A value nested deeper than `MAX_DEPTH`, or one json cannot decode (an integer too long,
    bytes that are not UTF-8), comes back as `UndecodableJson` naming the reason, so that one
    row cannot fail the read of the others. A count of brackets spares the exact depth scan
    for nearly every value.
    """
    text = data if isinstance(data, str | bytes) else bytes(data)
    if not within_depth(text):
        return UndecodableJson(
            f"nested {nesting_depth(text)} levels deep, more than the limit of {MAX_DEPTH}",
            _preview(text))
    try:  # text decoded here: json.loads would first guess the encoding of bytes
        return json.loads(text if isinstance(text, str) else text.decode())
    except (ValueError, RecursionError) as exc:
        return UndecodableJson(f"{type(exc).__name__}: {exc}", _preview(text))


def _preview(text: str | bytes) -> str:
    if isinstance(text, str):
        return text[:PREVIEW]
    return text[: PREVIEW * 4].decode("utf-8", "replace")[:PREVIEW]
