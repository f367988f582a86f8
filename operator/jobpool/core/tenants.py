"""Tenants: what a key, a reference and metadata may look like (the CLI takes a key or an id)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from jobpool.core.jsondata import json_type, to_json_text
from jobpool.core.ratelimit import parse_tenant_limits
from jobpool.core.suggestions import close_names

TENANT_KEY_PATTERN = r"[a-z0-9][a-z0-9_.-]{0,62}"
TENANT_ID_PATTERN = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
"""A uuid in its hyphenated form, in either case (uuids are case-insensitive)."""
TENANT_REF_PATTERN = rf"^({TENANT_KEY_PATTERN}|{TENANT_ID_PATTERN})$"
"""A tenant key or id, as the CLI, the admin API and pool files take it."""

TENANT_KEY = re.compile(rf"^{TENANT_KEY_PATTERN}$")
TENANT_ID = re.compile(rf"^{TENANT_ID_PATTERN}$")
_KEY_RULE = "1 to 63 lower-case letters, digits, '_', '.' or '-', starting with a letter or digit"

MAX_METADATA_DEPTH = 32
"""Nesting levels of tenant metadata; every reader decodes it, and deep JSON exhausts
decoders that recurse."""

MAX_METADATA_BYTES = 65_536
"""Size of a tenant's metadata as JSON text, in bytes (UTF-8). Every worker reads every
tenant's rate limits every few seconds; one tenant's megabytes would stall them all. The
database refuses more too (constraint `aa_tenant_metadata_size`)."""


def check_tenant_key(key: str) -> str:
    """Return `key` if it is a valid tenant key, else raise ValueError naming the rule.

    A key is 1 to 63 characters of lower-case letters, digits, `_`, `.` and `-`, starting
    with a letter or digit, and is not text a uuid reads from: 32 hex digits, with hyphens
    anywhere or none, which `uuid.UUID` takes, so the library's `tenant_id` would name
    another tenant by it than the CLI's `--tenant`.
    """
    if not TENANT_KEY.fullmatch(key):
        raise ValueError(f"invalid tenant key {key!r}: use {_KEY_RULE}")
    if _reads_as_uuid(key):
        raise ValueError(f"invalid tenant key {key!r}: a key must not look like a tenant id "
                         "(32 hex digits, with or without hyphens, read as a uuid)")
    return key


def _reads_as_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def tenant_ref(text: str) -> str:
    """The canonical form of a tenant reference: an id (uuid) in lower case, a key as it is.

    Ids are uuids and compare case-insensitively; keys are lower-case by rule, so no key
    can be mistaken for an id. Raises ValueError for text that is neither.
    """
    if TENANT_ID.fullmatch(text):
        return text.lower()
    if TENANT_KEY.fullmatch(text):
        return text
    raise ValueError(f"tenant {text[:80]!r} is neither a tenant key ({_KEY_RULE}) "
                     "nor a tenant id (a uuid)")


def tenant_uuid(value: object) -> uuid.UUID:
    """`value`, a tenant id given as a `uuid.UUID` or as text `uuid.UUID` reads, as a uuid.

    Raises ValueError naming the value, and saying so when it is a tenant key: the library's
    calls (`enqueue*`, `publish_event`, `commit_upload`) take the id, as a service holds it;
    only the CLI, the admin API and pool files look keys up.
    """
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    key = isinstance(value, str) and TENANT_KEY.fullmatch(value) is not None
    hint = (": it looks like a tenant key; this takes the tenant's id (`jobpool tenants list`"
            " shows each key's)") if key else ""
    raise ValueError(f"tenant_id must be a UUID, got {value!r:.100}{hint}")


def tenant_id_of(ref: str) -> uuid.UUID | None:
    """The uuid a canonical reference (see tenant_ref) names, or None when it is a key."""
    return uuid.UUID(ref) if TENANT_ID.fullmatch(ref) else None


def check_tenant_metadata(metadata: Any, tenant: str) -> dict[str, Any]:
    """Return `metadata` if a tenant may store it, else raise ValueError naming the field.

    It must be a JSON object that jsonb stores (`jobpool.core.jsondata.to_json_text`), nested
    at most MAX_METADATA_DEPTH levels, at most MAX_METADATA_BYTES long, and its `rate_limit`
    (if any) must be valid in every entry: refused here, where it is written, so that
    workers never have to ignore it where it is read.
    """
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a JSON object, got {json_type(metadata)}")
    size = len(to_json_text(metadata, name="metadata", limit=MAX_METADATA_DEPTH).encode())
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {size} bytes of JSON, more than the limit of "
                         f"{MAX_METADATA_BYTES} (every worker reads it every few seconds)")
    _, problems = parse_tenant_limits(metadata.get("rate_limit"), tenant)
    if problems:
        raise ValueError("; ".join(problems))
    return metadata


def unregistered_limit_kinds(metadata: Mapping[str, Any], registered: Sequence[str],
                             tenant: str) -> list[str]:
    """A warning per kind that `metadata.rate_limit` limits but no worker has registered
    (`registered`: the kind names the database knows; `"*"`, every kind without an entry of
    its own, is none), with the registered names it looks like. A warning, not a refusal: the
    kind's workers may not have started yet; but a misspelt kind is otherwise a limit that
    never applies, silently."""
    limits = metadata.get("rate_limit")
    if not isinstance(limits, Mapping):
        return []
    known = set(registered)
    by_lower = {name.lower(): name for name in known}
    warnings = []
    for kind in sorted(str(k) for k in limits if str(k) not in known and str(k) != "*"):
        close = [by_lower[name] for name in close_names(kind.lower(), by_lower)]
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        warnings.append(f"tenant {tenant}: rate_limit.{kind} limits a kind no worker has "
                        f"registered (`jobpool kinds list`), so it applies to nothing{hint}")
    return warnings
