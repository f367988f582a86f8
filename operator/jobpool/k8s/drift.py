"""Drift (pure): whether a live object still holds what the operator applies to it.

Only the fields the operator applies count, compared as the API server stores them:

- fields added by the server (defaults) or by other field managers (an annotation, a label
  added by hand, an env var from `kubectl set env`, a sidecar container injected by an
  admission policy) are theirs and no drift;
- lists that server-side apply merges by key (containers, env and volumes by name, ports by
  port and protocol, ownerReferences by uid, ...) are compared item by item under that key,
  in any order, and items of others are ignored; every other list is atomic (one field:
  the same items in the same order);
- quantities (resource requests and limits, emptyDir size limits) are compared by value:
  the server stores them canonical (cpu `0.5` as `500m`, memory `1024Mi` as `1Gi`);
- an empty map or list the operator sends matches a field the server leaves out.

A field the operator stops applying is not seen here: the template hash on each child
tells that its configuration changed (see k8s.manifests.template_hash).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

Path = tuple[str, ...]
ITEM = "[]"
"""The path step of a list item."""
ANY = "*"
"""A path step matching any map key (a resource name under `limits`)."""

_POD = ("spec", "template", "spec")
_CONTAINER_LISTS: dict[Path, tuple[str, ...]] = {
    ("env",): ("name",),
    ("ports",): ("containerPort", "protocol"),
    ("volumeMounts",): ("mountPath",),
    ("volumeDevices",): ("devicePath",),
}
_METADATA_LISTS: dict[Path, tuple[str, ...]] = {("metadata", "ownerReferences"): ("uid",)}
MAP_LISTS: dict[str, dict[Path, tuple[str, ...]]] = {
    "Deployment": {
        **_METADATA_LISTS,
        **{(*_POD, name): ("name",) for name in (
            "containers", "initContainers", "ephemeralContainers", "volumes",
            "imagePullSecrets", "resourceClaims", "schedulingGates")},
        (*_POD, "hostAliases"): ("ip",),
        (*_POD, "topologySpreadConstraints"): ("topologyKey", "whenUnsatisfiable"),
        **{(*_POD, containers, ITEM, *field): keys
           for containers in ("containers", "initContainers")
           for field, keys in _CONTAINER_LISTS.items()},
    },
}
"""Per kind, the lists server-side apply merges by key: path -> key fields. Kinds not
listed (KEDA's custom resources) have only their metadata's; the rest of theirs are atomic."""
LIST_KEY_DEFAULTS = {"protocol": "TCP"}
"""Key fields the server fills in when an item leaves them out."""
QUANTITIES: dict[str, tuple[Path, ...]] = {
    "Deployment": (
        *((*_POD, containers, ITEM, "resources", part, ANY)
          for containers in ("containers", "initContainers") for part in ("limits", "requests")),
        (*_POD, "volumes", ITEM, "emptyDir", "sizeLimit"),
    ),
}
"""Per kind, the paths whose values are quantities."""

_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE]))?$")
_SUFFIXES = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


def quantity_value(value: object) -> Fraction | None:
    """The exact value of a Kubernetes quantity (`500m`, `1Gi`, `1e3`, 2, 0.5); None if
    `value` is no quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        return None
    found = _QUANTITY.fullmatch(value.strip())
    if found is None:
        return None
    try:
        number = Fraction(Decimal(found["number"]))
    except InvalidOperation:
        return None
    if found["exponent"]:
        return number * Fraction(10) ** int(found["exponent"][1:])
    return number * _SUFFIXES.get(found["suffix"] or "", Fraction(1))


def in_sync(live: Any, desired: Mapping[str, Any]) -> bool:
    """Whether `live` holds every field of `desired` (a child as the operator applies it,
    with its `kind`) with the same value, compared as the API server stores them.

    `apiVersion` and `kind` are the type the object was read as, not fields: items of a
    list may come without them.
    """
    kind = str(desired.get("kind") or "")
    fields = {key: value for key, value in desired.items() if key not in ("apiVersion", "kind")}
    return _Compare(MAP_LISTS.get(kind, _METADATA_LISTS), QUANTITIES.get(kind, ())).holds(
        live, fields, ())


class _Compare:
    def __init__(self, map_lists: Mapping[Path, tuple[str, ...]],
                 quantities: Sequence[Path]) -> None:
        self.map_lists = map_lists
        self.quantities = quantities

    def holds(self, live: Any, desired: Any, path: Path) -> bool:
        if isinstance(desired, Mapping):
            if not desired:
                return live is None or isinstance(live, Mapping)
            return isinstance(live, Mapping) and all(
                self.holds(live.get(key), value, (*path, str(key)))
                for key, value in desired.items())
        if isinstance(desired, list):
            keys = self.map_lists.get(path)
            if not desired:  # nothing of the operator's; in an atomic list, nothing at all
                return keys is not None or live is None or live == []
            if not isinstance(live, list):
                return False
            if keys is None:  # atomic: the same items in the same order
                return len(live) == len(desired) and all(
                    self.holds(one, other, (*path, ITEM))
                    for one, other in zip(live, desired, strict=True))
            found = {_key(item, keys): item for item in live if isinstance(item, Mapping)}
            return all(
                isinstance(item, Mapping) and _key(item, keys) in found
                and self.holds(found[_key(item, keys)], item, (*path, ITEM))
                for item in desired)
        if live is None or desired is None:
            return live is desired
        if any(path_matches(pattern, path) for pattern in self.quantities):
            ours, theirs = quantity_value(desired), quantity_value(live)
            if ours is not None and theirs is not None:
                return ours == theirs
        return bool(live == desired)


def _key(item: Mapping[str, Any], keys: Sequence[str]) -> tuple[Any, ...]:
    return tuple(item.get(key, LIST_KEY_DEFAULTS.get(key)) for key in keys)


def path_matches(pattern: Path, path: Path) -> bool:
    """Whether `path` is one of `pattern`'s (ANY matches any one step)."""
    return len(pattern) == len(path) and all(
        step in (ANY, part) for step, part in zip(pattern, path, strict=True))
