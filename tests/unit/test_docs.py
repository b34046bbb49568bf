"""The user pages cannot rot silently: every relative link and ``#anchor`` in README.md and docs/*.md points at a
file of the repository and, for an anchor, at a heading of that file (GitHub's slugs)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

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


USER_PAGES = [*PAGES, ROOT / "data" / "README.md"]
# Phrases that narrate the code's history instead of describing it; each chosen so that a description does not
# use it ("before the dot product", "a round trip" and "round 1" of a measurement stay allowed).
NARRATION = [
    r"\bas it is\b",
    r"\bpreviously\b",
    r"\bearlier code\b",
    r"\bfirst-hour\b",
    r"\bthe code before\b",
    r"\bthe default before\b",
    r"\b(?:did|was|were|had) before\b",
    r"\bbefore (?:its one|there were|gptmini)\b",
    r"\bbefore the (?:recipe|thread policy|typed|fused|cap|change)\b",
    r"\b(?:first|second|third|fourth|fifth|this|last|next|reliability|review) round\b",
    r"\bno longer\b",
]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_user_page_narrates_history(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = [m.group(0) for pattern in NARRATION for m in re.finditer(pattern, text, re.I)]
    assert found == [], f"{page.relative_to(ROOT)} narrates history: {found}"


def test_the_narration_check_finds_what_it_looks_for() -> None:
    text = "the code as it is against the code before the typed run config, the fourth reliability round"
    assert {m.group(0) for p in NARRATION for m in re.finditer(p, text, re.I)} == {
        "as it is",
        "the code before",
        "before the typed",
        "reliability round",
    }
    fine = "the mask, before the dot product; the own-text round trip; round 1 (s); checked when it is parsed"
    assert [m.group(0) for p in NARRATION for m in re.finditer(p, fine, re.I)] == []


def test_the_training_pages_config_table_lists_every_option_of_each_group():
    """docs/training.md's table of groups: each row's groups (``a/``, ``b/``) with their options, one list per
    group separated by ``;``, exactly conf/'s files."""
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = page[page.index("## Configuration") :]
    conf = ROOT / "conf"
    groups = {p.name: {f.stem for f in p.glob("*.yaml")} for p in conf.iterdir() if p.is_dir()}
    groups["hardware"].add("auto")  # registered in code (gptmini/training/hardware.py), not a file
    seen = set()
    for names, cell in re.findall(r"^\| ((?:`\w+/`(?:, )?)+) \| ([^\n]+) \|$", section, re.M):
        named = re.findall(r"`(\w+)/`", names)
        parts = cell.split(";")
        assert len(parts) == len(named), (names, cell)
        for group, part in zip(named, parts, strict=True):
            # the options: code spans that are one word (links and other text left out)
            listed = set(re.findall(r"`(\w+)`", re.sub(r"\[[^\]]*\]\([^)]*\)", "", part)))
            assert listed == groups[group], (group, sorted(listed), sorted(groups[group]))
            seen.add(group)
    assert seen == set(groups), sorted(set(groups) - seen)


def test_the_data_readmes_settings_are_training_settings(compose_cfg):
    """`gptmini data` takes the training settings: each the data README names is a key of the composed config,
    and its tokenizer row names every tokenizer option."""
    page = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ((?:`[^`]+`(?:, )?)+) \| ", page, re.M)
    keys = {k.split("=")[0] for row in rows for k in re.findall(r"`([^`]+)`", row) for k in k.split()}
    assert {
        "data.source",
        "tokenizer",
        "tokenizer.vocab_size",
        "data.shard_tokens",
        "data.force_prepare",
    } <= keys
    cfg = compose_cfg([])
    missing = sorted(k for k in keys if "." in k and OmegaConf.select(cfg, k, default="absent") == "absent")
    assert not missing
    row = next(line for line in page.splitlines() if line.startswith("| `tokenizer=...`"))
    tokenizers = {f.stem for f in (ROOT / "conf" / "tokenizer").glob("*.yaml")}
    assert tokenizers <= set(re.findall(r"`(\w+)`", row)), row


def test_every_documented_gptmini_data_command_takes_overrides_only():
    pages = [*PAGES, ROOT / "data" / "README.md"]
    commands = [
        line.split("#")[0].split()
        for page in pages
        for line in re.findall(r"gptmini data( [^`\n]*)", page.read_text(encoding="utf-8"))
    ]
    assert len(commands) >= 5
    for args in commands:
        assert not [a for a in args if a.startswith("-")], args


def test_reliability_promises_the_exit_status_the_code_gives():
    """The page's promise (one line starting with `error:`, exit status N) is the code's: the training refusals,
    Hydra's restated errors and the command-line tools' (tests/integration/test_reliability.py runs them)."""
    from gptmini.training.run.override_errors import EXIT_USER_ERROR

    page = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    promise = re.search(r"one line starting with `error:`.*?exit status (\d+)", page, re.S)
    assert promise is not None
    assert EXIT_USER_ERROR == int(promise.group(1))
    assert "exit status 1" not in page


def _section(page: str, heading: str) -> str:
    start = page.index(f"\n{heading}\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end != -1 else len(page)]


def _seconds_in_bold(text: str) -> list[float]:
    return [float(s) for s in re.findall(r"\*\*([\d.]+) s", text)]


def test_the_readmes_costs_are_the_measured_figures_with_their_machine_and_load():
    """README's table of costs: each time names the machine and its load, and is the figure of the section it
    links to (minutes rounded; the busy machine's factor as that table's medians give it); the disk a run takes is
    the default's row of training.md's checkpoints table."""
    import statistics

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    costs = _section(readme, "## What it costs")
    rows = {cells[0]: cells[1:] for cells in (line.strip("|").split("|") for line in costs.splitlines()[4:7])}

    install_time, install_disk = rows[" `make install` "]
    install = _section(bench, "## Install")
    m = re.search(r"\| AMD EPYC \| 2 \| [^|]+ \| ([\d.]+) s \| ([\d.]+ GB) ", install)
    assert m and "shared" in install
    assert f"about {round(float(m.group(1)) / 60)} minutes on a shared 2-core AMD EPYC" in install_time
    assert m.group(2) in install_disk and "192 MB" in install and "192 MB" in install_disk

    train_time, train_disk = rows[" `make train` on a 2-core CPU (700 steps) "]
    default = _section(bench, "## The default run with the recipe")
    assert "Machine: 2-core AMD EPYC" in default and "the quiet machine" in default
    wall = next(_seconds_in_bold(line) for line in default.splitlines() if _seconds_in_bold(line))
    assert f"about {round(statistics.mean(wall) / 60)} minutes on a quiet 2-core AMD EPYC" in train_time
    busy = _section(bench, "## A busy machine")
    medians = {
        load: statistics.median(float(x) for x in cells[2:5])
        for cells in (line.strip("|").split("|") for line in busy.splitlines())
        if len(cells) > 5 and cells[0].strip() == "plain quick start"
        for load in [cells[1].strip()]
    }
    assert f"{medians['busy'] / medians['quiet']:.1f}× that" in train_time
    assert (
        "one busy single-threaded process per core" in busy
        and "another program busy on each core" in train_time
    )

    training = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    total, last, best = re.search(
        r"^\| `default` \|.*\| 2 files, about (\d+) MB \((\d+) \+ (\d+)\) \|$", training, re.M
    ).groups()
    assert int(total) == int(last) + int(best)
    assert f"about {total} MB a run" in train_disk and f"`last.ckpt` {last}, `best.ckpt` {best}" in train_disk


def test_the_quick_start_lines_name_tinyshakespeares_source_and_compose(compose_cfg):
    """README's quick start as typed: each `gptmini train` line composes, with char-rnn's tinyshakespeare as its
    URL source (nothing is fetched here) and the character tokenizer."""
    import shlex

    quick = _section((ROOT / "README.md").read_text(encoding="utf-8"), "## Quick start on tinyshakespeare")
    lines = [line for line in quick.splitlines() if line.startswith("gptmini train ")]
    assert len(lines) == 3
    for line in lines:
        cfg = compose_cfg(shlex.split(line, comments=True)[2:])
        assert cfg.data.source == (
            "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
        )
        assert cfg.tokenizer.name == "char" and cfg.data.data_dir.endswith("_char")
