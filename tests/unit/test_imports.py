"""Import batch planning and file staging (the batch_plan and staging modules of kinds/imports)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from jobpool.kinds.entities.attributes import (
    MAX_FIELDS,
    AttributeSpec,
    RejectedRecord,
    validate_record,
)
from jobpool.kinds.imports.batch_plan import FIELD_LIMIT, MAX_RECORD_CHARS, StagedRow, plan_batch
from jobpool.kinds.imports.staging import detect_format, read_csv, read_file, read_jsonl

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
    records = list(read_csv(io.StringIO(text)))
    assert [r.line_no for r in records] == [2, 5, 6]
    assert json.loads(records[0].raw) == {"external_key": "k1", "name": "two\nlines"}
    assert records[1].error == "line 5: has 3 fields, the header has 2"
    assert json.loads(records[2].raw)["name"] == "a\x00b"
    assert "\x00" not in records[2].raw  # staged text cannot hold NUL; JSON escapes it


def test_csv_header_problems_are_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        list(read_csv(io.StringIO("a,a\n")))
    with pytest.raises(ValueError, match="empty"):
        list(read_csv(io.StringIO("")))


def test_a_csv_without_the_key_column_is_refused_before_staging() -> None:
    """It was staged, then every record rejected, its job done: nothing said why up front."""
    with pytest.raises(ValueError) as refused:
        list(read_csv(io.StringIO("sku,name\nk1,A\n"), key_field="external_key"))
    assert str(refused.value) == ("the header has no column 'external_key' for the records' "
                                  "keys (--key-field); its columns: 'sku', 'name'")
    [record] = read_csv(io.StringIO("sku,name\nk1,A\n"), key_field="sku")
    assert json.loads(record.raw) == {"sku": "k1", "name": "A"}


def test_jsonl_keeps_lines_and_escapes_nul() -> None:
    records = list(read_jsonl(io.StringIO('{"a": 1}\n\n{"b": "x\x00"}\n')))
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


def _header(names: list[str]) -> io.StringIO:
    return io.StringIO(",".join(names) + "\n" + ",".join("v" for _ in names) + "\n")


def test_a_csv_header_over_the_column_limit_is_refused_naming_the_limit() -> None:
    with pytest.raises(ValueError, match=f"has {MAX_FIELDS + 1:,} columns, more than the "
                                         f"limit of {MAX_FIELDS:,}"):
        list(read_csv(_header([f"c{i}" for i in range(MAX_FIELDS + 1)])))
    [record] = read_csv(_header([f"c{i}" for i in range(MAX_FIELDS)]))
    assert len(json.loads(record.raw)) == MAX_FIELDS


@pytest.mark.parametrize(
    ("names", "problem"),
    [(["a", "x" * (FIELD_LIMIT + 1)], f"column 2 has a name of {FIELD_LIMIT + 1} characters"),
     (["a", " "], "column 2 has an empty name"),
     (["a", "b\x00"], "column 2 has an empty name or a NUL"),
     ([*("dup" for _ in range(MAX_FIELDS // 2)), *(f"d{i}" for i in range(MAX_FIELDS // 2))],
      "names 'dup' more than once"),
     (["b", "a", "b", "a", " a"], "names 'a', 'b' more than once")],
)
def test_csv_header_names_are_checked(names: list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        list(read_csv(_header(names)))


def test_a_record_over_the_character_limit_is_refused_naming_its_line() -> None:
    long_line = '{"external_key": "k", "name": "' + "x" * MAX_RECORD_CHARS + '"}\n'
    with pytest.raises(ValueError, match=f"line 2: the record is longer than "
                                         f"{MAX_RECORD_CHARS:,} characters"):
        list(read_jsonl(io.StringIO('{"a": 1}\n' + long_line)))
    half = "y" * 60_000  # fields under csv's own limit, a record over ours, over 11 lines
    cells = ",".join(f'"{half}\n{half}"' for _ in range(10))
    spanning = f"{','.join(f'c{i}' for i in range(10))}\n{','.join('v' * 10)}\n{cells}\n"
    with pytest.raises(ValueError, match="line 3: the record is longer than"):
        list(read_csv(io.StringIO(spanning)))
    just_under = '{"k": "' + "x" * (MAX_RECORD_CHARS - 20) + '"}\n'
    assert len(list(read_jsonl(io.StringIO(just_under)))) == 1


def test_a_csv_field_over_the_csv_limit_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    path.write_text("external_key,name\nk1,a\nk2," + "z" * 200_000 + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"big.csv: not valid CSV: line 3: field larger than "
                                         r"field limit \(131072\)"):
        list(read_file(path, "csv"))


def test_a_record_with_more_fields_than_the_limit_is_rejected() -> None:
    record = json.dumps({"external_key": "k", **{f"f{i}": 1 for i in range(MAX_FIELDS)}})
    checked = validate_record(record, {}, key_field="external_key", unknown_keys="ignore")
    assert checked == RejectedRecord(None, f"record has {MAX_FIELDS + 1:,} fields, more than "
                                           f"the limit of {MAX_FIELDS:,}")
