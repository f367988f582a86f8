"""Payload checks shared by the entity kinds: every bad field is a PermanentError naming it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobpool.errors import PermanentError
from jobpool.kinds.entities.attributes import check_key


def as_object(kind: str, payload: Any) -> Mapping[str, Any]:
    """The payload if it is a JSON object."""
    if not isinstance(payload, Mapping):
        raise PermanentError(f"{kind} payload must be an object, got {type(payload).__name__}")
    return payload


def positive_int(payload: Mapping[str, Any], name: str, *, default: int | None = None,
                 maximum: int | None = None) -> int:
    """payload[name] as an int >= 1 (and <= maximum); `default` when absent."""
    value = payload.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PermanentError(f"payload.{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise PermanentError(f"payload.{name} must be at most {maximum}, got {value}")
    return value


def entity_key(payload: Mapping[str, Any], name: str) -> str:
    """payload[name] validated as a type_key/attr_key, before it can reach any SQL."""
    try:
        return check_key(name, payload.get(name))
    except ValueError as exc:
        raise PermanentError(f"payload.{exc}") from None


def is_last_attempt(attempts: int, max_attempts: int, exc: BaseException) -> bool:
    """Whether this failure ends the job (DLQ): permanent, or out of attempts."""
    return isinstance(exc, PermanentError) or attempts >= max_attempts
