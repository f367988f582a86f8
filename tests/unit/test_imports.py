"""Import batch planning and file staging (jobpool.core.imports, jobpool.data.staging)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobpool.core.attributes import AttributeSpec
from jobpool.core.imports import StagedRow, plan_batch
from jobpool.data.staging import detect_format, read_csv, read_file, read_jsonl

ATTRS = {"name": AttributeSpec("name", "string", required=True)}


def _row(line: int, key: str, name: str = "N") -> StagedRow:
    return StagedRow(line, json.dumps({"external_key": key, "name": name}))


def test_a_batch_splits_repeated_keys_into_separate_chunks_in_file_order() -> None:
    rows = [_row(2, "a"), _row(3, "b"), _row(4, "a", "later"), _row(5, "c"),
            StagedRow(6, json.dumps({"external_key": "d"}))]
    plan = plan_batch(rows, ATTRS, key_field="external_key", unknown_keys="reject",
                      type_key="t")
    assert plan.last_line == 6
    assert [[e.external_key for e in chunk] for chunk in plan.chunks] == [["a", "b"], ["a", "c"]]
    assert plan.chunks[1][0].attributes == {"name": "later"}
    assert plan.rejected == 1
    assert plan.outcomes[6].error == "line 6: field 'name': is required"


def test_rows_rejected_at_staging_stay_rejected() -> None:
    rows = [StagedRow(2, "[]", "rejected", None, "line 2: has 3 fields, the header has 2")]
    plan = plan_batch(rows, ATTRS, key_field="external_key", unknown_keys="reject", type_key="t")
    assert plan.chunks == [] and plan.outcomes[2].status == "rejected"


def test_csv_records_carry_their_starting_line_number() -> None:
    text = 'external_key,name\nk1,"two\nlines"\n\nk2,x,extra\nk3,"a\x00b"\n'
    records = list(read_csv(text.splitlines(keepends=True)))
    assert [r.line_no for r in records] == [2, 5, 6]
    assert json.loads(records[0].raw) == {"external_key": "k1", "name": "two\nlines"}
    assert records[1].error == "line 5: has 3 fields, the header has 2"
    assert json.loads(records[2].raw)["name"] == "a\x00b"
    assert "\x00" not in records[2].raw  # staged text cannot hold NUL; JSON escapes it


def test_csv_header_problems_are_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        list(read_csv(["a,a\n"]))
    with pytest.raises(ValueError, match="empty"):
        list(read_csv([]))


def test_jsonl_keeps_lines_and_escapes_nul() -> None:
    records = list(read_jsonl(['{"a": 1}\n', "\n", '{"b": "x\x00"}\n']))
    assert [r.line_no for r in records] == [1, 3]
    assert json.loads(records[1].raw) == {"b": "x\x00"}


def test_formats_and_encodings(tmp_path: Path) -> None:
    assert detect_format(Path("x.CSV"), None) == "csv"
    assert detect_format(Path("x.ndjson"), None) == "jsonl"
    assert detect_format(Path("x.txt"), "jsonl") == "jsonl"
    with pytest.raises(ValueError, match="cannot tell the format"):
        detect_format(Path("x.txt"), None)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"external_key,name\nk1,\xff\n")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        list(read_file(bad, "csv"))
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffexternal_key,name\nk1,A\n".encode())
    assert json.loads(next(read_file(bom, "csv")).raw) == {"external_key": "k1", "name": "A"}
