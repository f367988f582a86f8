"""Every exception jobpool defines derives from JobpoolError, and the public ones are exported."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import jobpool
from jobpool import errors
from jobpool.errors import JobpoolError

ALLOWED: dict[str, str] = {
    # "jobpool.module.Name": "why `except JobpoolError` must not catch it",
    # e.g. a private control-flow signal that has to pass through user code untouched.
    # None today: keep this list short, and give the reason next to each entry.
}

SKIPPED_MODULES = {"jobpool.__main__"}
"""Importing it runs the command line."""

VALUE_ERRORS = [
    "jobpool.kinds.entities.attributes.FieldValueError",
    "jobpool.kinds.email.mail.PayloadError",
    "jobpool.core.poolspec.PoolSpecError",
    "jobpool.kinds.webhooks.ssrf.InvalidWebhookURLError",
    "jobpool.kinds.webhooks.ssrf.TargetRefusedError",
    "jobpool.kinds.webhooks.signing.WebhookVerificationError",
    "jobpool.core.yamlfile.YamlLimitError",
]
"""Bad-value errors that callers also catch as ValueError (the command line, subscribe)."""

ERRORS_PAGE = Path(__file__).parents[2] / "docs" / "writing-kinds.md"


def defined_classes() -> dict[str, type]:
    """Every class defined at the top level of a jobpool module, by dotted name."""
    found: dict[str, type] = {}
    for module_info in pkgutil.walk_packages(jobpool.__path__, "jobpool."):
        if module_info.name not in SKIPPED_MODULES:
            module = importlib.import_module(module_info.name)
            found.update({f"{module.__name__}.{name}": value
                          for name, value in vars(module).items()
                          if inspect.isclass(value) and value.__module__ == module.__name__})
    return found


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined at the top level of a jobpool module, by dotted name."""
    return {name: cls for name, cls in defined_classes().items() if issubclass(cls, BaseException)}


def public_errors() -> list[str]:
    """The exception classes `import jobpool` exports."""
    return sorted(name for name in jobpool.__all__
                  if inspect.isclass(getattr(jobpool, name))
                  and issubclass(getattr(jobpool, name), BaseException))


def test_the_walk_finds_the_package_exceptions() -> None:
    found = defined_exceptions()
    assert "jobpool.errors.PermanentError" in found
    assert "jobpool.worker.executor.ClaimLostError" in found
    assert "jobpool.k8s.client.ApiError" in found
    assert len(found) >= 30


def test_every_exception_derives_from_jobpool_error() -> None:
    strays = sorted(name for name, cls in defined_exceptions().items()
                    if not issubclass(cls, JobpoolError) and name not in ALLOWED)
    assert strays == [], "derive these from jobpool.errors.JobpoolError, or list them in ALLOWED"


def test_the_allow_list_holds_only_real_exceptions() -> None:
    found = defined_exceptions()
    for name in ALLOWED:
        assert name in found, f"{name} is no longer defined: remove it from ALLOWED"
        assert not issubclass(found[name], JobpoolError), f"{name} needs no entry in ALLOWED"


@pytest.mark.parametrize("name", VALUE_ERRORS)
def test_bad_value_errors_are_still_value_errors(name: str) -> None:
    cls = defined_exceptions()[name]
    assert issubclass(cls, JobpoolError)
    assert issubclass(cls, ValueError)


def test_every_error_of_jobpool_errors_is_exported() -> None:
    defined = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, JobpoolError)
               and value.__module__ == errors.__name__}
    assert sorted(defined - set(public_errors())) == []


def test_every_exported_error_is_listed_in_the_docs() -> None:
    section = ERRORS_PAGE.read_text().partition("\n## Errors\n")[2].partition("\n#")[0]
    assert [name for name in public_errors() if f"`{name}`" not in section] == []


def test_try_again_later_has_one_name_per_idea() -> None:
    """A handler asks with RetryAfter, the worker decides Retry; an outside service's answer
    that may pass (a webhook receiver's 503, clamd down) is Transient, never a third Retry."""
    classes = defined_classes()
    retries = sorted(name for name in classes if "retry" in name.rpartition(".")[2].lower())
    assert retries == ["jobpool.core.retry.Retry", "jobpool.errors.RetryAfter"]
    assert "jobpool.kinds.webhooks.signing.Transient" in classes
    assert "jobpool.kinds.attachments.clamd.Transient" in classes


KEEP_THEIR_NAMES: dict[str, str] = {
    # "jobpool.module.Name": why it is not named `...Error`
    "jobpool.errors.RetryAfter": "a request to retry later, not an error; public API",
    "jobpool.kinds.email.email_send.SmtpNotConfigured": "named in `last_error`, the docs",
    "jobpool.kinds.attachments.virus_scan.ScanFailed": "named in `last_error`, the docs",
    "jobpool.kinds.webhooks.outbox_dispatch.DeliveryFailed": "named in `last_error`, the docs",
    "jobpool.worker.completer.ResultRefused": "named in `last_error`, docs/writing-kinds.md",
    "jobpool.worker.executor.HandlerExit": "named in `last_error`, docs/writing-kinds.md",
}
"""Exceptions whose names stay: a name a user reads in a job's `last_error` changes only
together with the docs that list it."""


def test_error_classes_are_named_error() -> None:
    misnamed = sorted(name for name in defined_exceptions()
                      if not name.endswith("Error") and name not in KEEP_THEIR_NAMES)
    assert misnamed == []


def test_the_names_kept_are_still_defined() -> None:
    assert sorted(set(KEEP_THEIR_NAMES) - set(defined_exceptions())) == []
