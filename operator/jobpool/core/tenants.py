"""Tenant keys: what a key may look like (DESIGN §6: the CLI takes a key or an id)."""

from __future__ import annotations

import re

TENANT_KEY = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_UUID_SHAPE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def check_tenant_key(key: str) -> str:
    """Return `key` if it is a valid tenant key, else raise ValueError naming the rule.

    A key is 1 to 63 characters of lower-case letters, digits, `_`, `.` and `-`, starting
    with a letter or digit, and is not shaped like a uuid (which would shadow a tenant id).
    """
    if not TENANT_KEY.fullmatch(key):
        raise ValueError(
            f"invalid tenant key {key!r}: use 1 to 63 lower-case letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        )
    if _UUID_SHAPE.fullmatch(key):
        raise ValueError(f"invalid tenant key {key!r}: a key must not look like a tenant id")
    return key
