"""docs/schedules.md stays true: its pool file is valid, its field table is the declaration's
fields and the CRD's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from jobpool.core import poolspec, schedules
from jobpool.core.poolspec import load_pool

PAGE = Path(__file__).resolve().parents[2] / "docs" / "schedules.md"


def test_the_example_pool_declares_its_schedules() -> None:
    block = re.search(r"```yaml\n(.*?)```", PAGE.read_text("utf-8"), re.S)
    assert block is not None
    pool = load_pool(yaml.safe_load(block.group(1)))
    assert [(s.name, s.expression, s.zone, s.missed) for s in pool.schedules] == [
        ("nightly-reindex", "30 2 * * *", "Europe/Berlin", "catch_up_once"),
        ("hourly-ops-mail", "every 3600s", "UTC", "skip"),
    ]


def test_the_example_schedules_pass_their_kinds_payload_checks() -> None:
    """The reindex example's payload once lacked `type_key`: every tick was dropped."""
    from jobpool.core.poolspec import check_schedules
    from jobpool.registry import load_kind_modules

    block = re.search(r"```yaml\n(.*?)```", PAGE.read_text("utf-8"), re.S)
    assert block is not None
    registry = load_kind_modules(())
    check_schedules(load_pool(yaml.safe_load(block.group(1))), registry.names(),
                    registry.payload_problem)


def test_the_field_table_is_every_field() -> None:
    rows = re.findall(r"^\| `(\w+)` \|", PAGE.read_text("utf-8"), re.M)
    crd = poolspec.crd_document()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    declared = crd["properties"]["spec"]["properties"]["schedules"]["items"]["properties"]
    assert set(rows) == set(schedules.DECLARATION_FIELDS) == set(declared)


def test_the_page_states_the_constants_the_code_uses() -> None:
    text = PAGE.read_text("utf-8")
    assert f"at most {schedules.MISSED_AFTER:g} seconds old" in text
    assert f"at least every {schedules.CHECK_MAX:g} seconds" in text
    assert f"1 to {schedules.MAX_INTERVAL}" in text


def test_the_clash_shown_is_the_error_a_second_pool_gets() -> None:
    shown = re.search(r"```text\n(schedule 'nightly-reindex'.*?)```", PAGE.read_text("utf-8"),
                      re.S)
    assert shown is not None
    first = schedules.parse_schedule({"name": "nightly-reindex", "kind": "reindex",
                                      "tenant": "acme", "cron": "30 2 * * *"}, "s")
    second = schedules.parse_schedule({"name": "nightly-reindex", "kind": "bulk_import",
                                       "tenant": "acme", "every": 3600}, "s")
    with pytest.raises(schedules.ScheduleError) as refused:
        schedules.check_owners(schedules.schedule_owner("imports", "mdm"), [second], [
            {"name": first.name, "owner": schedules.schedule_owner("mdm-jobs", "mdm"),
             "definition": first.to_json()}])
    assert str(refused.value) == " ".join(shown.group(1).split())
