"""``make help`` lists every target, in colour on a terminal only: piped, its output is plain text."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_prints_no_colour_codes_into_a_pipe() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "\033" not in out
    targets = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert {"install", "train", "test", "help"} <= set(targets)
