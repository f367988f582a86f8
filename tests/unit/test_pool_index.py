"""The operator's index of pools: which pools a sync must visit at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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


def other(name: str, uid: str = "u2") -> dict[str, Any]:
    return {"metadata": {"namespace": "mdm", "name": name, "uid": uid}, "spec": {"image": "x"}}


def test_a_pool_deleted_in_a_watch_gap_is_forgotten_by_the_next_list() -> None:
    # the watch was cut, the pool deleted, the watch listed again: no DELETED came
    index = PoolIndex()
    index.seen("ADDED", pool())
    index.seen("ADDED", other("q"))
    index.take_changed()
    since = index.mark()
    assert index.resync([other("q")], since) == [("mdm", "p")]
    assert index.keys() == [("mdm", "q")] and index.get(("mdm", "p")) is None
    assert index.take_changed() == []  # q as listed is q as seen


def test_a_list_never_undoes_what_the_watch_told_while_it_ran() -> None:
    index = PoolIndex()
    index.seen("ADDED", pool())
    since = index.mark()  # the list is sent ...
    index.seen("ADDED", other("new"))  # ... a pool is created and one deleted meanwhile
    index.seen("DELETED", pool())
    assert index.resync([pool()], since) == []  # the list saw p, not "new"
    assert index.keys() == [("mdm", "new")]


def test_a_list_brings_what_the_watch_missed() -> None:
    index = PoolIndex()
    index.seen("ADDED", pool())
    index.take_changed()
    deleting = pool(image="jobpool:2")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T20:00:00Z"
    since = index.mark()
    index.resync([deleting, other("q")], since)
    assert index.take_changed() == [("mdm", "p"), ("mdm", "q")]
    found = index.get(("mdm", "p"))
    assert found is not None and found["metadata"]["deletionTimestamp"]
    recreated = pool()
    recreated["metadata"]["uid"] = "u9"  # deleted and made again under the same name
    index.resync([recreated], index.mark())
    assert index.take_changed() == [("mdm", "p")]


def test_a_deleted_pool_is_kept_for_its_schedules_until_it_is_stored_again() -> None:
    index = PoolIndex()
    index.seen("ADDED", pool())
    index.seen("DELETED", pool())
    [(key, gone)] = index.gone()
    assert key == ("mdm", "p") and gone.body["spec"] == {"image": "jobpool:1"}
    assert gone.retired_at is None and gone.failures == 0
    index.seen("ADDED", {**pool(), "metadata": {"namespace": "mdm", "name": "p", "uid": "u9"}})
    assert index.gone() == []  # created again: its new workers own the schedules


def test_a_pool_a_list_finds_gone_is_kept_for_its_schedules_until_dropped() -> None:
    index = PoolIndex()
    index.seen("ADDED", pool())
    index.seen("ADDED", other("q"))
    since = index.mark()
    index.resync([other("q")], since)
    assert [key for key, _ in index.gone()] == [("mdm", "p")]
    index.forget_gone(("mdm", "p"))
    assert index.gone() == []


def test_a_pool_never_stored_leaves_nothing_to_retire() -> None:
    index = PoolIndex()
    index.seen("DELETED", pool())  # a DELETED for a pool the index never held
    assert index.gone() == []


async def test_a_wait_cancelled_as_a_watch_event_wakes_it_ends() -> None:
    # the operator's loop waits here; stopped just as an event came, it must stop, not wait
    # again (asyncio.wait_for lost such a cancellation on Python 3.11)
    index = PoolIndex()
    waiting = asyncio.create_task(index.wait(10.0))
    for _ in range(3):
        await asyncio.sleep(0)
    index.seen("ADDED", pool())
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
