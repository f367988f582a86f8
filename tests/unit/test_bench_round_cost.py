"""The claim-round cost benchmark's reading of an EXPLAIN plan (bench/round_cost.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import pytest
from round_cost import node_time

PLAN = {"Node Type": "CTE Scan", "Actual Total Time": 1.6, "Plans": [
    {"Node Type": "LockRows", "Actual Total Time": 0.3, "Shared Hit Blocks": 111, "Plans": []},
    {"Node Type": "ModifyTable", "Operation": "Update", "Actual Total Time": 1.5,
     "Shared Hit Blocks": 1206, "Shared Read Blocks": 4, "Plans": [
         {"Node Type": "LockRows", "Actual Total Time": 9.9, "Shared Hit Blocks": 1}]},
    {"Node Type": "ModifyTable", "Operation": "Insert", "Actual Total Time": 0.7,
     "Shared Hit Blocks": 640}]}


def test_a_part_is_found_by_node_type_or_by_the_operation_of_a_modify_table() -> None:
    assert node_time(PLAN, "LockRows") == (0.3, 111)  # the first in plan order, not the nested one
    assert node_time(PLAN, "Update") == (1.5, 1210)  # buffers hit and read
    assert node_time(PLAN, "Insert") == (0.7, 640)


def test_a_part_the_plan_lacks_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="no Delete node"):
        node_time(PLAN, "Delete")
