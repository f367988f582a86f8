"""Which first statements of a job must open its transaction themselves
(`jobpool.db.connect.sets_transaction`)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from psycopg import sql

from jobpool.db.connect import sets_transaction

NO_CONNECTION = cast(Any, None)  # texts and bytes need none


@pytest.mark.parametrize("query", [
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    "  -- the job's isolation\n set transaction read only",
    "/* snapshot of the export */ SET TRANSACTION SNAPSHOT '00000003-0000001B-1'",
    "SET LOCAL transaction_isolation = 'repeatable read'",
    b"SET transaction_read_only = on",
])
def test_statements_that_must_come_first_are_recognised(query: Any) -> None:
    assert sets_transaction(query, NO_CONNECTION)


@pytest.mark.parametrize("query", [
    "SELECT 1", "SET work_mem = '64MB'", "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "SET default_transaction_isolation = serializable", "INSERT INTO t VALUES (1); SET "
    "TRANSACTION READ ONLY", "SET transactions_seen = 1",
])
def test_other_statements_are_not(query: str) -> None:
    assert not sets_transaction(query, NO_CONNECTION)


def test_a_composed_query_is_read_as_its_text() -> None:
    assert sets_transaction(sql.SQL("SET TRANSACTION ISOLATION LEVEL {}").format(
        sql.SQL("SERIALIZABLE")), NO_CONNECTION)
