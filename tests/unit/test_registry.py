import logging
import re
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import msgspec
import pytest

import jobpool
from jobpool.core.kinds import BUILTIN_KINDS, HEAVY_KINDS, KindDefaults, check_kind_name
from jobpool.job import Job
from jobpool.registry import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    Registry,
    builtin_kinds,
    load_kind_modules,
)
from jobpool.settings import MIN_LEASE_TTL
from jobpool.worker.config import WorkerConfig, claim_lease, resolve_kinds


def test_decorator_registers_with_overrides() -> None:
    @jobpool.kind("unit_kind", max_attempts=7, timeout=5, backoff_base=2, backoff_max=8)
    async def handler(job, tx):  # type: ignore[no-untyped-def]
        return None

    spec = REGISTRY.get("unit_kind")
    assert spec.handler is handler
    assert spec.defaults.max_attempts == 7
    assert spec.defaults.timeout == 5
    assert (spec.defaults.backoff.base, spec.defaults.backoff.max_delay) == (2, 8)
    assert spec.defaults.priority == 100


@pytest.mark.parametrize("kind", sorted(HEAVY_KINDS))
def test_heavy_kinds_are_low_priority_long_and_few_attempts(kind: str) -> None:
    defaults = {spec.name: spec.defaults for spec in builtin_kinds()}[kind]
    assert defaults.priority == 200
    assert defaults.max_attempts == 3
    assert defaults.stale_ttl >= 3600


def test_the_table_of_built_in_names_is_the_declared_kinds() -> None:
    """core.kinds.BUILTIN_KINDS (for the pool spec) names exactly the kinds jobpool declares."""
    points = distribution("jobpool").entry_points.select(group=ENTRY_POINT_GROUP)
    assert {point.name for point in points} == BUILTIN_KINDS
    assert all(point.value.startswith("jobpool.") for point in points)
    assert HEAVY_KINDS <= BUILTIN_KINDS


def test_every_built_in_kind_declares_each_of_its_defaults() -> None:
    """Defaults are declared once, on the kind's decorator: none falls back silently."""
    points = distribution("jobpool").entry_points.select(group=ENTRY_POINT_GROUP)
    modules = {point.name: point.value for point in points}
    package = Path(jobpool.__file__).parent
    options = ("priority", "max_attempts", "stale_ttl", "timeout", "backoff_base",
               "backoff_max", "backoff_jitter")
    for name in BUILTIN_KINDS:
        module = modules[name].removeprefix("jobpool.").replace(".", "/")
        text = (package / f"{module}.py").read_text()
        declaration = re.search(rf'@kind\("{name}",(.*?)\)\n', text, re.S)
        assert declaration is not None, name
        assert [o for o in options if f"{o}=" not in declaration[1]] == [], name


KINDS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-kinds.md"
UNITS = {"s": 1, "min": 60, "h": 3600}


def _seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


Row = tuple[int, int, float, float, float, float]


def _row(defaults: KindDefaults) -> Row:
    return (defaults.priority, defaults.max_attempts, defaults.stale_ttl, defaults.timeout,
            defaults.backoff.base, defaults.backoff.max_delay)


def _documented_kind_table() -> dict[str, Row]:
    text = KINDS_PAGE.read_text()
    table = text[text.index("| kind | priority | max attempts |"):].split("\n\n")[0]
    rows: dict[str, Row] = {}
    for line in table.splitlines()[2:]:
        cells = (cell.strip() for cell in line.strip("|").split("|"))
        kinds, priority, attempts, stale_ttl, timeout, backoff = cells
        base, cap = backoff.split(", ")
        for kind in kinds.split(", "):
            rows[kind] = (int(priority), int(attempts), _seconds(stale_ttl), _seconds(timeout),
                          _seconds(base), _seconds(cap))
    return rows


def test_the_documented_table_of_built_in_kinds_is_their_declarations() -> None:
    expected = {spec.name: _row(spec.defaults) for spec in builtin_kinds()}
    expected["any other kind"] = _row(KindDefaults())
    assert _documented_kind_table() == expected


def test_built_in_kinds_load_from_entry_points() -> None:
    names = load_kind_modules().names()
    assert {"email_send", "cleanup_jobs"} <= set(names)


@pytest.mark.parametrize("name", ["", "Email", "1kind", "x; drop table", "a" * 64])
def test_bad_kind_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="invalid job kind name"):
        check_kind_name(name)


def test_unknown_kind_lookup_names_it() -> None:
    with pytest.raises(jobpool.UnknownKindError, match="no_such_kind"):
        REGISTRY.get("no_such_kind")


def test_worker_kinds_resolution() -> None:
    registered = ("a", "b", "c")
    assert resolve_kinds(registered, None, ("b",)) == ("a", "c")
    assert resolve_kinds(registered, ("c",), ()) == ("c",)
    with pytest.raises(ValueError, match=r"unknown job kind.*zzz"):
        resolve_kinds(registered, ("zzz",), ())

def test_an_unknown_kind_to_exclude_is_warned_about_not_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    """A misspelt exclusion would serve the kind meant to be left out; but a pool's catch-all
    lane excludes every other lane's kinds, and one missing from its image must not stop it."""
    with caplog.at_level(logging.WARNING, logger="jobpool.worker"):
        assert resolve_kinds(("email_send", "reindex"), None, ("reindx",)) == (
            "email_send", "reindex")
    assert [r.getMessage() for r in caplog.records] == [
        "unknown job kind(s) to exclude reindx (did you mean 'reindex'?): registered kinds are "
        "email_send, reindex (load more with --import MODULE)"]


def test_worker_config_rejects_zero_slots() -> None:
    with pytest.raises(ValueError, match="slots"):
        WorkerConfig(slots=0)


def test_whole_numbers_are_accepted_for_durations() -> None:
    @jobpool.kind("unit_int_durations", stale_ttl=600, timeout=120, backoff_base=10)
    async def handler(job, tx):  # type: ignore[no-untyped-def]
        return None

    defaults = REGISTRY.get("unit_int_durations").defaults
    assert isinstance(defaults.stale_ttl, float) and defaults.stale_ttl == 600.0
    assert isinstance(defaults.timeout, float)
    assert isinstance(defaults.backoff.base, float)


@pytest.mark.parametrize(("lease_ttl", "stale_ttls", "lease"), [
    (30.0, [], 30.0),
    (30.0, [600.0, 5.0], 5.0),  # capped by the shortest stale TTL served
    (30.0, [0.05, 600.0], MIN_LEASE_TTL),  # never below what a renewal thread keeps up with
    (0.5, [0.001], 0.5),
])
def test_a_claims_lease_is_capped_by_the_stale_ttls_and_floored(
    lease_ttl: float, stale_ttls: list[float], lease: float
) -> None:
    assert claim_lease(lease_ttl, stale_ttls) == lease


def test_a_handler_must_be_async() -> None:
    def not_async(job, tx):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(TypeError, match="must be an `async def` function"):
        jobpool.kind("unit_sync_handler")(not_async)
    with pytest.raises(jobpool.UnknownKindError):
        REGISTRY.get("unit_sync_handler")


@pytest.mark.parametrize(("option", "value", "problem"), [
    ("max_attempts", 2**40, "max_attempts must be a whole number from 1 to 2147483647, got "
                            "1099511627776"),
    ("max_attempts", True, "max_attempts must be a whole number from 1 to 2147483647, got True"),
    ("priority", 1.5, "priority must be a whole number from -32768 to 32767, got 1.5"),
    ("stale_ttl", float("inf"), "stale_ttl must be from 0.001 to 3.1536e+08 seconds, got inf"),
    ("stale_ttl", 1e-300, "stale_ttl must be from 0.001 to 3.1536e+08 seconds, got 1e-300"),
    ("timeout", float("nan"), "timeout must be from 0.001 to 3.1536e+08 seconds, got nan"),
    ("backoff_base", -1, "backoff base must be a finite number >= 0, got -1.0"),
    ("backoff_max", 1, "backoff max_delay must be finite and >= base (30.0), got 1.0"),
    ("backoff_jitter", 2, "backoff jitter must be between 0 and 1, got 2.0"),
    ("timeout", "10", "timeout must be a number, got '10' (str)"),  # float() would take it
    ("stale_ttl", True, "stale_ttl must be a number, got True (bool)"),
    ("backoff_base", "x", "backoff base must be a number, got 'x' (str)"),
])
def test_kind_defaults_the_database_cannot_hold_are_refused_naming_kind_and_option(
    option: str, value: object, problem: str
) -> None:
    """Registered at worker start, they would fail it with a bare "integer out of range"
    or a check violation naming neither; 1.5 would silently become 1."""
    with pytest.raises(ValueError) as refused:
        jobpool.kind("test_bounds", **{option: value})  # type: ignore[arg-type]
    assert str(refused.value) == f"job kind 'test_bounds': {problem}"


def test_a_kind_module_that_exits_while_imported_is_an_import_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sys.exit(0)` at a module's top level ended `jobpool run` quietly with status 0."""
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="cannot import kind module 'exits_at_import': "
                                          "SystemExit: 0"):
        load_kind_modules(["exits_at_import"])


def test_a_second_handler_for_a_kinds_name_is_refused_naming_both() -> None:
    """A module of yours declaring `email_send` (or two modules one name) silently replaced
    the built-in handler and its defaults in the database."""
    registry = Registry()

    async def first(job: Job, tx: Any) -> None:
        """One handler."""

    async def second(job: Job, tx: Any) -> None:
        """Another one, of the same name."""

    registry.kind("k_shared")(first)
    registry.kind("k_shared", max_attempts=5)(first)  # its module imported again: replaced
    with pytest.raises(ValueError, match=r"job kind 'k_shared' is registered already, by "
                                         r".*\.first; .*\.second registers it again"):
        registry.kind("k_shared")(second)
    assert registry.get("k_shared").defaults.max_attempts == 5


def test_two_typed_payload_handlers_of_one_name_are_told_apart() -> None:
    """A payload model wraps the handler in a decoding function: without the handler's names
    on it, every typed handler looked like the same one, and replaced the other silently."""
    registry = Registry()

    class Invoice(msgspec.Struct):
        number: str

    async def render(job: Job, tx: Any) -> None:
        """One typed handler."""

    async def render_again(job: Job, tx: Any) -> None:
        """Another, of the same name."""

    registry.kind("k_typed", payload=Invoice)(render)
    with pytest.raises(ValueError, match=r"\.render; .*\.render_again registers it again"):
        registry.kind("k_typed", payload=Invoice)(render_again)
