"""Field ownership of a lane's Deployment: the scaler's creation handed over to the
operator's apply (managedFields as the API server writes them)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jobpool.k8s.client import ApiError
from jobpool.k8s.handlers import HAND_OVER_TRIES, PoolController, SyncOutcome
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
from jobpool.k8s.reconcile import Action

ENV_A = {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}}
ENV_B = {"k:{\"name\":\"B\"}": {".": {}, "f:name": {}, "f:value": {}}}


def container(env: dict[str, Any], *more: str) -> dict[str, Any]:
    return {"f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"w\"}": {
        ".": {}, "f:env": env, "f:image": {}, **{name: {} for name in more}}}}}}}


def entry(manager: str, operation: str, fields: dict[str, Any],
          subresource: str | None = None) -> dict[str, Any]:
    found = {"manager": manager, "operation": operation, "apiVersion": "apps/v1",
             "time": "2026-12-07T04:44:32Z", "fieldsType": "FieldsV1", "fieldsV1": fields}
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
    """`managed` after the JSON patch `patch` (tests and replacements of an entry's keys,
    removals of entries), as the API server applies it; AssertionError where a test fails
    (the server's 422)."""
    entries = copy.deepcopy(managed)
    for op in patch:
        index, _, key = op["path"].removeprefix("/metadata/managedFields/").partition("/")
        entry = entries[int(index)]
        if op["op"] == "test":
            assert entry.get(key) == op["value"], f"test of entry {index} fails"
        elif op["op"] == "replace":
            entry[key] = op["value"]
        else:
            assert (op["op"], key) == ("remove", "")
            del entries[int(index)]
    return entries


def test_the_scaler_keeps_the_replicas_and_the_operator_gets_the_rest() -> None:
    managed = created({**ENV_A, **ENV_B})
    handed = hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER)
    assert handed is not None
    operator, scaler, status = patched(managed, handed.patch)
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
    assert patched(managed, handed.patch)[1]["fieldsV1"] == REPLICAS


def test_a_scaler_entry_without_the_replicas_goes() -> None:
    """KEDA's HPA took the replicas (its scale subresource writes): the scaler's creation
    entry owns none of them, and keeps nothing."""
    managed = [entry(SCALER, "Update", container(ENV_B)), STATUS,
               entry(FIELD_MANAGER, "Apply", container(ENV_A))]
    handed = hand_over(managed, applier=FIELD_MANAGER, scaler=SCALER)
    assert handed is not None
    after = patched(managed, handed.patch)
    assert [e["manager"] for e in after] == [STATUS["manager"], FIELD_MANAGER]
    assert after[1]["fieldsV1"] == container({**ENV_A, **ENV_B})  # B handed over too
    assert after[1]["time"] == managed[2]["time"]  # the rest of an entry as stored


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


class RefusingApi:
    """A Kubernetes API whose managedFields patches fail with `status`; reads answer the
    Deployment as created."""

    def __init__(self, status: int, deployment: dict[str, Any]) -> None:
        self.status = status
        self.deployment = deployment
        self.patches = 0

    async def patch_managed_fields(self, namespace: str, name: str,
                                   patch: list[dict[str, Any]]) -> dict[str, Any]:
        self.patches += 1
        raise ApiError(self.status, "Invalid", "the test of an entry failed")

    async def read_child(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.deployment)


@pytest.mark.parametrize(("status", "patches"), [(422, HAND_OVER_TRIES), (403, 1)])
async def test_a_hand_over_that_fails_is_a_problem_of_the_sync_not_a_failed_apply(
        status: int, patches: int) -> None:
    """Entries that keep changing (422) are read again a few times; any other refusal ends
    it at once. Either way the Deployment, applied, is kept and scaled, and the sync names
    the problem (the next sync tries again)."""
    deployment = {"metadata": {"name": "p-default", "managedFields": created(ENV_A)}}
    api = RefusingApi(status, deployment)
    controller = PoolController(api)  # type: ignore[arg-type]
    outcome = SyncOutcome()
    action = Action("apply", "Deployment", "p-default", {})
    kept = await controller._hand_over("ns", action, deployment, outcome)
    assert kept["metadata"]["name"] == "p-default"
    assert api.patches == patches
    [problem] = outcome.problems
    assert problem.reason == "ReconcileFailed"
    assert problem.message.startswith(
        "hand over the fields of Deployment 'p-default' from jobpool-scaler to "
        f"jobpool-operator failed: {status} Invalid")
