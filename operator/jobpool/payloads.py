"""Typed payloads: a kind declares its payload as a `msgspec.Struct`, checked on both sides.

`@jobpool.kind("invoice_pdf", payload=InvoicePdf)` makes the handler receive `job.payload`
as an `InvoicePdf`, decoded before the handler runs; a payload that does not match is an
InvalidPayloadError, a PermanentError: the job goes to the DLQ at once, its `last_error`
naming the field. `enqueue*` checks the payload of a kind registered in the enqueuing process
against the same model, and accepts the model's instance as the payload.

msgspec (docs/writing-kinds.md, "Typed payloads") rather than pydantic: the check at enqueue
runs in every service, on the base install, and msgspec is one small package with no
dependencies.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from jobpool.errors import InvalidPayloadError

Model = TypeVar("Model", bound=msgspec.Struct)


def decode_payload(kind: str, model: type[Model], payload: Any) -> Model:
    """`payload` (decoded JSON, or already a `model`) as a `model`.

    Raises InvalidPayloadError naming the kind and the field (`payload.batch_size`), and the
    rule broken: a wrong type, a missing or unknown field, a constraint, or the ValueError of
    the model's `__post_init__` check.
    """
    if isinstance(payload, model):
        payload = msgspec.to_builtins(payload)
    try:
        return msgspec.convert(payload, model)
    except msgspec.ValidationError as exc:
        raise InvalidPayloadError(
            f"payload of job kind {kind!r} is invalid: {_naming_the_field(str(exc))}") from None


_FIELD = re.compile(r"(?P<rule>Object (?:missing required|contains unknown) field) "
                    r"`(?P<name>[^`]*)`(?: - at `\$(?P<path>[^`]*)`)?$")


def _naming_the_field(message: str) -> str:
    """msgspec's message with the field as a path from `payload` (`payload.items[0].sku`)."""
    match = _FIELD.fullmatch(message)
    if match:
        return f"{match['rule']} `payload{match['path'] or ''}.{match['name']}`"
    return message.replace("`$", "`payload")


def payload_json(payload: Any) -> Any:
    """`payload` as JSON-able values: a model's instance becomes its fields' object."""
    return msgspec.to_builtins(payload) if isinstance(payload, msgspec.Struct) else payload
