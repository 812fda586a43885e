"""Every relative link in the project's Markdown pages resolves.

README.md, ARCHITECTURE.md, docs/*.md and notebooks/README.md link to each other, to notebooks,
figures and source files: a link (or image) whose target does not exist fails, and so does a
`#anchor` into a Markdown page that has no heading with that anchor (GitHub's rule: lower case,
punctuation dropped, spaces to hyphens, -1, -2, ... for repeats).  Links inside code are not links.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "notebooks" / "README.md",
                *(ROOT / "docs").glob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", flags=re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", flags=re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", flags=re.M)


def _prose(text: str) -> str:
    """The page without its fenced code blocks and inline code."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`."""
    seen: dict[str, int] = {}
    found = set()
    for _level, title in HEADING.findall(FENCE.sub("", page.read_text())):
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link in a heading: its text
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    links = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto:, ...
            continue
        links.append(target)
    return links


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {os.path.relpath(resolved, page.parent)}")
    return broken


def test_the_checked_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "ARCHITECTURE.md", "notebooks/README.md", "docs/SERVING.md",
            "docs/BENCHMARKS.md", "docs/CONTRIBUTING.md"} <= names
    assert all(p.exists() for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_checker_sees_broken_links(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: yes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[ok](other.md) [ok](other.md#a-code-heading-yes) [ok](#title) ![img](other.md)\n"
        "[gone](missing.md) ![gone](figures/missing.png) [bad anchor](other.md#nothing) [bad](#nope)\n"
        "`[in code](missing-too.md)` [web](https://example.com/x.md)\n\n```\n[in a block](missing-3.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "figures/missing.png: no such file",
        "other.md#nothing: no heading with that anchor in other.md",
        "#nope: no heading with that anchor in page.md",
    ]
