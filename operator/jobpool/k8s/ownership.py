"""Field ownership of a lane's Deployment (pure): the operator's apply owns what it applies,
the scaler only `spec.replicas`.

A Deployment is created by the scaler (its first replicas come with it, so that a lane of
`minReplicas: 0` never starts a pod), and the API server gives the creator every field of
the object. Server-side apply removes a field the operator stops applying only if no other
manager owns it, so while the scaler co-owned the whole object, a variable, a node selector
or rate limits dropped from the pool stayed on the pods for good. After the operator's
apply, the scaler's ownership beyond `spec.replicas` is handed to the operator's apply
entry; applying once more then removes whatever the operator does not apply (the server
defaults the fields it fills in again, unchanged).

`managedFields` entries are mappings as the API server returns them; `fieldsV1` is its set
of field paths as a tree (`{"f:spec": {"f:replicas": {}}}`, a leaf `{}`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIELD_MANAGER = "jobpool-operator"
"""Field manager of everything the operator applies (children, pool status, Lease)."""
SCALER = "jobpool-scaler"
"""Field manager of a lane's replicas: the Deployment's creation, then its scale subresource."""

REPLICAS: dict[str, Any] = {"f:spec": {"f:replicas": {}}}
"""The fields the scaler keeps."""


@dataclass(frozen=True)
class HandOver:
    """`patch`: the JSON patch of a Deployment's `managedFields` that hands the fields over,
    each change after `test`s that its entry still has the manager, operation and fields
    read (other entries, its controller's status among them, may change meanwhile; a change
    of those handed over fails the patch, with 422); only `fieldsV1` is replaced, so what
    else an entry holds (its time, fields a newer server adds) stays as stored. `reapply`:
    whether the operator must apply again (it now owns fields it does not apply, which that
    apply removes)."""

    patch: list[dict[str, Any]]
    reapply: bool


def hand_over(managed: Sequence[Mapping[str, Any]], *, applier: str,
              scaler: str) -> HandOver | None:
    """`managed` (a Deployment's managedFields) with every field the `scaler`'s writes of the
    object itself (not its scale subresource) own beyond `REPLICAS` moved to the `applier`'s
    apply entry; None when there is nothing to move, or no apply entry of the `applier` to
    move it to (the operator has not applied yet)."""
    entries = [copy.deepcopy(dict(entry)) for entry in managed]
    applied = [index for index, entry in enumerate(entries)
               if entry.get("manager") == applier and entry.get("operation") == "Apply"]
    if len(applied) != 1:
        return None
    moved: dict[str, Any] = {}
    changed: dict[int, dict[str, Any] | None] = {}  # index -> new entry (None: removed)
    for index, entry in enumerate(entries):
        if entry.get("manager") != scaler or entry.get("subresource"):
            continue
        fields = entry.get("fieldsV1") or {}
        extra = difference(fields, REPLICAS)
        if not extra:
            continue
        moved = union(moved, extra)
        replicas = intersection(fields, REPLICAS)
        changed[index] = {**entry, "fieldsV1": replicas} if replicas else None
    if not moved:
        return None
    target = entries[applied[0]]
    owned = target.get("fieldsV1") or {}
    changed[applied[0]] = {**target, "fieldsV1": union(owned, moved)}
    patch: list[dict[str, Any]] = []
    for index in sorted(changed, reverse=True):  # a removal shifts only the entries after it
        path = f"/metadata/managedFields/{index}"
        read = entries[index]
        patch += [{"op": "test", "path": f"{path}/{key}", "value": read.get(key)}
                  for key in ("manager", "operation", "fieldsV1")]
        new_entry = changed[index]
        patch.append({"op": "remove", "path": path} if new_entry is None
                     else {"op": "replace", "path": f"{path}/fieldsV1",
                           "value": new_entry["fieldsV1"]})
    return HandOver(patch, reapply=bool(difference(moved, owned)))


def union(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The field paths in `a` or in `b`."""
    merged = copy.deepcopy(dict(a))
    for key, sub in b.items():
        merged[key] = union(merged[key], sub) if key in merged else copy.deepcopy(sub)
    return merged


def difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The field paths in `a` that are not in `b`."""
    left: dict[str, Any] = {}
    for key, sub in a.items():
        if key not in b:
            left[key] = copy.deepcopy(sub)
        elif sub and (rest := difference(sub, b[key])):
            left[key] = rest
    return left


def intersection(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """The field paths in both `a` and `b`."""
    both: dict[str, Any] = {}
    for key, sub in a.items():
        if key not in b:
            continue
        if not sub or not b[key]:
            if not sub and not b[key]:
                both[key] = {}
            continue
        if rest := intersection(sub, b[key]):
            both[key] = rest
    return both


def scaler_owns_more(managed: Sequence[Mapping[str, Any]], *, scaler: str) -> bool:
    """Whether the `scaler`'s writes of the object itself own more than `REPLICAS` (a
    Deployment it created whose ownership was not handed over yet)."""
    return any(entry.get("manager") == scaler and not entry.get("subresource")
               and difference(entry.get("fieldsV1") or {}, REPLICAS)
               for entry in managed)
