"""The user pages cannot rot silently: every relative link and ``#anchor`` in README.md and docs/*.md points at a
file of the repository and, for an anchor, at a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target) and ![alt](target), not inside code; a target may carry a "title"
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than '-' and '_' removed,
    each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of ``page``: one per heading, a repeated slug numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... not checked (offline)
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            bad.append(
                f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
            )
        elif ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch) -> None:
    """The checker itself, on a small page: GitHub's slugs (punctuation, code, a repeated heading) are found,
    a missing file and a missing anchor are reported."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text(
        "# Other\n\n## Speedrun against nanoGPT's quick start\n\n## Use\n\n## Use\n"
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## The `gptmini` command, in 5 minutes!\n\n"
        "[a](other.md#speedrun-against-nanogpts-quick-start) [b](other.md#use-1) "
        "[c](#the-gptmini-command-in-5-minutes) ![pic](other.md) [web](https://example.com/x)\n"
        "`[not a link](nowhere.md)`\n\n```\n[not a link either](nowhere.md)\n```\n"
        "[d](missing.md) [e](other.md#use-2) [f](#nope)\n"
    )
    assert anchors(tmp_path / "other.md") == {
        "other",
        "speedrun-against-nanogpts-quick-start",
        "use",
        "use-1",
    }
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#use-2", "#nope"]


def test_the_configuration_page_names_every_group_and_option():
    """docs/configuration.md's table of groups is conf/'s folders, each with every option it holds."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", page, re.M))
    conf = ROOT / "conf"
    groups = {p.name: {f.stem for f in p.glob("*.yaml")} for p in conf.iterdir() if p.is_dir()}
    groups["hardware"].add("auto")  # registered in code (gptmini/training/hardware.py), not a file
    assert set(rows) == set(groups)
    for group, options in groups.items():
        assert set(re.findall(r"`(\w+)`", rows[group])) == options, group
