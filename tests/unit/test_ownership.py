"""Field ownership of a lane's Deployment: the scaler's creation handed over to the
operator's apply (managedFields as the API server writes them)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jobpool.k8s.ownership import (
    FIELD_MANAGER,
    REPLICAS,
    SCALER,
    difference,
    hand_over,
    intersection,
    scaler_owns_more,
    union,
)

ENV_A = {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}}
ENV_B = {"k:{\"name\":\"B\"}": {".": {}, "f:name": {}, "f:value": {}}}


def container(env: dict[str, Any], *more: str) -> dict[str, Any]:
    return {"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"w\"}": {
        ".": {}, "f:env": env, "f:image": {}, **{name: {} for name in more}}}}}}}


def entry(manager: str, operation: str, fields: dict[str, Any],
          subresource: str | None = None) -> dict[str, Any]:
    found = {"manager": manager, "operation": operation, "apiVersion": "apps/v1",
             "fieldsType": "FieldsV1", "fieldsV1": fields}
    return found | ({"subresource": subresource} if subresource else {})


STATUS = entry("kube-controller-manager", "Update", {"f:status": {"f:replicas": {}}}, "status")


def created(scaler_env: dict[str, Any]) -> list[dict[str, Any]]:
    """What a Deployment the scaler created (with env `scaler_env` then) and the operator
    applied (env A alone now) holds."""
    return [
        entry(FIELD_MANAGER, "Apply", container(ENV_A)),
        entry(SCALER, "Update", union(REPLICAS, container(
            scaler_env, "f:terminationMessagePath"))),
        STATUS,
    ]


def patched(managed: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`managed` after the JSON patch `patch` (test, replace and remove of whole entries), as
    the API server applies it; AssertionError where a test fails (the server's 422)."""
    entries = copy.deepcopy(managed)
    for op in patch:
        index = int(op["path"].removeprefix("/metadata/managedFields/"))
        if op["op"] == "test":
            assert entries[index] == op["value"], f"test of entry {index} fails"
        elif op["op"] == "replace":
            entries[index] = op["value"]
        else:
            assert op["op"] == "remove"
            del entries[index]
    return entries


def test_the_scaler_keeps_the_replicas_and_the_operator_gets_the_rest() -> None:
    managed = created({**ENV_A, **ENV_B})
    handed = hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER)
    assert handed is not None
    assert patched(managed, handed.patch) == handed.managed_fields
    operator, scaler, status = handed.managed_fields
    assert scaler["fieldsV1"] == REPLICAS and scaler["manager"] == SCALER
    assert operator["fieldsV1"] == container({**ENV_A, **ENV_B}, "f:terminationMessagePath")
    assert status == STATUS
    # B (dropped from the pool while the scaler co-owned it) and a default are the
    # operator's now, but it does not apply them: the next apply removes them
    assert handed.reapply


def test_nothing_to_hand_over_once_the_scaler_owns_only_the_replicas() -> None:
    managed = [entry(FIELD_MANAGER, "Apply", container(ENV_A)),
               entry(SCALER, "Update", REPLICAS), STATUS,
               entry(SCALER, "Update", REPLICAS, "scale")]
    assert hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER) is None
    assert not scaler_owns_more(managed, scaler=SCALER)
    assert scaler_owns_more(created(ENV_A), scaler=SCALER)


def test_no_reapply_when_the_operator_already_owned_everything_moved() -> None:
    managed = [entry(FIELD_MANAGER, "Apply", container(ENV_A)),
               entry(SCALER, "Update", union(REPLICAS, container(ENV_A)))]
    handed = hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER)
    assert handed is not None and not handed.reapply
    assert handed.managed_fields[1]["fieldsV1"] == REPLICAS


def test_a_scaler_entry_without_the_replicas_goes() -> None:
    """KEDA's HPA took the replicas (its scale subresource writes): the scaler's creation
    entry owns none of them, and keeps nothing."""
    managed = [entry(SCALER, "Update", container(ENV_B)), STATUS,
               entry(FIELD_MANAGER, "Apply", container(ENV_A))]
    handed = hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER)
    assert handed is not None
    assert [e["manager"] for e in handed.managed_fields] == [STATUS["manager"], FIELD_MANAGER]
    assert patched(managed, handed.patch) == handed.managed_fields


def test_the_patch_fails_when_an_entry_it_changes_changed_meanwhile() -> None:
    """Only the entries handed over are tested: the controller's status entry may change."""
    managed = created({**ENV_A, **ENV_B})
    handed = hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER)
    assert handed is not None
    moved_on = copy.deepcopy(managed)
    moved_on[2]["fieldsV1"] = {"f:status": {"f:readyReplicas": {}}}
    assert patched(moved_on, handed.patch)[2] == moved_on[2]
    moved_on[1]["fieldsV1"] = REPLICAS
    with pytest.raises(AssertionError, match="test of entry 1 fails"):
        patched(moved_on, handed.patch)


def test_no_hand_over_before_the_operator_applied() -> None:
    managed = [entry(SCALER, "Update", union(REPLICAS, container(ENV_A)))]
    assert hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER) is None


def test_the_set_operations_on_field_trees() -> None:
    a = {"f:spec": {"f:replicas": {}, "f:paused": {}}, "f:metadata": {"f:labels": {"f:x": {}}}}
    b = {"f:spec": {"f:replicas": {}}, "f:metadata": {"f:labels": {"f:y": {}}}}
    assert difference(a, b) == {"f:spec": {"f:paused": {}},
                                "f:metadata": {"f:labels": {"f:x": {}}}}
    assert intersection(a, b) == {"f:spec": {"f:replicas": {}}}
    assert union(a, b) == {"f:spec": {"f:replicas": {}, "f:paused": {}},
                           "f:metadata": {"f:labels": {"f:x": {}, "f:y": {}}}}
    assert difference(a, a) == {} and intersection(a, {}) == {}
