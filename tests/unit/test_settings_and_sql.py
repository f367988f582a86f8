import pytest
from psycopg import _queries as psycopg_queries

from jobpool.db.connect import DONE_STATEMENT, job_end_query
from jobpool.db.store import (
    CLAIM_JOBS,
    COMPLETE_JOB_OR_RAISE,
    COMPLETE_JOBS,
    COMPLETED_BEFORE,
    escaped_literal,
)
from jobpool.settings import Settings
from jobpool.sql import MAX_CACHED_TEXT, load_queries, migrations, parse_queries


def test_settings_from_env() -> None:
    settings = Settings.from_env({"JOBPOOL_DSN": "postgresql:///x", "JOBPOOL_METRICS_PORT": "9200",
                                  "UNRELATED": "1"})
    assert settings.dsn == "postgresql:///x"
    assert settings.metrics_port == 9200
    assert Settings.from_env({}).metrics_port == 9108


def test_settings_name_a_bad_variable() -> None:
    with pytest.raises(ValueError, match="JOBPOOL_METRICS_PORT"):
        Settings.from_env({"JOBPOOL_METRICS_PORT": "ninety"})


PORT_RANGE = "JOBPOOL_METRICS_PORT must be a whole number from 0 to 65535"


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("JOBPOOL_METRICS_PORT", "70000", PORT_RANGE),
    ("JOBPOOL_METRICS_PORT", "-1", PORT_RANGE),
    ("JOBPOOL_METRICS_PORT", "9e3", PORT_RANGE),
    ("JOBPOOL_METRICS_PORT", "9" * 5000, PORT_RANGE),
    ("JOBPOOL_CLAMD_STREAM_MAX_LENGTH", "0",
     "JOBPOOL_CLAMD_STREAM_MAX_LENGTH must be a whole number from 1 to 4294967296"),
    ("JOBPOOL_CLAMD_STREAM_MAX_LENGTH", "99999999999999",
     "JOBPOOL_CLAMD_STREAM_MAX_LENGTH must be a whole number from 1 to 4294967296"),
    ("JOBPOOL_SMTP_URL", "smtp://user:secret@mail:99999",
     "JOBPOOL_SMTP_URL is not a usable URL: Port out of range 0-65535"),
    ("JOBPOOL_CLAMD_URL", "tcp://clamd:port", "JOBPOOL_CLAMD_URL is not a usable URL: Port"),
])
def test_numbers_out_of_range_in_settings_are_refused_at_start(variable: str, value: str,
                                                               message: str) -> None:
    with pytest.raises(ValueError) as info:
        Settings.from_env({variable: value})
    assert str(info.value).startswith(message)
    assert "secret" not in str(info.value)


def test_settings_made_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="metrics_port must be a whole number from 0 to 65535"):
        Settings(metrics_port=True)


def test_named_queries_parse() -> None:
    parsed = parse_queries("-- name: a :one\n-- First.\nSELECT 1;\n\n-- name: b :many\nSELECT 2;\n")
    assert parsed["a"].doc == "First."
    assert parsed["a"].text == "SELECT 1;"
    assert parsed["b"].shape == "many"


def test_comment_lines_and_indentation_are_left_out_of_the_text() -> None:
    parsed = parse_queries("-- name: a :many\n-- First.\nWITH x AS (\n    -- why\n    SELECT 1\n)"
                           "\nSELECT * FROM x; -- kept\n")
    assert parsed["a"].text == "WITH x AS (\nSELECT 1\n)\nSELECT * FROM x; -- kept"


def test_the_claim_and_the_batched_done_fit_psycopgs_query_cache() -> None:
    assert MAX_CACHED_TEXT == psycopg_queries.MAX_CACHED_STATEMENT_LENGTH
    for query in (CLAIM_JOBS, COMPLETE_JOBS, COMPLETED_BEFORE):
        assert len(query.text.encode()) <= MAX_CACHED_TEXT, query.name


def test_a_writing_job_resets_its_session_inside_its_transaction_and_commits_last() -> None:
    """One transaction per writing job: nothing follows the COMMIT. The handler's deferred
    constraints are checked first, in a statement of their own (their failure is the
    handler's, told from the `done`'s by its place), then the handler's statement and lock
    timeouts are lifted, in a statement of its own before the `done` (a timeout starts with
    its statement),
    then the `done` (`mdm.aa_job_end` also readies the transaction for the reset), the reset,
    the COMMIT."""
    assert "mdm.aa_job_end(" in COMPLETE_JOB_OR_RAISE.text
    statements = job_end_query(b"DONE;").decode().split(";\n")
    assert statements == ["SET CONSTRAINTS ALL IMMEDIATE",
                          "SELECT pg_catalog.set_config('statement_timeout', '0', true),\n"
                          "pg_catalog.set_config('lock_timeout', '0', true)",
                          "DONE",
                          "SELECT prepared, handler_made FROM mdm.aa_reset_session()",
                          "COMMIT;"]
    assert statements[DONE_STATEMENT] == "DONE"
    kept = job_end_query(b"DONE;", keep_when_idle=True).decode().splitlines()
    assert kept[-2:] == ["SET idle_session_timeout = 0;", "COMMIT;"]


def test_the_job_end_function_readies_the_reset_after_the_done() -> None:
    """In this order: the `done` (which may raise), no statement timeout for the reset, then
    the worker's role."""
    function = next(text for _, name, text in migrations()
                    if name == "reset_keeps_the_commits_durability")
    body = function[function.index("FUNCTION mdm.aa_job_end"):]
    steps = ["mdm.aa_job_done(", "set_config('statement_timeout', '0', true)",
             "SET SESSION AUTHORIZATION DEFAULT"]
    assert [body.index(step) for step in steps] == sorted(body.index(step) for step in steps)


def test_the_done_sent_before_a_commit_ends_its_statement() -> None:
    """`end_job` sends it, then COMMIT, in one text: its `;` is what separates them."""
    assert COMPLETE_JOB_OR_RAISE.text.endswith(";")


def test_duplicate_query_names_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a :one\nSELECT 1;\n-- name: a :one\nSELECT 2;\n")


def test_every_query_has_a_description_and_the_claim_is_the_spec_form() -> None:
    assert all(query.doc for query in load_queries().values())
    claim = CLAIM_JOBS.text
    assert "FOR UPDATE SKIP LOCKED" in claim
    assert "ORDER BY priority, available_at, id\nLIMIT 1" in claim


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [version for version, _, _ in migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_an_escaped_literal_reads_the_same_under_either_string_setting() -> None:
    assert escaped_literal("it's a \\ test") == "E'it''s a \\\\ test'"
    assert escaped_literal("¥ é 🎉") == "E'\\u00a5 \\u00e9 \\U0001f389'"  # ASCII alone
    with pytest.raises(ValueError, match="NUL"):
        escaped_literal("a\0b")
