"""The extras: what `jobpool.extras` checks for is what pyproject.toml installs."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import pytest

from jobpool.extras import (
    ACCELERATORS,
    EXTRA_MODULES,
    MissingExtraError,
    missing_modules,
    require_extra,
)

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENT = re.compile(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?")


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _distributions(extra: str) -> set[str]:
    """The distributions `pip install 'jobpool[extra]'` asks for by name, self-references and
    the extras of a requirement (PyJWT[crypto]) expanded."""
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names: set[str] = set()
    for requirement in wanted["optional-dependencies"][extra]:
        match = REQUIREMENT.match(requirement)
        assert match is not None, requirement
        name, extras = _name(match[1]), [e.strip() for e in (match[2] or "").split(",") if e]
        if name == "jobpool":
            names |= set().union(*(_distributions(e) for e in extras))
            continue
        names.add(name)
        for line in requires(name) or []:
            marker = re.search(r"""extra\s*==\s*["']([^"']+)""", line)
            brought = REQUIREMENT.match(line)
            if marker and marker[1] in extras and brought:
                names.add(_name(brought[1]))
    return names


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_the_modules_checked_are_those_the_extra_installs(extra: str) -> None:
    owners = packages_distributions()
    checked = {_name(dist) for module in EXTRA_MODULES[extra] for dist in owners[module]}
    assert checked == _distributions(extra) - set(ACCELERATORS)


def test_an_accelerator_is_installed_by_the_worker_extra_and_needed_by_no_command() -> None:
    assert set(ACCELERATORS) <= _distributions("worker")
    assert not set(ACCELERATORS) & {m for modules in EXTRA_MODULES.values() for m in modules}


def test_all_is_every_extra_and_test_is_all() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    [everything] = extras["all"]
    match = REQUIREMENT.fullmatch(everything)
    assert match is not None and match[1] == "jobpool"
    assert {e.strip() for e in match[2].split(",")} == set(EXTRA_MODULES)
    assert "jobpool[all]" in extras["test"]


def test_a_missing_module_is_named_with_the_extra_and_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(EXTRA_MODULES, "worker", ("yaml", "no_such_module_here"))
    assert missing_modules("worker") == ("no_such_module_here",)
    with pytest.raises(MissingExtraError) as caught:
        require_extra("worker", "jobpool run")
    assert str(caught.value) == ("jobpool run needs the worker extra: pip install "
                                 "'jobpool[worker]' (missing: no_such_module_here)")
