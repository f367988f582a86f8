"""Numbers the `jobpool` command takes from flags and `JOBPOOL_*` variables: out of range is
a usage error (exit 2) naming the flag or the variable, before anything runs."""

from __future__ import annotations

import pytest

from jobpool.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--slots", "0"], "argument --slots: must be a whole number from 1 to 256, got '0'"),
    (["run", "--slots", "100000"], "argument --slots: must be a whole number from 1 to 256"),
    (["run", "--slots", "abc"], "argument --slots: must be a whole number from 1 to 256"),
    (["run", "--grace", "inf"], "argument --grace: must be from 0.1 to 3600 seconds, got inf"),
    (["run", "--grace", "nan"], "argument --grace: must be from 0.1 to 3600 seconds, got nan"),
    (["run", "--grace", "0"], "argument --grace: must be from 0.1 to 3600 seconds, got 0"),
    (["run", "--grace", "soon"], "argument --grace: must be from 0.1 to 3600 seconds, got soon"),
    (["run", "--poll-interval", "0"], "argument --poll-interval: must be from 0.01 to 3600"),
    (["run", "--poll-interval", "1e308"], "argument --poll-interval: must be from 0.01 to 3600"),
    (["run", "--metrics-port", "65536"], "argument --metrics-port: must be a whole number from 0"),
    (["run", "--metrics-port", "http"], "argument --metrics-port: must be a whole number from 0"),
    (["enqueue", "k", "--tenant", "t", "--count", "1000000000"],
     "argument --count: must be a whole number from 1 to 100000"),
    (["enqueue", "k", "--tenant", "t", "--max-attempts", "9999999999"],
     "argument --max-attempts: must be a whole number from 1 to 1000"),
    (["enqueue", "k", "--tenant", "t", "--priority", "40000"],
     "argument --priority: must be a whole number from -32768 to 32767"),
    (["dlq", "list", "--limit", "100000"],
     "argument --limit: must be a whole number from 1 to 1000"),
    (["dlq", "list", "--after", "-1"], "argument --after: must be a whole number from 0 to"),
    (["jobs", "show", "99999999999999999999"], "argument id: must be a whole number from 1 to"),
    (["dlq", "replay", "0"], "argument id: must be a whole number from 1 to"),
    (["demo", "--emails", "10000000"], "argument --emails: must be a whole number from 1 to 1000"),
    (["operator", "--scale-interval", "inf"],
     "argument --scale-interval: must be from 1 to 3600 seconds, got inf"),
    (["api", "--port", "99999"], "argument --port: must be a whole number from 0 to 65535"),
    # JSON a person wrote: a key given twice would keep one of its values without a word
    (["enqueue", "k", "--tenant", "t", "--payload", '{"to": "a@x", "to": "b@x"}'],
     "argument --payload: not valid JSON: the key 'to' is given twice in one object"),
    (["tenants", "add", "acme", "--metadata", '{"rate_limit": {}, "rate_limit": {}}'],
     "argument --metadata: not valid JSON: the key 'rate_limit' is given twice"),
])
def test_a_flag_out_of_range_is_a_usage_error_naming_it(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("variable", "value", "argv", "message"), [
    ("JOBPOOL_GRACE", "inf", ["run"],
     "jobpool: error: JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got inf"),
    ("JOBPOOL_SLOTS", "-4", ["run"],
     "jobpool: error: JOBPOOL_SLOTS must be a whole number from 1 to 256, got '-4'"),
    ("JOBPOOL_POLL_INTERVAL", "nan", ["run"],
     "jobpool: error: JOBPOOL_POLL_INTERVAL must be from 0.01 to 3600 seconds"),
    ("JOBPOOL_METRICS_PORT", "123456", ["run"],
     "jobpool: error: JOBPOOL_METRICS_PORT must be a whole number from 0 to 65535"),
    ("JOBPOOL_API_PORT", "-80", ["api"],
     "jobpool: error: JOBPOOL_API_PORT must be a whole number from 0 to 65535"),
    ("JOBPOOL_SCALE_INTERVAL", "0", ["operator"],
     "jobpool: error: JOBPOOL_SCALE_INTERVAL must be from 1 to 3600 seconds"),
    ("JOBPOOL_RATE_LIMITS", '{"providers": {"smtp": {"rps": 1}, "smtp": {"rps": 2}}}',
     ["run", "--kinds", "email_send"],
     "jobpool: error: JOBPOOL_RATE_LIMITS: the key 'smtp' is given twice in one object"),
])
def test_a_variable_out_of_range_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    variable: str, value: str, argv: list[str], message: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_bad_variable_is_refused_also_when_its_flag_is_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every variable is checked at start, as JOBPOOL_METRICS_PORT always was: a bad value in
    the environment is a configuration error whether or not one command overrides it."""
    monkeypatch.setenv("JOBPOOL_GRACE", "inf")
    assert main(["run", "--grace", "5"]) == 2
    assert "JOBPOOL_GRACE must be from 0.1 to 3600 seconds, got inf" in capsys.readouterr().err
