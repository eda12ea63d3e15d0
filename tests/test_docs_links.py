"""The README is a short door into docs/: its links and the docs' links must lead somewhere.

    every relative link in README.md and docs/**/*.md names a file or folder that exists,
        and its #fragment (if any) a heading of that page, by GitHub's anchor rules
    README.md stays under 300 lines
    every docs/**/*.md page is reachable from the README, directly or through other pages

Links inside fenced code blocks and inline code are not links (GitHub renders them as text);
web links (http, https, mailto) are not fetched.
"""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 ... suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(page: Path) -> list[str]:
    """The link targets written in a page's prose (images included)."""
    found = []
    for line in _prose_lines(page.read_text()):
        found += LINK.findall(INLINE_CODE.sub("", line))
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` whose file, or whose #fragment on that file, does not exist."""
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and unquote(fragment).lower() not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.name}")
    return broken


def reachable_pages(start: Path) -> set[Path]:
    """The Markdown pages one can reach from `start` by following relative links."""
    seen, queue = {start.resolve()}, deque([start.resolve()])
    while queue:
        page = queue.popleft()
        for target in links(page):
            path_part = target.partition("#")[0]
            if not path_part or re.match(r"^[a-z][a-z0-9+.-]*:", path_part):
                continue
            dest = (page.parent / unquote(path_part)).resolve()
            if dest.suffix == ".md" and dest.is_file() and dest not in seen:
                seen.add(dest)
                queue.append(dest)
    return seen


DOC_PAGES = sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("page", [README, *DOC_PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_readme_is_a_short_door() -> None:
    n = len(README.read_text().splitlines())
    assert n < MAX_README_LINES, f"README.md has {n} lines; move the detail to docs/"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    assert DOC_PAGES, "docs/ has no pages"
    unreachable = sorted(str(p.relative_to(ROOT)) for p in DOC_PAGES if p.resolve() not in reachable_pages(README))
    assert unreachable == []


@pytest.mark.parametrize(("heading", "slug"), [
    ("Faults, hostile input and load", "faults-hostile-input-and-load"),
    ("Quiet numbers (2026-12-03 21:02-21:26 UTC)", "quiet-numbers-2026-12-03-2102-2126-utc"),
    ("Another host's paths on this one", "another-hosts-paths-on-this-one"),
    ("On a shared 2-core box, pass --threads 1", "on-a-shared-2-core-box-pass---threads-1"),
    ("An AVX2-only host's paths (`PAGESERVE_CPU_ISA=avx2`), at e21d12c", "an-avx2-only-hosts-paths-pageserve_cpu_isaavx2-at-e21d12c"),
    ("**Bold** and [a link](x.md)", "bold-and-a-link"),
])
def test_anchors_follow_githubs_rules(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_broken_link_or_anchor_is_reported(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## Second part\n\n```\n# not a heading\n[x](missing.md)\n```\n")
    (tmp_path / "a.md").write_text(
        "[ok](b.md) [ok](b.md#second-part) [bad](c.md) [bad](b.md#not-a-heading) [web](https://e.x/y) "
        "`[code](nowhere.md)` [self](#top)\n\n# Top\n")
    assert [f.split(":")[0] for f in broken_links(tmp_path / "a.md")] == ["c.md", "b.md#not-a-heading"]
    assert broken_links(tmp_path / "b.md") == []  # the link inside the code block is not a link
    assert reachable_pages(tmp_path / "a.md") == {(tmp_path / "a.md").resolve(), (tmp_path / "b.md").resolve()}


def test_docs_named_in_command_help_exist() -> None:
    """A flag's help may point to a page (`docs/serving-models.md#lora-adapters`): the page and its heading exist."""
    from ops.settings_table import tables

    named = re.findall(r"\b(docs/[\w/.-]+\.md)(?:#([\w-]+))?", "\n".join(tables().values()))
    assert named, "no help names a docs page (the pattern broke?)"
    missing = [f"{path}#{fragment}" if fragment else path for path, fragment in named
               if not (ROOT / path).is_file() or (fragment and fragment not in anchors(ROOT / path))]
    assert missing == []
