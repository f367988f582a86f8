"""The operator's index of pools: which pools a sync must visit at once."""

from __future__ import annotations

from typing import Any

from jobpool.k8s.handlers import PoolIndex


def pool(image: str = "jobpool:1", status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "mdm", "name": "p", "uid": "u1"},
            "spec": {"image": image}, "status": status or {}}


def test_new_and_changed_specs_are_visited_at_once_status_changes_are_not() -> None:
    index = PoolIndex()
    index.seen(None, pool())
    assert index.take_changed() == [("mdm", "p")]
    index.seen("MODIFIED", pool(status={"laneCount": 1}))  # the operator's own status write
    assert index.take_changed() == []
    index.seen("MODIFIED", pool(image="jobpool:2"))
    assert index.take_changed() == [("mdm", "p")]
    assert index.take_changed() == []


def test_a_deleted_pool_is_forgotten() -> None:
    index = PoolIndex()
    index.seen("ADDED", pool())
    index.seen("DELETED", pool())
    assert index.keys() == [] and index.take_changed() == []
    assert index.get(("mdm", "p")) is None


def test_a_written_status_is_what_the_next_sync_starts_from() -> None:
    index = PoolIndex()
    index.seen("ADDED", pool(status={"laneCount": 1, "readyJobs": 0}))
    index.wrote_status(("mdm", "p"), {"readyJobs": 5})
    found = index.get(("mdm", "p"))
    assert found is not None and found["status"] == {"laneCount": 1, "readyJobs": 5}
