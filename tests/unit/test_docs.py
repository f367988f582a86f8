"""The documentation can be walked: every relative link of README.md and docs/*.md reaches its
file and heading, every docs page is linked from the README, and CI runs the README's tests."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = (README, *sorted(DOCS.glob("*.md")))

LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """The ids GitHub gives the page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", re.sub(r"^```.*?^```", "",
                              page.read_text("utf-8"), flags=re.S | re.M), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(page.read_text("utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def broken(page: Path, target: str) -> str | None:
    """Why `target`, linked from `page`, leads nowhere (None: it resolves)."""
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
        return "no such file"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"no heading #{anchor} in {file.name}"
    return None


def test_every_relative_link_resolves() -> None:
    problems = [f"{page.relative_to(REPO)}: ({target}) {why}"
                for page in PAGES for target in relative_links(page)
                if (why := broken(page, target))]
    assert problems == []


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A heading: `x`\n\n[ok](#a-heading-x) [bad](#nowhere) "
                    "[gone](missing.md) `[code](nowhere.md)`\n")
    assert broken(page, "#a-heading-x") is None
    assert broken(page, "#nowhere") is not None
    assert broken(page, "missing.md") == "no such file"
    assert relative_links(page) == ["#a-heading-x", "#nowhere", "missing.md"]


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / target.partition("#")[0]).resolve() for target in relative_links(README)}
    pages = set(DOCS.glob("*.md"))
    assert sorted(str(page.relative_to(REPO)) for page in pages - linked) == []


def test_ci_runs_the_readme_test_commands() -> None:
    """`.ci/run` installs and tests as the README's "Tests" tells a contributor to."""
    section = README.read_text("utf-8").split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```$", section, flags=re.S | re.M)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block[1].splitlines()]
    assert commands == ["pip install -e '.[test]'", "pytest"]
    ci = (REPO / ".ci" / "run").read_text("utf-8").splitlines()
    assert "pip install -q -e '.[test]'" in ci
    assert [line for line in ci if line.split(" ")[0] == "pytest"] == [
        "pytest --ignore=tests/controlplane"]
