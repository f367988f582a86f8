"""Online index builds on `mdm.ddm_entity`: names, desired definitions, drift plan.

Pure: no I/O. The kinds `index_sync` and `gin_backfill` gather the facts (the attribute, the
index that exists under the name), call `plan_index`, and carry the plan out.

Names (decision): type keys are unique per tenant only, and index names are unique per
schema, so every name ends in `_` + 10 hex digits of a SHA-256 over the tenant and keys:

- attribute index: `ix_entity_<type_key>_<attr_key>_<hash>`
- GIN index (the spec's `ix_entity_attributes_gin_<type_key>`, plus the hash):
  `ix_entity_attributes_gin_<type_key>_<hash>`

The readable part is cut so that the whole name fits PostgreSQL's 63 bytes (keys are ASCII);
the hash covers the full keys, so cut names stay distinct and the same inputs always give
the same name.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import msgspec

from jobpool.kinds.entities.attributes import DataType, check_key

MAX_IDENTIFIER_BYTES = 63
_HASH_CHARS = 10
SIGNATURE_VERSION = "v1"

ExpressionFunction = Literal["attr_text", "attr_bigint", "attr_numeric", "attr_boolean"]

_FUNCTION_BY_TYPE: dict[DataType, ExpressionFunction] = {
    "string": "attr_text", "enum": "attr_text", "date": "attr_text", "timestamp": "attr_text",
    "integer": "attr_bigint", "number": "attr_numeric", "boolean": "attr_boolean",
}
"""The SQL function (schema mdm) that reads an attribute typed, for its index and queries."""

_SAMPLE_BY_FUNCTION: dict[ExpressionFunction, object] = {
    "attr_text": "x", "attr_bigint": 0, "attr_numeric": 0, "attr_boolean": True,
}


def _bounded(readable: str, identity: str) -> str:
    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    head = readable[: MAX_IDENTIFIER_BYTES - _HASH_CHARS - 1].rstrip("_")
    return f"{head}_{digest}"


def attribute_index_name(tenant_id: str, type_key: str, attr_key: str) -> str:
    """The expression index name of an attribute; raises ValueError for a bad key."""
    check_key("type_key", type_key)
    check_key("attr_key", attr_key)
    return _bounded(f"ix_entity_{type_key}_{attr_key}", f"{tenant_id}/{type_key}/{attr_key}")


def gin_index_name(tenant_id: str, type_key: str) -> str:
    """The GIN index name of an entity type; raises ValueError for a bad key."""
    check_key("type_key", type_key)
    return _bounded(f"ix_entity_attributes_gin_{type_key}", f"{tenant_id}/{type_key}")


def expression_function(data_type: DataType) -> ExpressionFunction:
    """The typed read function an attribute of `data_type` is indexed and queried by."""
    return _FUNCTION_BY_TYPE[data_type]


def sample_value(function: ExpressionFunction) -> object:
    """A value of the function's type, for the EXPLAIN of an equality query."""
    return _SAMPLE_BY_FUNCTION[function]


@dataclass(frozen=True)
class AttributeIndex:
    """The index an attribute needs: btree on its typed expression, partial on its type."""

    name: str
    entity_type_id: int
    attr_key: str
    function: ExpressionFunction
    unique: bool
    searchable: bool
    sortable: bool

    @property
    def signature(self) -> str:
        """What the index's comment records; any difference means the definition drifted."""
        return (f"jobpool {SIGNATURE_VERSION} attribute type={self.entity_type_id} "
                f"key={self.attr_key} fn={self.function} unique={self.unique}")


@dataclass(frozen=True)
class GinIndex:
    """A type's GIN index on `attributes jsonb_path_ops`, partial on the type."""

    name: str
    entity_type_id: int

    @property
    def signature(self) -> str:
        """What the index's comment records; any difference means the definition drifted."""
        return f"jobpool {SIGNATURE_VERSION} gin type={self.entity_type_id} ops=jsonb_path_ops"


@dataclass(frozen=True)
class ExistingIndex:
    """What the catalog says about the index that has the target name."""

    table_name: str
    valid: bool
    ready: bool
    comment: str | None


IndexAction = Literal["keep", "build", "rebuild", "drop", "absent"]


@dataclass(frozen=True)
class IndexPlan:
    """What to do about one index name, and why (for the job's result)."""

    action: IndexAction
    reason: str


def plan_index(signature: str | None, existing: ExistingIndex | None) -> IndexPlan:
    """The drift check: compare the wanted definition with what exists under the name.

    signature: the wanted index's signature, None when no index is wanted.
    An INVALID index (left by a failed or cancelled build) is never trusted: rebuilt or dropped.
    """
    if signature is None:
        if existing is None:
            return IndexPlan("absent", "no index wanted and none exists")
        return IndexPlan("drop", "index no longer wanted")
    if existing is None:
        return IndexPlan("build", "index missing")
    if existing.table_name != "ddm_entity":
        return IndexPlan("rebuild", f"name taken by an index on {existing.table_name}")
    if not existing.valid or not existing.ready:
        return IndexPlan("rebuild", "existing index is INVALID (failed or cancelled build)")
    if existing.comment != signature:
        return IndexPlan("rebuild", "existing index has a different definition")
    return IndexPlan("keep", "valid index with the wanted definition exists")


@dataclass(frozen=True)
class BuildTimeouts:
    """Session limits of a build connection, in seconds (0 = none).

    lock_timeout bounds each wait for a lock, including CREATE INDEX CONCURRENTLY's waits for
    older transactions; statement_timeout bounds each statement, the build included.
    """

    lock_timeout: float = 60.0
    statement_timeout: float = 3 * 3600.0

    def __post_init__(self) -> None:
        for name in ("lock_timeout", "statement_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")

    def as_settings(self) -> dict[str, str]:
        """The PostgreSQL settings, in milliseconds as text."""
        return {"lock_timeout": f"{round(self.lock_timeout * 1000)}",
                "statement_timeout": f"{round(self.statement_timeout * 1000)}"}


Seconds = Annotated[float, msgspec.Meta(ge=0)]


class BuildPayload(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """The fields every index build payload may carry: its build limits in seconds (None: the
    kind's default)."""

    lock_timeout: Seconds | None = None
    statement_timeout: Seconds | None = None

    def timeouts(self, default: BuildTimeouts) -> BuildTimeouts:
        """`default`, with the limits this payload gives."""
        given = {name: value for name in ("lock_timeout", "statement_timeout")
                 if (value := getattr(self, name)) is not None}
        return replace(default, **given) if given else default


def _index_names(node: Mapping[str, Any]) -> Iterator[str]:
    if isinstance(node.get("Index Name"), str):
        yield node["Index Name"]
    for child in node.get("Plans", ()):
        if isinstance(child, Mapping):
            yield from _index_names(child)


def plan_uses_index(explain: Any, name: str) -> bool:
    """Whether an `EXPLAIN (FORMAT JSON)` result has a scan of index `name` anywhere."""
    if isinstance(explain, str):
        explain = json.loads(explain)
    roots = explain if isinstance(explain, list) else [explain]
    return any(name in _index_names(root.get("Plan", {})) for root in roots
               if isinstance(root, Mapping))


def plan_outline(explain: Any) -> str:
    """The node types of an `EXPLAIN (FORMAT JSON)` result, outermost first, e.g. for logs."""
    if isinstance(explain, str):
        explain = json.loads(explain)
    roots = explain if isinstance(explain, list) else [explain]
    parts: list[str] = []

    def walk(node: Mapping[str, Any]) -> None:
        label = str(node.get("Node Type", "?"))
        if node.get("Index Name"):
            label += f" using {node['Index Name']}"
        parts.append(label)
        for child in node.get("Plans", ()):
            if isinstance(child, Mapping):
                walk(child)

    for root in roots:
        if isinstance(root, Mapping) and isinstance(root.get("Plan"), Mapping):
            walk(root["Plan"])
    return " > ".join(parts)
