import pytest

from jobpool.settings import Settings
from jobpool.sql import QUERIES, migrations, parse_queries


def test_settings_from_env() -> None:
    settings = Settings.from_env({"JOBPOOL_DSN": "postgresql:///x", "JOBPOOL_METRICS_PORT": "9200",
                                  "UNRELATED": "1"})
    assert settings.dsn == "postgresql:///x"
    assert settings.metrics_port == 9200
    assert Settings.from_env({}).metrics_port == 9108


def test_settings_name_a_bad_variable() -> None:
    with pytest.raises(ValueError, match="JOBPOOL_METRICS_PORT"):
        Settings.from_env({"JOBPOOL_METRICS_PORT": "ninety"})


def test_named_queries_parse() -> None:
    parsed = parse_queries("-- name: a :one\n-- First.\nSELECT 1;\n\n-- name: b :many\nSELECT 2;\n")
    assert parsed["a"].doc == "First."
    assert parsed["a"].text == "SELECT 1;"
    assert parsed["b"].shape == "many"


def test_duplicate_query_names_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a :one\nSELECT 1;\n-- name: a :one\nSELECT 2;\n")


def test_every_query_has_a_description_and_the_claim_is_the_spec_form() -> None:
    assert all(query.doc for query in QUERIES.values())
    claim = QUERIES["claim_jobs"].text
    assert "FOR UPDATE SKIP LOCKED" in claim
    assert "ORDER BY priority, available_at" in claim


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [version for version, _, _ in migrations()]
    assert versions == list(range(1, len(versions) + 1))
