"""Every ```python snippet of README.md and docs/*.md runs as written, each in a fresh interpreter in an empty
folder (what it writes, e.g. ``data/``, stays there). A snippet that cannot run here (it needs a trained
checkpoint, a GPU or files from the internet) says so in the page, on the line before it:

    <!-- snippet: skip (needs a CUDA GPU) -->

and is skipped with that reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPET = re.compile(r"(?:<!-- snippet: skip \((?P<reason>[^)]*)\) -->\n)?```python\n(?P<code>.*?)```", re.S)


def snippets(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, skip reason or None) of each ```python block of a page."""
    return [
        (text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("reason"))
        for m in SNIPPET.finditer(text)
    ]


CASES = [
    pytest.param(
        code,
        reason,
        id=f"{page.relative_to(ROOT)}:{line}",
        marks=[pytest.mark.skip(reason=reason)] if reason else [],
    )
    for page in PAGES
    for line, code, reason in snippets(page.read_text(encoding="utf-8"))
]


def test_the_pages_hold_snippets_to_run():
    assert any(reason is None for _, reason in (c.values for c in CASES))


def test_a_skip_marker_names_its_reason():
    page = "text\n<!-- snippet: skip (needs a CUDA GPU) -->\n```python\nimport torch\n```\n\n```python\nx = 1\n```\n"
    assert snippets(page) == [(4, "import torch\n", "needs a CUDA GPU"), (8, "x = 1\n", None)]


@pytest.mark.parametrize(("code", "reason"), CASES)
def test_every_python_snippet_of_the_docs_runs(code, reason, tmp_path, cli_env):
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
