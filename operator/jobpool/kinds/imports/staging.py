"""Staging a file for bulk_import: parse CSV or JSON Lines into `mdm.aa_import_row`s.

A staged record is JSON text (`raw`): a CSV row becomes an object keyed by the header, a JSON
Lines line is kept as it is (a NUL byte is escaped as \\u0000, which the import then rejects
by field). Line numbers are the file's physical lines (a CSV header is line 1). A CSV row
with the wrong number of fields is staged already rejected. A file that breaks a limit
(`jobpool.kinds.imports.batch_plan`: columns, header names, characters per record) is refused whole.
Staging, the import job row and the bulk_import job commit in one transaction: the job exists
if and only if the rows do.
"""

from __future__ import annotations

import csv
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from psycopg import AsyncConnection

from jobpool.db.queries import Exec, One
from jobpool.enqueue import enqueue
from jobpool.kinds.entities.attributes import UnknownKeys, check_key
from jobpool.kinds.entities.entity_types import find_entity_type
from jobpool.kinds.imports.batch_plan import MAX_RECORD_CHARS, KeyLines, check_header

COPY_IMPORT_ROWS = Exec("copy_import_rows")
CREATE_IMPORT_JOB = One("create_import_job")
SET_IMPORT_TOTAL = Exec("set_import_total")

Format = Literal["csv", "jsonl"]
FORMATS: dict[str, Format] = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


@dataclass(frozen=True)
class StagedRecord:
    """One record to stage; `error` set means it is staged already rejected."""

    line_no: int
    raw: str
    error: str | None = None


def detect_format(path: Path, given: str | None) -> Format:
    """`given`, or the format the file's suffix names; raises ValueError."""
    if given in ("csv", "jsonl"):
        return "csv" if given == "csv" else "jsonl"
    if given is not None:
        raise ValueError(f"unknown format {given!r}: use csv or jsonl")
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise ValueError(
            f"cannot tell the format of {path.name}: name it .csv, .jsonl or .ndjson, "
            "or pass --format") from None


class RecordLines:
    """The lines of a text stream, at most MAX_RECORD_CHARS characters per record (a CSV
    record may span lines): never more is read into memory. Call `next_record` after each."""

    def __init__(self, stream: TextIO, limit: int = MAX_RECORD_CHARS) -> None:
        self._stream, self._limit = stream, limit
        self._used = 0
        self._lines = 0
        self.record_line = 1

    def __iter__(self) -> RecordLines:
        return self

    def __next__(self) -> str:
        line = self._stream.readline(self._limit - self._used + 1)
        if not line:
            raise StopIteration
        self._lines += 1
        self._used += len(line)
        if self._used > self._limit:
            raise ValueError(f"line {self.record_line}: the record is longer than "
                             f"{self._limit:,} characters (the limit per record)")
        return line

    def next_record(self) -> None:
        """The lines read so far belong to finished records."""
        self._used = 0
        self.record_line = self._lines + 1


def _header(reader: Any) -> list[str]:
    try:
        fields: list[str] = next(reader)
    except StopIteration:
        raise ValueError("the CSV file is empty: it needs a header line") from None
    return check_header(fields)


def read_csv(stream: TextIO, key_field: str | None = None) -> Iterator[StagedRecord]:
    """Records of a CSV text (first line the header); blank lines are skipped.

    Raises ValueError for a bad header, one without the `key_field` column (when given: every
    record would be rejected), a record over MAX_RECORD_CHARS, or text that is not CSV (a
    field over csv's `field_size_limit`, 131,072 characters by default, included).
    """
    lines = RecordLines(stream)
    reader = csv.reader(lines, strict=True)
    try:
        header = _header(reader)
        if key_field is not None and key_field not in header:
            shown = ", ".join(repr(name) for name in header[:20])
            raise ValueError(f"the header has no column {key_field!r} for the records' keys "
                             f"(--key-field); its columns: {shown}")
        lines.next_record()
        previous = reader.line_num
        for row in reader:
            line_no, previous = previous + 1, reader.line_num
            lines.next_record()
            if not row or row == [""]:
                continue
            if len(row) != len(header):
                yield StagedRecord(line_no, json.dumps(row),
                                   f"line {line_no}: has {len(row)} fields, the header has "
                                   f"{len(header)}")
                continue
            yield StagedRecord(line_no, json.dumps(dict(zip(header, row, strict=True)),
                                                   ensure_ascii=False))
    except csv.Error as exc:
        raise ValueError(f"not valid CSV: line {lines.record_line}: {exc}") from None


def read_jsonl(stream: TextIO) -> Iterator[StagedRecord]:
    """Records of a JSON Lines text, each line at most MAX_RECORD_CHARS characters (else
    ValueError); blank lines are skipped, lines are not parsed here."""
    lines = RecordLines(stream)
    for line_no, line in enumerate(lines, start=1):
        lines.next_record()
        text = line.rstrip("\r\n")
        if text.strip():
            yield StagedRecord(line_no, text.replace("\x00", "\\u0000"))


def read_file(path: Path, fmt: Format, key_field: str | None = None) -> Iterator[StagedRecord]:
    """Records of `path` (UTF-8, optional BOM); raises ValueError, naming the file, for text
    that is not UTF-8 or breaks a limit of `read_csv` (`key_field`: the column a CSV header
    must have) / `read_jsonl`."""
    with path.open(encoding="utf-8-sig", newline="") as handle:
        try:
            yield from (read_csv(handle, key_field) if fmt == "csv" else read_jsonl(handle))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path.name} is not valid UTF-8: {exc.reason} at byte "
                             f"{exc.start}") from None
        except ValueError as exc:
            raise ValueError(f"{path.name}: {exc}") from None


@dataclass(frozen=True)
class Staged:
    """What staging created."""

    import_job_id: int
    job_id: int
    rows: int


async def stage_import(
    conn: AsyncConnection[Any], records: Iterable[StagedRecord], *, tenant_id: uuid.UUID,
    type_key: str, source_name: str, fmt: Format, key_field: str = "external_key",
    unknown_keys: UnknownKeys = "reject", batch_size: int | None = None, actor: str | None = None,
) -> Staged:
    """Stage `records` and enqueue their bulk_import job, in the caller's transaction.

    Raises ValueError for a bad type_key (before any SQL) or an entity type the tenant lacks.
    """
    check_key("type_key", type_key)
    entity_type = await find_entity_type(conn, tenant_id, type_key)
    if entity_type is None:
        raise ValueError(f"the tenant has no entity type {type_key!r}")
    created = await CREATE_IMPORT_JOB(conn, {
        "tenant_id": tenant_id, "entity_type_id": entity_type["id"], "source_name": source_name,
        "format": fmt, "key_field": key_field, "unknown_keys": unknown_keys,
        "created_by": actor or "jobpool-cli"})
    assert created is not None
    import_job_id: int = created["id"]
    rows = 0
    keys = KeyLines(key_field)
    async with conn.cursor() as copy_cur, copy_cur.copy(COPY_IMPORT_ROWS.text) as copy:
        for record in records:
            duplicate = None if record.error else keys.duplicate(record.line_no, record.raw)
            error = record.error or duplicate
            status = "staged" if error is None else "rejected"
            await copy.write_row((import_job_id, record.line_no, record.raw, status,
                                  key_field if duplicate else None, error))
            rows += 1
    await SET_IMPORT_TOTAL(conn, {"id": import_job_id})
    payload: dict[str, Any] = {"import_job_id": import_job_id}
    if batch_size is not None:
        payload["batch_size"] = batch_size
    job = await enqueue(conn, tenant_id=tenant_id, kind="bulk_import", payload=payload,
                        actor=actor)
    return Staged(import_job_id, job.id, rows)
