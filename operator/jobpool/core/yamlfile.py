"""YAML configuration text parsed at a bounded cost (pool files, JOBPOOL_RATE_LIMITS).

PyYAML's SafeLoader constructs only plain data, but it follows aliases: ten anchors that
each repeat the previous one ten times ("billion laughs") are a few hundred bytes that every
later walk over the data (validation, JSON encoding) sees as 10^9 nodes, an alias inside its
own anchor is a cycle, and deep nesting exhausts the composer's recursion. Configuration is
small, so anything beyond these bounds is refused before it is constructed.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from jobpool.core.jsondata import unique_keys
from jobpool.core.ratelimit import ProviderCaps, parse_provider_caps
from jobpool.errors import JobpoolError

MAX_CHARS = 1024 * 1024
"""A pool file is a few kilobytes; a million characters is far beyond any real one."""
MAX_DEPTH = 32
"""Nesting levels; the JobWorkerPool schema needs 8."""
MAX_NODES = 20_000
"""Values after alias expansion; the largest pool the schema admits has about 8,000."""


class YamlLimitError(JobpoolError, ValueError):
    """YAML text beyond MAX_CHARS, MAX_DEPTH or MAX_NODES, or with a recursive alias."""


def load_documents(text: str) -> list[Any]:
    """The documents of `text`, as SafeLoader builds them.

    Raises YamlLimitError (too large, too deep, too many values after alias expansion, a
    recursive alias) or ValueError (not valid YAML, or a value YAML cannot construct, such
    as a number of thousands of digits), each naming the line where known.
    """
    if len(text) > MAX_CHARS:
        raise YamlLimitError(f"longer than {MAX_CHARS} characters ({len(text)})")
    loader = _BoundedLoader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                _check_expanded_size(node)
                documents.append(loader.construct_document(node))
        return documents
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from None
    except YamlLimitError:
        raise
    except ValueError as exc:  # e.g. int() of a 5,000-digit number
        raise ValueError(f"not a usable YAML value: {exc}") from None
    finally:
        loader.dispose()


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses nesting deeper than MAX_DEPTH while it composes."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.get_mark()
                raise YamlLimitError(
                    f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """SafeLoader's mapping, refusing a key written twice (YAML forbids it; PyYAML would
        keep the last value silently). Keys merged in with `<<` may be overridden."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise ValueError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1}): "
                                 "the later value would silently replace the earlier one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuse a document of more than MAX_NODES values once aliases are expanded, or a cycle.

    Each node's expanded size is computed once (an alias reuses its anchor's), so this costs
    one pass over the nodes actually written, however far they would expand.
    """
    sizes: dict[int, int] = {}
    unfinished: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in unfinished:
            raise YamlLimitError(f"an alias refers to a node that contains it "
                                 f"(line {node.start_mark.line + 1})")
        unfinished.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(key_node) + size(value) for key_node, value in node.value)
        if total > MAX_NODES:
            raise YamlLimitError(f"more than {MAX_NODES} values once aliases are expanded "
                                 f"(line {node.start_mark.line + 1})")
        unfinished.discard(key)
        sizes[key] = total
        return total

    size(root)


def provider_caps_from_text(text: str) -> ProviderCaps:
    """parse_provider_caps of a `JOBPOOL_RATE_LIMITS` text: JSON (as `to_json` writes it) or
    YAML (as a platform may write a file); blank means no caps.

    JSON is read first, because YAML 1.1 reads JSON's `1e-05` (how `to_json` writes the
    smallest rps) as a string. Raises ValueError for text longer than a configuration file
    may be, JSON nested too deeply, bad YAML, more than one document, or a bad field.
    """
    if len(text) > MAX_CHARS:
        raise ValueError(f"longer than {MAX_CHARS} characters ({len(text)})")
    try:
        raw = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError:
        raw = _yaml_document(text)
    except RecursionError:
        raise ValueError("not usable JSON: nested too deeply") from None
    return parse_provider_caps(raw)


def _yaml_document(text: str) -> Any:
    """The one YAML document of `text` (None when it holds none)."""
    documents = load_documents(text)
    if len(documents) > 1:
        raise ValueError(f"expected one document, found {len(documents)}")
    return documents[0] if documents else None
